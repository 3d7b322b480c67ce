"""Keys of tensors from outside a run carried to the next run only where proven still true.

A parameter no one wrote is read once per test, not once per run; any way its
bytes can change between runs makes the next run read it again: an in-place
write through an alias with its own version counter (``.data``), a storage
swapped in (``.data = other``), a write through NumPy. Without that proof a
stale key would make the next op that reads the tensor look nondeterministic.
"""

from __future__ import annotations

import pytest
from sessions import unchecked

_CASES = """
import itertools

import torch

ALIASED = torch.zeros(4)
LIN = torch.nn.Linear(4, 4)
SWAP = torch.nn.Linear(4, 4)
VIEWED = torch.nn.Linear(4, 4)
STILL = torch.nn.Linear(4, 4)
COUNT = itertools.count()
X = torch.ones(1, 4)


def test_data_alias_written_after_use():
    (ALIASED * 2).sum()
    ALIASED.data.add_(1.0)


def test_module_data_alias_written_after_use():
    LIN(X).sum()
    LIN.weight.data.add_(1.0)


def test_data_swapped_after_use():
    SWAP(X).sum()
    SWAP.weight.data = torch.full_like(SWAP.weight, float(next(COUNT)))


def test_numpy_view_written_after_use():
    VIEWED(X).sum()
    VIEWED.weight.detach().numpy()[:] += 1.0


def test_unchanged_parameters_are_checked():
    STILL(X).sum()
    STILL(X * 2).sum()
"""


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_changed_outside_tensor_is_read_again(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No stale key is blamed: each changed tensor makes its test "not checked", by content."""
    pytest.importorskip("numpy")
    planted_conftest.makepyfile(test_carry=_CASES)
    result, out, reasons = unchecked(planted_conftest, recorder, monkeypatch)
    result.assert_outcomes(passed=5)
    assert "nondeterministic op" not in out, out
    for name in (
        "test_data_alias_written_after_use",
        "test_module_data_alias_written_after_use",
        "test_data_swapped_after_use",
    ):
        assert "a tensor kept between runs" in reasons.get(name, ""), (name, out)
    assert "(NumPy, DLPack or another process?)" in reasons.get(
        "test_numpy_view_written_after_use", ""
    ), out
    assert "test_unchanged_parameters_are_checked" not in reasons, out


def test_an_unchanged_parameter_is_digested_once() -> None:
    """The Python recorder reuses the previous run's key of an unchanged parameter."""
    torch = pytest.importorskip("torch")
    from pytest_backends.determinism.record_python import PythonRecorder

    lin = torch.nn.Linear(4, 4)
    x = torch.ones(1, 4)
    keys = []
    previous = None
    for _ in range(3):
        recorder = PythonRecorder(previous)
        with recorder:
            lin(x).sum()
        keys.append(recorder.finish().calls[0].inputs[0])
        previous = recorder
    assert keys[0] is keys[1] is keys[2]
    # An in-place write through ``.data`` (its own version counter) ends the reuse.
    recorder = PythonRecorder(previous)
    with recorder:
        lin.weight.data.mul_(2)
        lin(x).sum()
    assert recorder.finish().calls[-2].inputs[0] is not keys[0]
