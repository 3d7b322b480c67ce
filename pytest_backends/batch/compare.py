"""Comparing sub-batches' rows with the full batch's: the figures of each case and part."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_backends.batch.runs import (
    Case,
    Run,
    row_differences,
    rows_differ,
    rows_within,
    same_bits,
    take_rows,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "HELD_BYTES",
    "CaseResult",
    "compare",
    "compare_all",
    "compare_part",
    "nbytes",
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
    import math

    slots: list[list[CaseResult] | tuple[str, int]] = []
    groups: dict[tuple[str, int], list[tuple[Case, torch.Tensor]]] = {}
    for sub, case in runs:
        mismatch = structure_mismatch(full, sub)
        if mismatch is not None:
            slots.append(
                [
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
                ]
            )
            continue
        for label, t, d in sub.parts:
            ref = full.by_label.get(label)
            if ref is None:
                continue
            shape = list(ref.shape)
            shape[d] = case.size
            if list(t.shape) != shape or ref.dtype != t.dtype:
                raise AssertionError(
                    f"assert_batch_invariant: {label} of {case.label} has shape "
                    f"{list(t.shape)} ({t.dtype}), but the full batch's rows have "
                    f"{shape} ({ref.dtype})"
                )
            key = (label, d)
            slots.append(key)
            groups.setdefault(key, []).append((case, t))
    compared = {
        key: compare_part(full.by_label[key[0]], key, group, tol) for key, group in groups.items()
    }
    results: list[CaseResult] = []
    for slot in slots:
        if isinstance(slot, list):
            results.extend(slot)
        else:
            results.append(compared[slot].pop(0))
    return results


def compare_part(
    ref: torch.Tensor,
    key: tuple[str, int],
    group: list[tuple[Case, torch.Tensor]],
    tol: tuple[float, float] | str | None,
) -> list[CaseResult]:
    """One part of every sub-batch in ``group`` against the full batch's rows ``ref``."""
    import torch

    label, d = key
    rows = [r for case, _ in group for r in case.rows]
    if len(group) == 1:
        joined = group[0][1]
        ref_rows = take_rows(ref, d, rows)
    else:
        joined = torch.cat([t.detach() for _, t in group], d)
        index = torch.tensor(rows, dtype=torch.long, device=ref.device)
        ref_rows = ref.detach().index_select(d, index)
    within_ok = True if isinstance(tol, tuple) else None
    if same_bits(ref_rows, joined):
        return [
            CaseResult(case.label, case.size, case.rows, label, None, 0, 0.0, 0.0, within_ok)
            for case, _ in group
        ]
    differ = rows_differ(ref_rows, joined, d).cpu().tolist()
    # The figures of the differing rows only: identical rows add nothing to a maximum.
    bad_at = [k for k, x in enumerate(differ) if x]
    abs_rows: dict[int, float] = {}
    rel_rows: dict[int, float] = {}
    within_rows: dict[int, bool] = {}
    if bad_at:
        a, b = joined, ref_rows
        if len(bad_at) < len(differ):
            index = torch.tensor(bad_at, dtype=torch.long, device=ref.device)
            a, b = a.index_select(d, index), b.index_select(d, index)
        figures = row_differences(a, b, d)
        abs_rows, rel_rows = dict(zip(bad_at, figures[0])), dict(zip(bad_at, figures[1]))
        if isinstance(tol, tuple):
            within_rows = dict(zip(bad_at, rows_within(a, b, d, tol[0], tol[1])))
    results: list[CaseResult] = []
    at = 0
    for case, _ in group:
        span = range(at, at + case.size)
        at += case.size
        bad = [case.rows[j] for j, k in enumerate(span) if differ[k]]
        if not bad:
            results.append(
                CaseResult(case.label, case.size, case.rows, label, None, 0, 0.0, 0.0, within_ok)
            )
            continue
        within = None
        if isinstance(tol, tuple):
            within = all(within_rows.get(k, True) for k in span)
        results.append(
            CaseResult(
                case.label,
                case.size,
                case.rows,
                label,
                bad[0],
                len(bad),
                max(abs_rows.get(k, 0.0) for k in span),
                max(rel_rows.get(k, 0.0) for k in span),
                within,
            )
        )
    return results


# Sub-batch outputs held for one joined comparison at most (bytes); more are compared first.
HELD_BYTES = 64 * 2**20


def nbytes(run: Run) -> int:
    """The bytes of a run's compared tensors."""
    return sum(t.numel() * t.element_size() for _, t, _ in run.parts)
