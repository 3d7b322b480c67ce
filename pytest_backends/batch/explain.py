"""The finding a failed batch-invariance check reports, placed at its source line.

:func:`find_op` records the full batch and a sub-batch op by op
(:mod:`pytest_backends.batch.locate`) and compares them; :func:`with_location`
adds the source line and module of the finding's op, found by running the
sub-batch once more under the determinism check's locator.

Importing this module imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_backends.batch.finding import Finding
from pytest_backends.batch.locate import OpLog, compare_ops, record
from pytest_backends.determinism.compare import Comparison, Divergence
from pytest_backends.determinism.locate import locate

if TYPE_CHECKING:
    import torch

    from pytest_backends.batch.runs import Case, Plan

__all__ = ["find_op", "finding_of", "with_location"]

#: Finding kinds whose op is the sub-batch's side of two different op sequences.
_OTHER_SIDE = ("sequence", "path")


def finding_of(findings: dict[tuple[str, str], Finding], case: str, part: str) -> Finding | None:
    """The finding of ``case`` that explains ``part`` (the whole run's where absent)."""
    return findings.get((case, part)) or findings.get((case, "*"))


def with_location(finding: Finding, plan: Plan, rows: Sequence[int], grads: Any) -> Finding:
    """``finding`` with the source line of its op, found by running the sub-batch once more."""
    from pytest_backends.batch.runs import arguments, call

    if finding.op_index is None or finding.op is None:
        return finding
    name = finding.other_op if finding.kind in _OTHER_SIDE else finding.op
    if name is None or name.startswith("("):
        return finding
    plan = dataclasses.replace(plan, backward=grads is not None)
    prepared = arguments(plan, rows, grads)
    divergence = Divergence("op", 1, finding.op_index, name, finding.device, finding.dtype)
    comparison = Comparison(2, [divergence], None, {})
    placed = locate(comparison, lambda: call(plan, rows, grads, prepared=prepared))
    location = placed.blamed[0].location if placed.blamed else None
    if location is None:
        return finding
    return dataclasses.replace(finding, location=location)


def find_op(
    plan: Plan, case: Case, grads: list[torch.Tensor | None] | None, part: str | None = None
) -> Finding:
    """Record the full batch and ``case``'s sub-batch op by op and locate what explains ``part``."""
    if case.size == plan.n:
        _, finding = compare_ops(OpLog([]), OpLog([]), plan.n, case.rows, case.label)
        return finding
    full = record(plan, None, grads)
    sub = record(plan, case.rows, grads)
    _, finding = compare_ops(full, sub, plan.n, case.rows, case.label, part)
    return with_location(finding, plan, case.rows, grads)
