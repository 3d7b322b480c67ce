"""The project's own checks inside a test that ``--backends-determinism`` runs again.

The harness compares the ops of every run of a test body. A check that the
body calls (``assert_batch_invariant``, ``assert_close``, ``flag_effect``,
``override_flags``) must make the same ops in every run, the first included:
a tensor it made once and cached for the process (a permutation, an index)
would be an op of the first run alone, and the test would be "not checked"
(or fail under ``--backends-determinism-repeatable``), its planted
nondeterministic op never blamed. The batch corpus (``tests/batch``) runs
inside a checked test too, so that a case the listed calls miss is found.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sessions import RECORDERS, session

BATCH_TESTS = Path(__file__).resolve().parent.parent / "batch"


def _repeatable(
    pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> pytest.RunResult:
    """Every test checked under ``recorder``, and failed where its runs differ at all."""
    return session(
        pytester,
        recorder,
        monkeypatch,
        "--backends-determinism-all",
        "--backends-determinism-repeatable",
    )


CHECKS = """
import torch
from pytest_backends import (
    assert_batch_invariant, assert_close, flag_effect, override_flags, snapshot_flags,
)
from conftest import noisy


def test_batch_check_then_a_nondeterministic_op():
    x = torch.randn(8, 6)
    assert_batch_invariant(lambda t: t.softmax(-1), x)
    assert torch.isfinite(noisy(x).sum())


def test_batch_check_twice_with_gradients():
    x = torch.randn(8, 6, requires_grad=True)
    assert_batch_invariant(lambda t: t.tanh(), x, permute=False)
    assert_batch_invariant(lambda t: t.tanh(), x)


def test_batch_check_channels_last_sizes():
    x = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)
    assert_batch_invariant(lambda t: t.relu().amax((1, 2, 3)), x, sizes=[1, 2])


def test_batch_check_dict_and_integer_outputs_in_report_mode():
    m = torch.nn.Linear(6, 3).eval()
    out = lambda t: {"y": m(t), "i": m(t).argmax(-1)}
    assert_batch_invariant(out, torch.randn(8, 6), tolerance="report")


def test_batch_check_per_sample_gradients():
    m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh())
    x = torch.randn(6, 6, requires_grad=True)
    assert_batch_invariant(m, x, tolerance="report", per_sample_grads=True)


def test_tolerance_and_flags():
    a = torch.randn(16, 16)
    assert_close(a @ a, a @ a)
    flag_effect(lambda: a @ a, "mkldnn.enabled", [True, False])
    with override_flags({"mkldnn.enabled": False}):
        torch.randn(4, 4).sum()
    snapshot_flags()
"""


@pytest.mark.parametrize("recorder", RECORDERS)
def test_the_checks_make_the_same_ops_in_every_run(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted_conftest.makepyfile(test_checks=CHECKS)
    result = _repeatable(planted_conftest, recorder, monkeypatch)
    out = result.stdout.str()
    assert "not reproducible" not in out, out
    assert "different op sequence" not in out, out
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*nondeterministic op pbtest::noisy (cpu, float32) at test_checks.py:*"
            "in test_batch_check_then_a_nondeterministic_op*",
            "6 test(s) checked, 0 not checked*",
        ]
    )


CORPUS = """
import torch
from hypothesis import HealthCheck, given, settings
from batch_oracle import cases

from pytest_backends import BatchInvarianceError, assert_batch_invariant


@settings(
    max_examples={examples},
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(cases())
def test_corpus(case):
    try:
        assert_batch_invariant(
            case.fn, *case.inputs, dim=case.dims, out_dim=case.out_dim, tolerance="report"
        )
    except ValueError:  # a batch the check refuses (one row): the same in every run
        pass
"""


@pytest.mark.parametrize("recorder", RECORDERS)
def test_the_batch_corpus_makes_the_same_ops_in_every_run(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(BATCH_TESTS))
    planted_conftest.makepyfile(test_corpus=CORPUS.format(examples=12))
    result = _repeatable(planted_conftest, recorder, monkeypatch)
    out = result.stdout.str()
    assert "different op sequence" not in out, out
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["1 test(s) checked, 0 not checked*"])
