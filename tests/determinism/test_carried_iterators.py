"""State kept between runs: named when the runs cannot reset it, restored when they can.

Each case is a real pytest session (``runpytest_subprocess``) under
``--backends-determinism``. An iterator kept as a fixture value gives each run
the next items; a module global the runs rebind and a fixture list each run
appends to start each run from what the previous one left: the test is "not
checked", the reason names that state, and no op is blamed. A
``torch.Generator`` held in a fixture object's or a module global's attributes
is restored before every run, so the test gets a real verdict: passed for
deterministic kernels, failed for a nondeterministic one.
"""

from __future__ import annotations

import pytest
from sessions import RECORDERS, session, unchecked

_CARRIED = """
import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

SEED = 0
STEP = 0


@pytest.fixture(scope="module")
def batches():
    return iter(DataLoader(TensorDataset(torch.arange(400.0).reshape(100, 4)), batch_size=4))


@pytest.fixture(scope="module")
def made():
    return (torch.full((4,), float(i)) for i in range(100))


@pytest.fixture(scope="module")
def cycled():
    return itertools.cycle([torch.full((4,), float(i)) for i in range(7)])


@pytest.fixture(scope="module")
def seen():
    return []


def test_dataloader_iterator(batches):
    (b,) = next(batches)
    assert (b * 2).shape == (4, 4)


def test_generator_expression(made):
    assert (next(made) * 2).shape == (4,)


def test_cycle(cycled):
    assert (next(cycled) * 2).shape == (4,)


def test_appended_list(seen):
    seen.append(torch.ones(2))
    assert torch.stack(seen).sum() > 0


def test_seed_counter():
    global SEED
    SEED += 1
    torch.manual_seed(SEED)
    assert (torch.randn(4) * 2).shape == (4,)


def advance():
    global STEP
    STEP += 1


def test_global_step():
    torch.manual_seed(STEP)
    advance()
    assert (torch.randn(4) * 2).shape == (4,)
"""


@pytest.mark.parametrize("recorder", RECORDERS)
def test_state_carried_between_runs_is_named(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iterators, rebound globals and a growing list: "not checked", named, never blamed."""
    planted_conftest.makepyfile(test_carried=_CARRIED)
    result, out, reasons = unchecked(planted_conftest, recorder, monkeypatch)
    result.assert_outcomes(passed=6)
    assert "nondeterministic op" not in out, out
    assert len(reasons) == 6, out
    for name, fixture in (
        ("test_dataloader_iterator", "batches"),
        ("test_generator_expression", "made"),
        ("test_cycle", "cycled"),
    ):
        assert f"fixture '{fixture}': " in reasons[name], (name, out)
        assert "that each run advances" in reasons[name], (name, out)
    assert "fixture 'seen': a list whose size changed" in reasons["test_appended_list"], out
    assert "module global 'SEED': rebound during the runs" in reasons["test_seed_counter"], out
    assert "module global 'STEP': rebound during the runs" in reasons["test_global_step"], out
    for name, reason in reasons.items():
        assert "other threads" not in reason, (name, reason)


_HELD = """
import dataclasses

import pytest
import torch


@dataclasses.dataclass
class Holder:
    gen: torch.Generator


class Model:
    def __init__(self):
        self.gen = torch.Generator().manual_seed(5)


MODEL = Model()


@pytest.fixture
def holder():
    return Holder(torch.Generator().manual_seed(3))


def test_fixture_object_generator(holder):
    assert (torch.randn(8, generator=holder.gen) * 2).shape == (8,)


def test_module_object_generator():
    assert (torch.randn(8, generator=MODEL.gen) * 2).shape == (8,)


def test_planted_with_held_generator(holder):
    x = torch.randn(8, generator=holder.gen)
    assert torch.ops.pbtest.noisy(x).shape == (8,)
"""


@pytest.mark.parametrize("recorder", RECORDERS)
def test_generators_held_in_objects_are_restored(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``holder.gen`` and ``MODEL.gen`` are restored: a real verdict, the planted op caught."""
    planted_conftest.makepyfile(test_held=_HELD)
    result = session(planted_conftest, recorder, monkeypatch, "--backends-determinism-all", "-rA")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*3 test(s) checked, 0 not checked*",
            "FAILED test_held.py::test_planted_with_held_generator*",
        ]
    )
    out = result.stdout.str()
    assert "nondeterministic op pbtest::noisy" in out, out
    assert "nondeterministic op aten::randn" not in out, out
