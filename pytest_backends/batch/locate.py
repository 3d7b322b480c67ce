"""Find the op that breaks batch invariance.

The full batch and one sub-batch are run once more under :class:`RowRecorder`,
which keeps a copy of every op's tensor inputs and outputs (a tensor that an
earlier op produced and nothing wrote since is kept once) and its other
arguments. The two op sequences are then walked together. For each tensor
the batch dimension is read from the shapes: the one dimension whose size is
``N * k`` in the full run and ``n * k`` in the sub-batch (``k > 1`` when the
batch was flattened with another dimension, batch-major or batch-minor: both
are tried); a tensor of the same shape in both runs is not batched.

An op gets a verdict only when it has a batched input (its *batch rows*):
an op without one (``torch.arange(t.shape[0])``, a weight transposed) can
make nothing differ between rows it did not receive, so it is never blamed
and never listed. An op is blamed only when every tensor input it received
is proven equal (its rows, for a batched input; its whole value otherwise),
its other arguments are equal (shape arguments excepted: they follow the
batch size) and an output row differs: its output rows differ for
identical input rows. An op with a batched input and an output that is not
batched (a reduction over the batch: BatchNorm's batch statistics, a mean
over dim 0) mixes rows by design: where that output differs and flows back
into rows, the finding says so (kind ``"mixed"``) instead of blaming a
later kernel. An op whose tensor inputs are equal but whose other argument
differs (``x / x.shape[0]``) is named too (kind ``"scalar"``), unblamed.
The op's source line and module path come from the determinism check's
locator (:func:`pytest_backends.determinism.locate.locate`), which re-runs
the sub-batch once more.

Importing this module imports torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends import _tree
from pytest_backends.batch.dependence import draws, reads_other_rows, row_indices, template
from pytest_backends.batch.finding import ACROSS, Finding
from pytest_backends.batch.rows import rows_differ
from pytest_backends.batch.sites import Site, call_site
from pytest_backends.determinism.compare import merge_verdict
from pytest_backends.determinism.keys import op_info
from pytest_backends.determinism.locate import run_uncounted
from pytest_backends.determinism.op_tables import UNINITIALIZED

if TYPE_CHECKING:
    from pytest_backends.batch.runs import Plan

__all__ = ["Finding", "OpLog", "RowRecorder", "compare_ops", "record"]

#: Verdicts per op, strongest first.
VERDICTS = ("batch_variant", "no_difference", "inconclusive")


@dataclass
class _Op:
    name: str
    device: str | None
    dtype: str | None
    inputs: list[torch.Tensor | _Ref]
    outputs: list[torch.Tensor | _Ref]
    #: Non-tensor arguments compared between runs: (name, value).
    scalars: tuple[tuple[str, object], ...] = ()
    #: Storage addresses of the tensor inputs and outputs (to follow data between ops).
    in_ptrs: tuple[int, ...] = ()
    out_ptrs: tuple[int, ...] = ()
    #: Not recorded (the recording reached its memory limit): proves nothing.
    dropped: bool = False
    #: The op and its arguments with the tensors taken out, to run it again on other rows.
    call: tuple[Any, object, dict[str, Any]] | None = None
    #: The call in the user's code the op ran under (:func:`call_site`).
    site: Site | None = None


@dataclass
class OpLog:
    """The ops of one run, in order, with copies of their tensor inputs and outputs.

    ``backward_at`` is the index of the first op of the backward pass (None:
    no backward); ``dropped_after`` the bytes kept when the recording stopped
    keeping copies (None: it never did); ``parts`` where each compared output
    and gradient of the run lies.
    """

    ops: list[_Op]
    backward_at: int | None = None
    dropped_after: int | None = None
    #: The storage address of each compared part of the run's result, by label.
    parts: dict[str, int] = dataclasses.field(default_factory=dict)


#: The most bytes of tensor copies one recorded run keeps; ops past it prove nothing.
RECORD_LIMIT_BYTES = 1 << 30


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
        self.version = _version(tensor)


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter; None for an inference tensor, which has none."""
    return None if t.is_inference() else t._version


def _resolve(value: torch.Tensor | _Ref) -> torch.Tensor | None:
    """The recorded value, or None when a kept reference was (or may have been) written since."""
    if isinstance(value, _Ref):
        version = value.version
        return value.tensor if version is not None and _version(value.tensor) == version else None
    return value


