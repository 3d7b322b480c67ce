"""Find the op that breaks batch invariance.

The full batch and one sub-batch are run once more under :class:`RowRecorder`,
which keeps a copy of every op's tensor inputs and outputs. The two op
sequences are then walked together. For each tensor the batch dimension is
read from the shapes: the one dimension whose size is ``N * k`` in the full
run and ``n * k`` in the sub-batch (``k > 1`` when the batch was flattened
with another dimension, batch-major or batch-minor: both are tried); a
tensor of the same shape in both runs is not batched. An op is blamed only
when every tensor input it received is proven equal (its rows, for a batched
input; its whole value otherwise) and an output row differs: its output rows
differ for identical input rows. An op
whose output is not batched although an input is (a reduction over the
batch, a weight gradient) cannot be compared row by row and is not blamed;
ops fed by it are not either. The op's source line and module path come
from the determinism check's locator
(:func:`pytest_backends.determinism.locate.locate`), which re-runs the
sub-batch once more.

Importing this module imports torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends import _tree
from pytest_backends.batch.runs import rows_differ
from pytest_backends.determinism.compare import Comparison, Divergence, merge_verdict
from pytest_backends.determinism.locate import Location, locate

if TYPE_CHECKING:
    from pytest_backends.batch.runs import Case, Plan

__all__ = ["Finding", "OpLog", "RowRecorder", "compare_ops", "find_op", "record"]

#: Verdicts per op, strongest first.
VERDICTS = ("batch_variant", "no_difference", "inconclusive")

# Ops whose output is uninitialised memory: not data, never compared.
_UNINITIALIZED = frozenset(
    {
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::empty_permuted",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)


@dataclass
class _Op:
    name: str
    device: str | None
    dtype: str | None
    inputs: list[torch.Tensor | _Ref]
    outputs: list[torch.Tensor | _Ref]


@dataclass
class OpLog:
    """The ops of one run, in order, with copies of their tensor inputs and outputs."""

    ops: list[_Op]


def _tensors(value: object) -> list[torch.Tensor]:
    return [x for x in _tree.iter_leaves(value) if isinstance(x, torch.Tensor)]


class _Ref:
    """A parameter (or a view of one) kept by reference with its version, not copied.

    Parameters are the same tensors in both runs and rarely written, so copying
    them for every op would cost most of the recording. If one is written
    later in the run, its version moves and it proves nothing either way.
    """

    __slots__ = ("tensor", "version")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.version = tensor._version


def _keep(t: torch.Tensor) -> torch.Tensor | _Ref:
    base = t._base if t._base is not None else t
    if isinstance(base, torch.nn.Parameter):
        return _Ref(t)
    return t.detach().clone()


def _resolve(value: torch.Tensor | _Ref) -> torch.Tensor | None:
    """The recorded value, or None when a kept reference was written since."""
    if isinstance(value, _Ref):
        return value.tensor if value.tensor._version == value.version else None
    return value


class RowRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every op with detached copies of its tensor inputs and outputs."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[_Op] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        ins = [_keep(t) for t in _tensors([list(args), kwargs])]
        out = func(*args, **kwargs)
        outs = [_keep(t) for t in _tensors(out)]
        first = _tensors([list(args), kwargs]) or _tensors(out)
        ref = first[0] if first else None
        self.ops.append(
            _Op(
                func.name().split(".", 1)[0],
                ref.device.type if ref is not None else None,
                str(ref.dtype).replace("torch.", "", 1) if ref is not None else None,
                ins,
                outs,
            )
        )
        return out


def record(plan: Plan, rows: Sequence[int] | None, grads: list[torch.Tensor] | None) -> OpLog:
    """The ops of one run of the plan (forward, and backward where ``grads`` are given)."""
    from pytest_backends.batch.runs import call

    plan = dataclasses.replace(plan, backward=grads is not None)
    recorder = RowRecorder()
    # The ops recorded before fn raised are still compared.
    with contextlib.suppress(Exception):
        call(plan, rows, grads, recorder)
    return OpLog(recorder.ops)


@dataclass(frozen=True)
class Finding:
    """What the op-by-op comparison found for one sub-batch.

    ``kind``: ``"op"`` (``op`` gave different output rows for identical input
    rows), ``"sequence"`` (the runs called different ops from ``op_index``
    on: control flow depends on the batch size) or ``"none"`` (no op could be
    blamed; ``reason`` says why).
    """

    kind: str
    case: str
    op: str | None = None
    device: str | None = None
    dtype: str | None = None
    op_index: int | None = None
    other_op: str | None = None
    location: Location | None = None
    reason: str = ""

    def describe(self) -> str:
        """A sentence for a failure message."""
        where = ", ".join(x for x in (self.device, self.dtype) if x)
        where = f" ({where})" if where else ""
        at = f" at {self.location.describe()}" if self.location is not None else ""
        if self.kind == "op":
            return (
                f"first batch-variant op: {self.op}{where}{at}: its output rows differ between "
                f"the full batch and {self.case} for identical input rows (op #{self.op_index} "
                "of the run)"
            )
        if self.kind == "sequence":
            return (
                f"the full batch and {self.case} ran different ops from op #{self.op_index} on "
                f"(full batch: {self.op}, sub-batch: {self.other_op}){at}: the code takes another "
                "path for another batch size"
            )
        return f"no op located: {self.reason}"


def _row_indices(rows: Sequence[int], n: int, k: int, device: torch.device) -> list[torch.Tensor]:
    """Where the sub-batch's elements sit along a batched dimension of the full run.

    With ``k > 1`` the batch was flattened with another dimension of size
    ``k``, either batch-major (``[N, k] -> N * k``) or batch-minor
    (``[k, N] -> k * N``); the shapes do not tell which, so both are tried.
    """
    base = torch.tensor(list(rows), dtype=torch.long, device=device)
    if k == 1:
        return [base]
    inner = torch.arange(k, device=device)
    return [
        (base[:, None] * k + inner).reshape(-1),
        (inner[:, None] * n + base).reshape(-1),
    ]


def _batch_dim(full: torch.Tensor, sub: torch.Tensor, n: int, m: int) -> tuple[str, int, int]:
    """``("whole", 0, 0)``, ``("batched", dim, k)`` or ``("unknown", 0, 0)``."""
    if full.dtype != sub.dtype or full.dim() != sub.dim():
        return ("unknown", 0, 0)
    differing = [d for d in range(full.dim()) if full.shape[d] != sub.shape[d]]
    if not differing:
        return ("whole", 0, 0) if m < n else ("unknown", 0, 0)
    if len(differing) == 1:
        d = differing[0]
        k, rest = divmod(full.shape[d], n)
        if rest == 0 and k > 0 and sub.shape[d] == m * k:
            return ("batched", d, k)
    return ("unknown", 0, 0)


def _same(
    full: torch.Tensor,
    sub: torch.Tensor,
    how: tuple[str, int, int],
    rows: Sequence[int],
    n: int,
) -> bool | None:
    """Whether the sub-batch's tensor equals its rows of the full run's; None: cannot tell.

    A flattened batch (``k > 1``) that matches neither layout cannot be told
    apart from a layout this comparison does not know, so it proves nothing
    either way.
    """
    kind, d, k = how
    if kind == "unknown":
        return None
    if kind == "whole":
        if full.shape != sub.shape:
            return False
        if (full.data_ptr(), full.stride()) == (sub.data_ptr(), sub.stride()):
            return True  # the same memory (a parameter in both runs)
        return not bool(rows_differ(full.unsqueeze(0), sub.unsqueeze(0), 0).any())
    for index in _row_indices(rows, n, k, full.device):
        if not bool(rows_differ(full.index_select(d, index), sub, d).any()):
            return True
    return False if k == 1 else None


def compare_ops(
    full: OpLog, sub: OpLog, n: int, rows: Sequence[int], case: str
) -> tuple[dict[tuple[str, str | None, str | None], str], Finding]:
    """Verdicts per ``(op, device, dtype)`` and the first finding, from two recorded runs."""
    m = len(rows)
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    finding: Finding | None = None
    if m == n:
        reason = f"{case} has the batch's size, so rows cannot be matched through the ops' shapes"
        for op in full.ops:
            merge_verdict(verdicts, (op.name, op.device, op.dtype), "inconclusive", VERDICTS)
        return verdicts, Finding("none", case, reason=reason)
    for i, (a, b) in enumerate(zip(full.ops, sub.ops)):
        key = (a.name, a.device, a.dtype)
        if a.name != b.name:
            if finding is None:
                finding = Finding("sequence", case, a.name, a.device, a.dtype, i, other_op=b.name)
            break
        if a.name in _UNINITIALIZED:
            continue  # not data: neither compared nor blamed
        inputs_equal = True
        batched_input = False
        for kept_x, kept_y in zip(a.inputs, b.inputs):
            x, y = _resolve(kept_x), _resolve(kept_y)
            if x is None or y is None:
                inputs_equal = False
                break
            how = _batch_dim(x, y, n, m)
            if how[0] == "batched":
                batched_input = True
            if _same(x, y, how, rows, n) is not True:
                inputs_equal = False
                break
        if len(a.inputs) != len(b.inputs):
            inputs_equal = False
        if not inputs_equal:
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            continue
        compared = differs = False
        for kept_x, kept_y in zip(a.outputs, b.outputs):
            x, y = _resolve(kept_x), _resolve(kept_y)
            if x is None or y is None:
                continue
            how = _batch_dim(x, y, n, m)
            if how[0] == "whole" and batched_input:
                continue  # a reduction over the batch: not comparable row by row
            same = _same(x, y, how, rows, n)
            if same is None:
                continue
            compared = True
            if not same:
                differs = True
        if differs:
            merge_verdict(verdicts, key, "batch_variant", VERDICTS)
            if finding is None:
                finding = Finding("op", case, a.name, a.device, a.dtype, i)
        else:
            merge_verdict(verdicts, key, "no_difference" if compared else "inconclusive", VERDICTS)
    else:
        if len(full.ops) != len(sub.ops) and finding is None:
            i = min(len(full.ops), len(sub.ops))
            longer = full.ops if len(full.ops) > i else sub.ops
            a_name = full.ops[i].name if len(full.ops) > i else "(end of run)"
            b_name = sub.ops[i].name if len(sub.ops) > i else "(end of run)"
            finding = Finding(
                "sequence", case, a_name, longer[i].device, longer[i].dtype, i, other_op=b_name
            )
    for op in full.ops:
        verdicts.setdefault((op.name, op.device, op.dtype), "inconclusive")
    if finding is None:
        finding = Finding(
            "none",
            case,
            reason=(
                "every op whose input rows were proven equal gave equal output rows; the "
                "difference comes from an op whose inputs could not be matched row by row "
                "(a reduction over the batch, or a tensor whose batch dimension the shapes do "
                "not show)"
            ),
        )
    return verdicts, finding


def with_location(finding: Finding, plan: Plan, rows: Sequence[int], grads: Any) -> Finding:
    """``finding`` with the source line of its op, found by running the sub-batch once more."""
    from pytest_backends.batch.runs import arguments, call

    if finding.op_index is None or finding.op is None:
        return finding
    name = finding.other_op if finding.kind == "sequence" else finding.op
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


def find_op(plan: Plan, case: Case, grads: list[torch.Tensor] | None) -> Finding:
    """Record the full batch and ``case``'s sub-batch op by op and locate the first variant op."""
    if case.size == plan.n:
        _, finding = compare_ops(OpLog([]), OpLog([]), plan.n, case.rows, case.label)
        return finding
    full = record(plan, None, grads)
    sub = record(plan, case.rows, grads)
    _, finding = compare_ops(full, sub, plan.n, case.rows, case.label)
    return with_location(finding, plan, case.rows, grads)
