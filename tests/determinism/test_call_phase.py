"""Every determinism run starts where run 0's body started, whatever other plugins' call hooks do.

Run 0 runs inside pytest's call phase, after every plain ``pytest_runtest_call``
implementation (pytest-randomly's reseeding of ``random`` and NumPy among them);
the later runs repeat those implementations, so the body sees the same state.
Without that, a body drawing from a generator another plugin reseeds is "not
checked" (its inputs differ between runs), or fails under ``-repeatable``.
"""

from __future__ import annotations

import json

import pytest
from sessions import checked_session

RECORDERS = ["native", "python"]

BODY = """
import random

import numpy as np
import torch


def test_draws():
    seen = (random.random(), float(np.random.rand()))
    with open("seen.txt", "a") as f:
        f.write(repr(seen) + "\\n")
    assert torch.tensor(seen).mul(2).sum() > 0
"""

RESEED = """
import random

import numpy as np


def pytest_runtest_call(item):
    random.seed(1234)
    np.random.seed(1234)
"""


def _run(
    pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[pytest.RunResult, dict[str, object], list[str]]:
    """Three checked runs of the body; the census and the values each run drew."""
    result, _, _, _ = checked_session(
        pytester, recorder, monkeypatch, "--backends-determinism-repeatable", *args
    )
    census = json.loads((pytester.path / f"{recorder}.json").read_text(encoding="utf-8"))
    seen = (pytester.path / "seen.txt").read_text(encoding="utf-8").splitlines()
    return result, census, seen


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_conftest_call_hook_runs_before_every_run(
    pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(RESEED)
    pytester.makepyfile(test_draws=BODY)
    result, census, seen = _run(pytester, recorder, monkeypatch, "-p", "no:randomly")
    assert len(seen) == 3 and len(set(seen)) == 1, seen
    result.assert_outcomes(passed=1)
    assert not census["not_checked"], census["not_checked"]


@pytest.mark.parametrize("recorder", RECORDERS)
def test_pytest_randomly_reseeds_every_run(
    pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pytest_randomly")
    pytester.makepyfile(test_draws=BODY)
    result, census, seen = _run(pytester, recorder, monkeypatch, "--randomly-seed=7")
    assert len(seen) == 3 and len(set(seen)) == 1, seen
    result.assert_outcomes(passed=1)
    assert not census["not_checked"], census["not_checked"]
