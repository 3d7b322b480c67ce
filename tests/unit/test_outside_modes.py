"""Getters and setters that are torch ops are called past the modes a test left pushed.

The per-device cuFFT plan cache rows read and write through
``torch._cufft_get_plan_cache_max_size`` and its setter, which are ops: a
``TorchFunctionMode`` or ``TorchDispatchMode`` a test leaves on the stack
receives them. A bare ``TorchFunctionMode`` raises ``NotImplementedError``, and
on a GPU the guard's reading after such a test was an INTERNALERROR. The op
itself runs on this machine too (a CPU build raises its own error), so which
of the two answers is the proof that the call went past the modes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends.flags.row import outside_modes


class RefusingDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise NotImplementedError(f"the test's dispatch mode received {func}")


class RefusingFunction(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise NotImplementedError(f"the test's function mode received {func}")


def _answer(call: Any) -> str:
    try:
        return f"value {call()!r}"
    except NotImplementedError as exc:
        return f"mode: {exc}"
    except RuntimeError as exc:  # torch's own answer without a CUDA build
        return f"torch: {str(exc)[:40]}"


def _op() -> object:
    return torch._cufft_get_plan_cache_max_size(0)


@pytest.fixture(params=[TorchFunctionMode, RefusingFunction, RefusingDispatch])
def leaked_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    plain = _answer(_op)
    mode = request.param()
    with mode:
        assert _answer(_op).startswith("mode:")  # the trap works: a plain call reaches it
        yield plain


def test_the_op_goes_past_a_leaked_mode(leaked_mode: str) -> None:
    assert _answer(lambda: outside_modes(torch, _op)) == leaked_mode


def test_the_modes_are_back_after_the_call() -> None:
    with RefusingFunction():
        outside_modes(torch, lambda: None)
        assert _answer(_op).startswith("mode:")
        assert torch._C._is_torch_function_enabled()
    with RefusingDispatch():
        outside_modes(torch, lambda: None)
        assert _answer(_op).startswith("mode:")


def test_the_value_and_arguments_pass_through() -> None:
    assert outside_modes(torch, max, 3, 7) == 7