# Argument types whose values follow the batch size (shapes, sizes, indices, dims).
_SHAPE_TYPES = frozenset({"int", "List[int]", "Optional[int]", "Optional[List[int]]"})
_SCHEMAS: dict[Any, list[tuple[str, bool, bool]]] = {}


def _schema(func: Any) -> list[tuple[str, bool, bool]]:
    """(name, keyword-only, compared) per argument of ``func``'s schema, cached."""
    got = _SCHEMAS.get(func)
    if got is None:
        try:
            got = [
                (a.name, a.kwarg_only, str(a.type) not in _SHAPE_TYPES)
                for a in func._schema.arguments
            ]
        except AttributeError:
            got = []
        _SCHEMAS[func] = got
    return got


def _scalars(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    out = []
    positional = [a for a in _schema(func) if not a[1]]
    for (name, _, compared), value in zip(positional, args):
        if compared and not _tensors(value if isinstance(value, (list, tuple)) else [value]):
            out.append((name, value))
    wanted = {name for name, _, compared in _schema(func) if compared}
    for name, value in kwargs.items():
        if name in wanted and not isinstance(value, torch.Tensor):
            out.append((name, value))
    return tuple(out)


def _ptr(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        return 0


class RowRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every op with detached copies of its tensor inputs and outputs.

    An input that an earlier op output (the same tensor, not written since)
    reuses that copy. Past ``limit`` bytes of copies, ops are recorded
    without them (they prove nothing).
    """

    def __init__(self, limit: int = RECORD_LIMIT_BYTES) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[_Op] = []
        self.backward_at: int | None = None
        self.limit = limit
        self.kept = 0
        self.dropped_after: int | None = None
        # id(tensor) -> (weak reference, version, copy) of the outputs seen so far
        self._seen: dict[int, tuple[Any, int | None, torch.Tensor | _Ref]] = {}

    def backward_starts(self) -> None:
        """Mark the next op as the first of the backward pass."""
        self.backward_at = len(self.ops)

    def _keep(self, t: torch.Tensor) -> torch.Tensor | _Ref:
        seen = self._seen.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] is not None and seen[1] == _version(t):
            return seen[2]
        base = t._base if t._base is not None else t
        kept: torch.Tensor | _Ref
        if isinstance(base, torch.nn.Parameter):
            kept = _Ref(t)
        else:
            kept = t.detach().clone()
            self.kept += kept.numel() * kept.element_size()
        self._remember(t, kept)
        return kept

    def _remember(self, t: torch.Tensor, kept: torch.Tensor | _Ref) -> None:
        with contextlib.suppress(TypeError):  # not weakly referenceable
            self._seen[id(t)] = (weakref.ref(t), _version(t), kept)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        # Counted as the locator counts (its op_info): range markers are not ops, and a
        # CompositeImplicitAutograd op (which reaches a mode under inference_mode) is looked
        # through to the ops it calls, as outside inference mode.
        skipped, out = run_uncounted(self, op_info(func), args, kwargs)
        if skipped:
            return out
        tensors_in = _tensors([list(args), kwargs])
        dropped = self.dropped_after is not None or self.kept > self.limit
        if dropped and self.dropped_after is None:
            self.dropped_after = self.kept
        ins = [] if dropped else [self._keep(t) for t in tensors_in]
        out = func(*args, **kwargs)
        tensors_out = _tensors(out)
        outs = [] if dropped else [self._keep(t) for t in tensors_out]
        first = tensors_in or tensors_out
        ref = first[0] if first else None
        self.ops.append(
            _Op(
                func.name().split(".", 1)[0],
                ref.device.type if ref is not None else None,
                str(ref.dtype).replace("torch.", "", 1) if ref is not None else None,
                ins,
                outs,
                _scalars(func, args, kwargs),
                tuple(_ptr(t) for t in tensors_in),
                tuple(_ptr(t) for t in tensors_out),
                dropped,
                None if dropped else (func, template(list(args), [0]), kwargs),
                call_site(sys._getframe(1)),
            )
        )
        return out


def record(
    plan: Plan, rows: Sequence[int] | None, grads: list[torch.Tensor | None] | None
) -> OpLog:
    """The ops of one run of the plan (forward, and backward where ``grads`` are given)."""
    from pytest_backends.batch.runs import call

    plan = dataclasses.replace(plan, backward=grads is not None)
    recorder = RowRecorder()
    parts: dict[str, int] = {}
    # The ops recorded before fn raised are still compared.
    with contextlib.suppress(Exception):
        run, _ = call(plan, rows, grads, recorder)
        parts = {label: _ptr(t) for label, t, _ in run.parts}
    return OpLog(recorder.ops, recorder.backward_at, recorder.dropped_after, parts)


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
    for index in row_indices(rows, n, k, full.device):
        if not bool(rows_differ(full.index_select(d, index), sub, d).any()):
            return True
    return False if k == 1 else None


def _scalar_differs(a: _Op, b: _Op) -> str | None:
    """How a non-tensor argument differs (``end`` of an ``arange``), or None."""
    for (na, va), (_, vb) in zip(a.scalars, b.scalars):
        if not _equal_scalars(va, vb):
            return f"its argument `{na}` is {va!r} in the full batch and {vb!r} in the sub-batch"
    return None


def _equal_scalars(a: object, b: object) -> bool:
    try:
        if bool(a == b):
            return True
    except Exception:  # a value without a plain truth value
        pass
    return repr(a) == repr(b)


def _reads(
    op: _Op,
    ins: list[tuple[torch.Tensor, tuple[str, int, int]]],
    outputs: list[tuple[torch.Tensor, torch.Tensor, tuple[str, int, int]]],
    rows: Sequence[int],
    n: int,
) -> bool | None:
    """:func:`reads_other_rows` for a recorded op (None: it cannot be told)."""
    if len(ins) != len(op.inputs) or len(outputs) != len(op.outputs):
        return None
    return reads_other_rows(op.call, ins, [(x, how) for x, _, how in outputs], rows, n)


def _drawn_rows_differ(
    op: _Op,
    ins: list[tuple[torch.Tensor, tuple[str, int, int]]],
    outputs: list[tuple[torch.Tensor, torch.Tensor, tuple[str, int, int]]],
    rows: Sequence[int],
    n: int,
) -> str | None:
    """How a seeded random op gave differing batched rows (:func:`draws`), or None.

    For ops whose inputs are not proven equal (an ``empty`` tensor that
    ``bernoulli_`` fills) or hold no batch rows (``torch.rand(n, 1)``): only
    those torch tags ``nondeterministic_seeded`` are run again.
    """
    seeded = getattr(torch.Tag, "nondeterministic_seeded", None)
    if op.call is None or seeded is None or seeded not in getattr(op.call[0], "tags", ()):
        return None
    differ = any(
        how[0] == "batched" and _same(x, y, how, rows, n) is False for x, y, how in outputs
    )
    return draws(op.call, ins) if differ and len(ins) == len(op.inputs) else None


def compare_ops(
    full: OpLog,
    sub: OpLog,
    n: int,
    rows: Sequence[int],
    case: str,
    part: str | None = None,
) -> tuple[dict[tuple[str, str | None, str | None], str], Finding]:
    """Verdicts per ``(op, device, dtype)`` and the finding, from two recorded runs.

    Ops without a batched input get no verdict. The finding explains
    ``part`` (an output: only the forward ops can have changed it; a
    gradient or None: every op).
    """
    m = len(rows)
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    if m == n:
        reason = f"{case} has the batch's size, so rows cannot be matched through the ops' shapes"
        return verdicts, Finding("none", case, reason=reason)
    limit = len(full.ops)
    if part is not None and not part.startswith("grad of") and full.backward_at is not None:
        limit = full.backward_at
    causes: list[Finding] = []
    blamed: set[tuple[str, str | None, str | None]] = set()
    sequence: Finding | None = None
    # Mixing reductions (index, finding, storages their outputs reach) and the mixed storages.
    mixing: list[tuple[int, Finding]] = []
    mixed: dict[int, int] = {}  # storage address -> index into mixing
    relevant: set[int] = set()
    for i, (a, b) in enumerate(zip(full.ops, sub.ops)):
        key = (a.name, a.device, a.dtype)
        if a.name != b.name:
            if i < limit:
                # Under one call of the user's code in both runs, torch chose the ops (its
                # matmul: ``t`` + ``mm`` for eight rows, ``view`` + ``addmm`` for one).
                kind = "path" if a.site is not None and a.site == b.site else "sequence"
                sequence = Finding(kind, case, a.name, a.device, a.dtype, i, other_op=b.name)
            break
        # Follow mixed data: an op fed by a mixing reduction's output carries it on.
        sources = {mixed[p] for p in a.in_ptrs if p in mixed}
        if a.name in UNINITIALIZED:
            continue  # not data: neither compared nor blamed
        if a.dropped or b.dropped:
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            continue
        inputs_equal = len(a.inputs) == len(b.inputs)
        batched_input = False
        ins: list[tuple[torch.Tensor, tuple[str, int, int]]] = []
        for kept_x, kept_y in zip(a.inputs, b.inputs):
            x, y = _resolve(kept_x), _resolve(kept_y)
            if x is None or y is None:
                inputs_equal = False
                continue
            how = _batch_dim(x, y, n, m)
            ins.append((x, how))
            if how[0] == "batched":
                batched_input = True
            if inputs_equal and _same(x, y, how, rows, n) is not True:
                inputs_equal = False
        outputs = []
        for kept_x, kept_y in zip(a.outputs, b.outputs):
            x, y = _resolve(kept_x), _resolve(kept_y)
            if x is not None and y is not None:
                outputs.append((x, y, _batch_dim(x, y, n, m)))
        if sources and any(how[0] == "batched" for _, _, how in outputs):
            relevant.update(sources)
        for p in a.out_ptrs if sources else ():
            mixed[p] = min(sources)
        if not batched_input:
            # No batch rows in: nothing to blame, no verdict. A draw whose rows differ
            # (``torch.rand(n, 1)``) is still the cause the message names.
            if i < limit and (drawn := _drawn_rows_differ(a, ins, outputs, rows, n)):
                causes.append(Finding(drawn, case, a.name, a.device, a.dtype, i))
            elif (
                i < limit
                and (shown := _scalar_differs(a, b))
                and any(
                    how[0] == "batched" and _same(x, y, how, rows, n) is False
                    for x, y, how in outputs
                )
            ):  # a tensor made from the batch size (``torch.arange(t.shape[0])``)
                causes.append(Finding("scalar", case, a.name, a.device, a.dtype, i, reason=shown))
            continue
        scalars_equal = len(a.scalars) == len(b.scalars) and all(
            na == nb and _equal_scalars(va, vb) for (na, va), (nb, vb) in zip(a.scalars, b.scalars)
        )
        # An output that is not batched although an input is: a reduction over the batch.
        # With proven-equal inputs it mixes rows where its value differs; with inputs
        # that already differ, its shape alone says it mixes them.
        whole = [(x, y, how) for x, y, how in outputs if how[0] == "whole" and x.numel() > 0]
        reduced = bool(whole) and (
            not (inputs_equal and scalars_equal)
            or any(_same(x, y, how, rows, n) is False for x, y, how in whole)
        )
        if reduced and _reads(a, ins, outputs, rows, n) is False:
            # A count or a layout over the batch (a packed sequence's batch sizes), which
            # the other rows' values do not change: it mixes no values.
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            continue
        if reduced:
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            index = len(mixing)
            mixing.append((i, Finding("mixed", case, a.name, a.device, a.dtype, i)))
            for p in a.out_ptrs:
                mixed[p] = index
            if any(how[0] == "batched" for _, _, how in outputs):
                relevant.add(index)
            continue
        if not inputs_equal:
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            if i < limit and (drawn := _drawn_rows_differ(a, ins, outputs, rows, n)):
                causes.append(Finding(drawn, case, a.name, a.device, a.dtype, i))
            continue
        compared = differs = False
        for x, y, how in outputs:
            if how[0] == "whole":
                continue
            same = _same(x, y, how, rows, n)
            if same is None:
                continue
            compared = True
            if not same:
                differs = True
        if not scalars_equal:
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            if differs and i < limit and (shown := _scalar_differs(a, b)):
                causes.append(Finding("scalar", case, a.name, a.device, a.dtype, i, reason=shown))
            continue
        reads = _reads(a, ins, outputs, rows, n) if differs else False
        if differs and reads is None and (drawn := draws(a.call, ins)):
            # Random draws (a row's values depend on where it sits among the batch's draws),
            # or values that change from call to call whatever the batch.
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            if i < limit:
                causes.append(Finding(drawn, case, a.name, a.device, a.dtype, i))
            continue
        if differs and reads:
            # Output rows that change with the other rows' values: the op mixes rows (a
            # softmax, a cumulative sum, a roll over the batch), by design, not by its kernel.
            merge_verdict(verdicts, key, "inconclusive", VERDICTS)
            index = len(mixing)
            mixing.append((i, Finding("mixed", case, a.name, a.device, a.dtype, i, reason=ACROSS)))
            for p in a.out_ptrs:
                mixed[p] = index
            relevant.add(index)
            continue
        if differs:
            merge_verdict(verdicts, key, "batch_variant", VERDICTS)
            if i < limit and key not in blamed:
                blamed.add(key)
                causes.append(Finding("op", case, a.name, a.device, a.dtype, i))
        else:
            merge_verdict(verdicts, key, "no_difference" if compared else "inconclusive", VERDICTS)
    else:
        if len(full.ops) != len(sub.ops) and min(len(full.ops), len(sub.ops)) < limit:
            i = min(len(full.ops), len(sub.ops))
            longer = full.ops if len(full.ops) > i else sub.ops
            a_name = full.ops[i].name if len(full.ops) > i else "(end of run)"
            b_name = sub.ops[i].name if len(sub.ops) > i else "(end of run)"
            sequence = Finding(
                "sequence", case, a_name, longer[i].device, longer[i].dtype, i, other_op=b_name
            )
    causes.extend(f for j, (i, f) in enumerate(mixing) if j in relevant and i < limit)
    if sequence is not None and sequence.op_index is not None:
        # The ops after the sequences part are not compared; where the sub-batch's run drew
        # random numbers there (dropout in train mode), the draws explain its rows.
        after = _draw_after(sub, sequence.op_index, part, case)
        if after is not None:
            causes.append(after)
            sequence = None
    causes = _reaching(sub, causes, part)
    kinds = ("mixed", "random", "nondeterministic", "op", "scalar")
    finding = next((f for kind in kinds for f in causes if f.kind == kind), sequence)
    if sequence is not None:
        causes.append(sequence)
    if finding is None:
        dropped = full.dropped_after if full.dropped_after is not None else sub.dropped_after
        reason = (
            "every op whose input rows were proven equal gave equal output rows; the "
            "difference comes from an op whose inputs could not be matched row by row "
            "(a reduction over the batch, or a tensor whose batch dimension the shapes do "
            "not show)"
        )
        if dropped is not None:
            reason = (
                f"the recording stopped keeping copies after {dropped / 2**20:.0f} MiB "
                "(its memory limit); the ops after that prove nothing"
            )
        finding = Finding("none", case, reason=reason)
    if full.dropped_after is not None or sub.dropped_after is not None:
        causes.append(Finding("none", case, reason="the recording reached its memory limit"))
    causes.sort(key=lambda f: len(full.ops) if f.op_index is None else f.op_index)
    return verdicts, dataclasses.replace(finding, causes=tuple(causes) or (finding,))


def _draw_after(sub: OpLog, start: int, part: str | None, case: str) -> Finding | None:
    """The first op of ``sub`` from ``start`` on that draws random numbers (:func:`draws`).

    Only ops torch tags ``nondeterministic_seeded`` are run again; the forward
    ops only, where ``part`` is an output.
    """
    seeded = getattr(torch.Tag, "nondeterministic_seeded", None)
    end = len(sub.ops)
    if part is not None and not part.startswith("grad of") and sub.backward_at is not None:
        end = sub.backward_at
    for j in range(start, end):
        op = sub.ops[j]
        tags = getattr(op.call[0], "tags", ()) if op.call is not None else ()
        if seeded is None or seeded not in tags or op.name in UNINITIALIZED:
            continue
        ins = [_resolve(x) for x in op.inputs]
        kept = [(x, ("unknown", 0, 0)) for x in ins if x is not None]
        if len(kept) == len(ins) and draws(op.call, kept) == "random":
            return Finding("random", case, op.name, op.device, op.dtype, j)
    return None


def _reaching(sub: OpLog, causes: list[Finding], part: str | None) -> list[Finding]:
    """The ``causes`` whose data reaches ``part`` of the sub-batch's run (all where not traced).

    Followed through the storages each op read and wrote: an op's outputs carry
    what its inputs carried, and its own cause. A part whose storage no
    recorded op wrote (or no part given) keeps every cause.
    """
    ptr = sub.parts.get(part) if part is not None else None
    if not ptr:
        return causes
    own: dict[int, set[int]] = {}
    for k, f in enumerate(causes):
        if f.op_index is not None:
            own.setdefault(f.op_index, set()).add(k)
    carried: dict[int, frozenset[int]] = {}
    for i, op in enumerate(sub.ops):
        found = set(own.get(i, ()))
        for p in op.in_ptrs:
            found.update(carried.get(p, ()))
        for p in op.out_ptrs:
            if p:
                carried[p] = frozenset(found)
    reached = carried.get(ptr)
    if reached is None:
        return causes
    return [f for k, f in enumerate(causes) if k in reached]


if TYPE_CHECKING:
    from pytest_backends.recorder import Recorder

    _: type[Recorder] = RowRecorder
