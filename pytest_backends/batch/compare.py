"""Comparing sub-batches' rows with the full batch's: the figures of each case and part."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_backends.batch.rows import (
    compare_rows,
    differing_parts,
    row_index,
    rows_within,
    span,
)
from pytest_backends.batch.runs import Case, Run

if TYPE_CHECKING:
    import torch

__all__ = [
    "HELD_BYTES",
    "CaseResult",
    "compare",
    "compare_all",
    "compare_part",
    "identical_results",
    "structure_mismatch",
]


@dataclass(frozen=True)
class CaseResult:
    """One compared part (an output or an input's gradient) of one sub-batch.

    ``rows`` are the full-batch indices of the sub-batch's rows, in its order;
    ``first_row`` the first of them (full-batch index) whose values differ
    bitwise, None when all are identical; ``differing`` how many differ.
    ``within`` is whether every element is within the tolerance (None in
    bitwise mode).
    """

    case: str
    size: int
    rows: tuple[int, ...]
    part: str
    first_row: int | None
    differing: int
    max_abs: float
    max_rel: float
    within: bool | None = None

    @property
    def identical(self) -> bool:
        """Whether every row is bitwise identical to the full batch's."""
        return self.first_row is None


def structure_mismatch(full: Run, sub: Run) -> str | None:
    """How the sub-batch's outputs differ from the full batch's in structure, or None."""

    def show(sig: object) -> str:
        if sig is None:
            return "None"
        assert isinstance(sig, tuple)
        dtype, shape = str(sig[0]), tuple(sig[1])
        dims = ", ".join("batch" if s == -1 else str(s) for s in shape)
        return f"{dtype.replace('torch.', '')} [{dims}]"

    if full.structure == sub.structure:
        return None
    for path in [*full.structure, *(p for p in sub.structure if p not in full.structure)]:
        a, b = full.structure.get(path, "absent"), sub.structure.get(path, "absent")
        if a != b:
            shown_a = a if a == "absent" else show(a)
            shown_b = b if b == "absent" else show(b)
            return f"{path} is {shown_a} in the full batch but {shown_b} in the sub-batch"
    return None


def compare(
    full: Run, sub: Run, case: Case, tol: tuple[float, float] | str | None
) -> list[CaseResult]:
    """The results of one sub-batch's parts against the full batch's rows."""
    return compare_all(full, [(sub, case)], tol)


def compare_all(
    full: Run, runs: Sequence[tuple[Run, Case]], tol: tuple[float, float] | str | None
) -> list[CaseResult]:
    """The results of every sub-batch's parts, in order, from a few tensor ops per part.

    The sub-batches' tensors of one part are joined along the batch dimension
    and compared with the full batch's rows gathered in the same order: one
    bitwise comparison for all sub-batches, and the per-row figures only where
    a row differs. The figures of a sub-batch are those of its rows.
    """
    if full.single and runs:
        _, ref, d = full.parts[0]
        dtype = ref.dtype
        # One tensor output everywhere, of the full batch's dtype, with each sub-batch's rows:
        # the structures are equal where the joined rows have the full batch's shape.
        group = []
        for sub, case in runs:
            if not sub.single:  # (a single run's tensor has the sub-batch's rows)
                break
            t = sub.parts[0][1]
            if t.dtype != dtype:
                break
            group.append((case, t))
        else:
            try:
                return compare_part(ref, ("output", d), group, tol, dtypes_checked=True)
            except _Reshaped:
                pass  # another shape than the full batch's rows: the structures say where
    return _compare_parts(full, runs, tol)


class _Reshaped(Exception):
    """A sub-batch's part has another shape or dtype than the full batch's rows."""


def _compare_parts(
    full: Run, runs: Sequence[tuple[Run, Case]], tol: tuple[float, float] | str | None
) -> list[CaseResult]:
    import math

    slots: list[CaseResult | tuple[str, int]] = []
    groups: dict[tuple[str, int], list[tuple[Case, torch.Tensor]]] = {}
    by_label = full.by_label
    for sub, case in runs:
        if sub.structure != full.structure:
            mismatch = structure_mismatch(full, sub)
            if mismatch is not None:
                slots.append(
                    CaseResult(
                        case.label,
                        case.size,
                        case.rows,
                        f"output structure ({mismatch})",
                        case.rows[0],
                        case.size,
                        math.inf,
                        math.inf,
                        False if isinstance(tol, tuple) else None,
                    )
                )
                continue
        for label, t, d in sub.parts:
            if label not in by_label:
                continue
            key = (label, d)
            slots.append(key)
            group = groups.get(key)
            if group is None:
                groups[key] = [(case, t)]
            else:
                group.append((case, t))
    compared = {}
    for key, group in groups.items():
        try:
            compared[key] = iter(compare_part(by_label[key[0]], key, group, tol))
        except _Reshaped:
            _check_shapes(by_label[key[0]], key[0], key[1], group)
            raise AssertionError(
                f"assert_batch_invariant: the sub-batches' {key[0]} cannot be joined"
            ) from None
    return [slot if isinstance(slot, CaseResult) else next(compared[slot]) for slot in slots]


def _check_shapes(ref: torch.Tensor, label: str, d: int, group: Sequence[tuple[Case, Any]]) -> None:
    """Raise where a sub-batch's part has another dtype or shape than the full batch's rows."""
    for case, t in group:
        shape = list(ref.shape)
        shape[d] = case.size
        if list(t.shape) != shape or ref.dtype != t.dtype:
            raise AssertionError(
                f"assert_batch_invariant: {label} of {case.label} has shape "
                f"{list(t.shape)} ({t.dtype}), but the full batch's rows have "
                f"{shape} ({ref.dtype})"
            )


class _Joined:
    """The rows of a list of sub-batches joined: their full-batch indices, and what is the same."""

    def __init__(self, cases: tuple[Case, ...]) -> None:
        self.cases = cases  # held: the cache's key is their ids
        self.rows = [r for case in cases for r in case.rows]
        self.first = span(self.rows)
        # (case, first, end) of each sub-batch's rows in the joined rows
        self.spans: list[tuple[Case, int, int]] = []
        at = 0
        for case in cases:
            self.spans.append((case, at, at + len(case.rows)))
            at += len(case.rows)
        # The results of identical parts, per (part, within): immutable, so made once.
        self.same: dict[tuple[str, bool | None], list[CaseResult]] = {}

    def identical(self, label: str, within: bool | None, copy: bool = True) -> list[CaseResult]:
        """Every sub-batch's result for an identical part (``copy=False``: the cached list)."""
        made = self.same.get((label, within))
        if made is None:
            made = self.same[(label, within)] = [
                CaseResult(case.label, len(case.rows), case.rows, label, None, 0, 0.0, 0.0, within)
                for case in self.cases
            ]
        return list(made) if copy else made


# Joined rows per list of sub-batches (by the ids of its cases): a check of one shape joins the
# same ones every time. Plain Python only: a tensor made once here would be an op of the first
# check's run alone, where ``--backends-determinism`` runs a test again.
_JOINED: dict[tuple[int, ...], _Joined] = {}


def _joined(cases: tuple[Case, ...]) -> _Joined:
    key = tuple(map(id, cases))
    hit = _JOINED.get(key)
    if hit is None or any(a is not b for a, b in zip(hit.cases, cases)):
        if len(_JOINED) > 1024:
            _JOINED.clear()
        hit = _JOINED[key] = _Joined(cases)
    return hit


def identical_results(cases: Sequence[Case], label: str, within: bool | None) -> list[CaseResult]:
    """The results of ``cases`` whose part ``label`` is bitwise identical (a list of one's own)."""
    return _joined(tuple(cases)).identical(label, within)


def compare_part(
    ref: torch.Tensor,
    key: tuple[str, int],
    group: list[tuple[Case, torch.Tensor]],
    tol: tuple[float, float] | str | None,
    dtypes_checked: bool = False,
) -> list[CaseResult]:
    """One part of every sub-batch in ``group`` against the full batch's rows ``ref``.

    ``dtypes_checked``: the caller has seen that every part has the full batch's dtype.
    """
    import torch

    label, d = key
    within_ok = True if isinstance(tol, tuple) else None
    joined_rows = _joined(tuple(case for case, _ in group))
    if not dtypes_checked and not all(t.dtype == ref.dtype for _, t in group):
        raise _Reshaped
    differing = (
        differing_parts(ref, [(case.rows, case.first, t) for case, t in group]) if d == 0 else None
    )
    if differing is not None:
        # Every sub-batch's bytes compared in place: no tensor joined, no index made.
        same = joined_rows.identical(label, within_ok, copy=not differing)
        if not differing:
            return same
        results = list(same)
        for i in differing:
            case, t = group[i]
            first = case.first
            ref_rows = (
                ref[first : first + len(case.rows)]
                if first is not None
                else ref.index_select(0, row_index(case.rows, ref.device))
            )
            figures = _figures(ref_rows, t, 0, tol)
            if figures is not None:
                results[i] = _result(case, label, 0, len(case.rows), figures, tol)
        return results
    rows = joined_rows.rows
    if len(group) == 1:
        joined = group[0][1]
    else:
        try:
            joined = torch.cat([t for _, t in group], d)
        except RuntimeError:
            raise _Reshaped from None
    first = joined_rows.first
    if first is None:
        ref_rows = ref.index_select(d, row_index(rows, ref.device))
    else:
        ref_rows = ref.narrow(d, first, len(rows))
    if joined.shape != ref_rows.shape:
        raise _Reshaped
    figures = _figures(ref_rows, joined, d, tol)
    if figures is None:
        return joined_rows.identical(label, within_ok)
    same = joined_rows.identical(label, within_ok, copy=False)
    return [
        same[i] if not any(figures[0][lo:hi]) else _result(case, label, lo, hi, figures, tol)
        for i, (case, lo, hi) in enumerate(joined_rows.spans)
    ]


_Figures = tuple[list[bool], list[float], list[float], list[bool]]


def _figures(
    ref_rows: torch.Tensor, got: torch.Tensor, d: int, tol: tuple[float, float] | str | None
) -> _Figures | None:
    """Per row of ``got`` against ``ref_rows``: differs, max abs, max rel, within ``tol``.

    None when every row is bitwise identical.
    """
    compared = compare_rows(ref_rows, got, d)
    if compared is None:
        return None
    differ, abs_rows, rel_rows = compared
    within_rows = [True] * len(differ)
    if isinstance(tol, tuple):
        bad_at = [k for k, x in enumerate(differ) if x]
        a, b = got, ref_rows
        if len(bad_at) < len(differ):
            index = row_index(bad_at, ref_rows.device)
            a, b = a.index_select(d, index), b.index_select(d, index)
        for k, ok in zip(bad_at, rows_within(a, b, d, tol[0], tol[1])):
            within_rows[k] = ok
    return differ, abs_rows, rel_rows, within_rows


def _result(case: Case, label: str, lo: int, hi: int, figures: _Figures, tol: object) -> CaseResult:
    """The result of ``case``, whose rows are rows ``lo`` to ``hi`` of ``figures``."""
    differ, abs_rows, rel_rows, within_rows = figures
    bad = [r for r, x in zip(case.rows, differ[lo:hi]) if x]
    return CaseResult(
        case.label,
        hi - lo,
        case.rows,
        label,
        bad[0] if bad else None,
        len(bad),
        max(abs_rows[lo:hi]),
        max(rel_rows[lo:hi]),
        all(within_rows[lo:hi]) if isinstance(tol, tuple) else None,
    )


# Sub-batch outputs held for one joined comparison at most (bytes); more are compared first.
HELD_BYTES = 64 * 2**20
