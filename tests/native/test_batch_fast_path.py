"""The batch check's one-call path gives the general path's verdict and figures, case for case.

The common case (one float tensor out, forward only) compares every sub-batch
in one native call (``compare_cases``); the general path compares them
through :mod:`pytest_backends.batch.compare`. Both run here on the same
generated functions, whose sub-batch outputs differ from the full batch's
rows in chosen rows and elements (NaN, infinities, -0.0, nudges), and must
agree on every case's figures and on the failure message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from perturbed import perturbed

from pytest_backends import BatchInvarianceError, assert_batch_invariant
from pytest_backends.batch import fast
from pytest_backends.batch import rows as rows_mod

SPECIAL = [0.0, -0.0, 1.0, -1.5, 1e-30, 3e4, math.inf, -math.inf, math.nan]


def _table_fn(n: int, full: torch.Tensor, alt: torch.Tensor) -> Callable[[torch.Tensor], Any]:
    """Row ``r`` of the output is ``full[r]`` in the whole batch in order, else ``alt[r]``.

    The input's column 0 holds each row's index, so the function knows which
    rows it was given and in what order.
    """

    def fn(t: torch.Tensor) -> torch.Tensor:
        rows = t[:, 0].long()
        whole = t.shape[0] == n and bool((rows == torch.arange(n)).all())
        return (full if whole else alt)[rows].clone()

    return fn


@st.composite
def tables(draw: st.DrawFn) -> tuple[int, torch.Tensor, torch.Tensor, torch.dtype]:
    full, alt = perturbed(
        draw, rows=(2, 9), widths=(1, 4), specials=SPECIAL, marked=3, third="sign"
    )
    return full.shape[0], full, alt, full.dtype


def _outcome(fn: Callable[..., Any], x: torch.Tensor, **options: Any) -> tuple[Any, ...]:
    """The cases' figures (NaN made comparable) and the failure message, if any."""
    try:
        result = assert_batch_invariant(fn, x, backward=False, locate=False, **options)
    except BatchInvarianceError as exc:
        return ("failed", str(exc), _figures(exc.result.cases))
    return ("passed", _figures(result.cases))


def _figures(cases: list[Any]) -> list[tuple[Any, ...]]:
    def same(v: float) -> object:
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return [
        (
            *(c.case, c.size, c.rows, c.part, c.first_row, c.differing),
            *(same(c.max_abs), same(c.max_rel), c.within),
        )
        for c in cases
    ]


def _general(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "native_compare_cases", lambda: None)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(tables(), st.sampled_from([None, "report", (1e-3, 1e-3)]))
def test_the_one_call_path_agrees_with_the_general_path(
    native_module: ModuleType,
    table: tuple[int, torch.Tensor, torch.Tensor, torch.dtype],
    tolerance: object,
) -> None:
    n, full, alt, dtype = table
    x = torch.zeros(n, 3, dtype=dtype)
    x[:, 0] = torch.arange(n, dtype=dtype)
    fn = _table_fn(n, full, alt)
    options = {} if tolerance is None else {"tolerance": tolerance}
    quick = _outcome(fn, x, **options)
    with pytest.MonkeyPatch.context() as patch:
        _general(patch)
        general = _outcome(fn, x, **options)
    assert quick == general


def _counting(monkeypatch: pytest.MonkeyPatch, native_module: ModuleType) -> list[int]:
    calls: list[int] = []
    real = native_module.compare_cases

    def counted(ref: torch.Tensor, cases: list[Any]) -> Any:
        calls.append(len(cases))
        return real(ref, cases)

    monkeypatch.setattr(fast, "native_compare_cases", lambda: counted)
    return calls


def test_the_common_case_takes_one_native_call(
    native_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert rows_mod.native_compare_cases() is native_module.compare_cases
    calls = _counting(monkeypatch, native_module)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    with torch.no_grad():
        assert_batch_invariant(model, torch.randn(8, 16), tolerance="report")
    assert calls == [7]  # sizes 1 and 4 at three offsets, and the batch permuted
    # an input written in place and returned is compared as it was after its own run
    assert_batch_invariant(lambda t: t.mul_(2), torch.randn(8, 5), backward=False)
    assert calls == [7, 7]


@pytest.mark.parametrize(
    ("fn", "x", "why"),
    [
        (lambda t: {"out": t * 2}, torch.randn(6, 3), "a dict"),
        (lambda t: t.argmax(-1), torch.randn(6, 3), "an integer output"),
        (lambda t: t.bfloat16(), torch.randn(6, 3), "bfloat16"),
        (lambda t: (t * 2).t(), torch.randn(6, 3), "batched along dimension 1"),
    ],
)
def test_other_outputs_take_the_general_path(
    native_module: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    fn: Callable[..., Any],
    x: torch.Tensor,
    why: str,
) -> None:
    calls = _counting(monkeypatch, native_module)
    out_dim = 1 if "dimension 1" in why else 0
    assert_batch_invariant(fn, x, backward=False, out_dim=out_dim, tolerance="report")
    assert calls == [], why


def test_backward_and_sub_batch_structures_take_the_general_path(
    native_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting(monkeypatch, native_module)
    x = torch.randn(6, 4, requires_grad=True)
    assert_batch_invariant(lambda t: t.tanh(), x)  # input gradients compared: not the one call
    assert calls == []

    def shape_shifts(t: torch.Tensor) -> object:
        return t * 2 if t.shape[0] == 6 else {"out": t * 2}

    # the full batch's output fits the one call, a sub-batch's does not: the general path
    # runs the cases again and names the structure
    with pytest.raises(BatchInvarianceError, match="differ in structure"):
        assert_batch_invariant(shape_shifts, torch.randn(6, 4), backward=False)


def test_sub_batch_tensors_in_another_layout_are_compared_without_running_again(
    native_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Column-major sub-batch outputs: the native call declines, the general comparison
    takes the outputs already made, and ``fn`` runs once per case, never twice."""
    calls = _counting(monkeypatch, native_module)
    made: list[int] = []

    def column_major_below_the_batch(t: torch.Tensor) -> torch.Tensor:
        made.append(t.shape[0])
        y = t * 2
        return y if t.shape[0] == 8 else y.t().contiguous().t()

    result = assert_batch_invariant(column_major_below_the_batch, torch.randn(8, 5), backward=False)
    assert result.invariant and len(result.cases) == 7
    assert calls == [7] and len(made) == 8, made
