"""The batch check's common case: one tensor out, forward only, compared in one native call.

Where the full batch's output is one dense CPU tensor of a float dtype NumPy
reads (float16, 32 or 64) batched along dimension 0, no backward ran and no
op recording is asked for, the sub-batches' runs are restore, select and
call, and their outputs are compared with the full batch's rows in one call
of the native extension (``compare_cases`` in ``native/rows.cpp``). It gives
the figures :mod:`~pytest_backends.batch.compare` gives, op for op; the tests
hold the two equal. Sub-batch tensors the native call does not read (another
layout, dtype or shape) are compared the general way without running again;
anything else (no extension, a sub-batch output that is not a plain tensor,
outputs over the held bytes) is left to the general path: :func:`run_cases`
returns None.

Importing this module does not import torch; :func:`run_cases` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_backends.batch.compare import (
    HELD_BYTES,
    CaseResult,
    compare_all,
    identical_results,
)
from pytest_backends.batch.rows import native_compare_cases
from pytest_backends.batch.runs import Case, Plan, Run, finish_runs, note_failure, storage_of

if TYPE_CHECKING:
    import torch

__all__ = ["run_cases"]

_FLOATS: set[Any] = set()  # the dtypes the native comparison reads


def run_cases(
    plan: Plan,
    full: Run,
    cases: Sequence[Case],
    start: Any,
    tol: tuple[float, float] | str | None,
) -> list[CaseResult] | None:
    """Every case's results, from the runs of ``cases`` each begun from ``start``; or None.

    None where the common case does not hold (see the module): the caller
    runs the cases on the general path, which starts them from ``start``
    again.
    """
    import torch

    if not full.single:
        return None
    label, ref, d = full.parts[0]
    if d != 0 or plan.out_dim != 0 or type(ref) is not torch.Tensor:
        return None
    if not _FLOATS:
        _FLOATS.update({torch.float16, torch.float32, torch.float64})
    compare = native_compare_cases()
    n = plan.n
    if (
        compare is None
        or ref.dtype not in _FLOATS
        or ref.nbytes * sum(len(c.rows) for c in cases) > HELD_BYTES * n
    ):
        return None
    inputs = plan.batched()
    held, fn, tensor = inputs.held, plan.fn, torch.Tensor
    start.restore()
    selected = [inputs.select(case.rows, case.first) for case in cases]
    outs: list[tuple[int | None, tuple[int, ...], torch.Tensor]] = []
    for k, case in enumerate(cases):
        if k:
            start.restore()
        try:
            result = fn(*selected[k])
        except Exception as exc:
            note_failure(exc, case, n)
            raise
        selected[k] = []
        if type(result) is not tensor or result.is_nested or result.layout != torch.strided:
            return None
        if storage_of(result) in held:  # an input copy's memory: rewritten before a later run
            result = result.detach().clone()
        outs.append((case.first, case.rows, result))
    figures = compare(ref, outs)
    if figures is None:
        # Tensors of another layout, dtype or shape than the full batch's rows: compared the
        # general way, without running the cases again.
        runs = finish_runs([(case, t) for case, (_, _, t) in zip(cases, outs)], 0)
        return compare_all(full, runs, tol)
    within = True if isinstance(tol, tuple) else None
    if within and any(f is not None for f in figures):
        # Differing rows under a tolerance: the general comparison decides which are within.
        runs = [
            (Run([("output", t.detach(), 0)], single=True), c) for (_, _, t), c in zip(outs, cases)
        ]
        return compare_all(full, runs, tol)
    results = identical_results(cases, label, within)
    for i, f in enumerate(figures):
        if f is not None:
            case = cases[i]
            first, bad, max_abs, max_rel = f
            results[i] = CaseResult(
                case.label, len(case.rows), case.rows, label, first, bad, max_abs, max_rel
            )
    return results
