"""The runs of a batch-invariance check: sub-batches, their inputs, one call of ``fn``.

Shared by :mod:`~pytest_backends.batch.api` (the check) and
:mod:`~pytest_backends.batch.locate` (the op-by-op comparison); the state each
run starts from is in :mod:`~pytest_backends.batch.state`, the row comparison
in :mod:`~pytest_backends.batch.rows` and :mod:`~pytest_backends.batch.compare`.
Importing this module does not import torch; its functions do.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_backends import _tree
from pytest_backends.batch.dims import axis, unbatched_output
from pytest_backends.batch.layout import check_layout, copy_into, same_layout
from pytest_backends.batch.rows import row_index, span

if TYPE_CHECKING:
    import torch

# A context manager that does nothing, made once (entered on the check's hot path).
_NO_CONTEXT = contextlib.nullcontext()

__all__ = [
    "Case",
    "Inputs",
    "Plan",
    "Run",
    "arguments",
    "call",
    "finish_runs",
    "nbytes",
    "note_failure",
    "storage_of",
    "sub_batches",
    "sweep",
]


@dataclass(frozen=True)
class Case:
    """One sub-batch: a label (``"row 3 alone"``) and the full-batch indices of its rows."""

    label: str
    rows: tuple[int, ...]

    @property
    def size(self) -> int:
        """The number of rows."""
        return len(self.rows)

    @functools.cached_property
    def first(self) -> int | None:
        """:func:`span` of the rows: the first when they are consecutive and ascending."""
        return span(self.rows)


def sub_batches(
    n: int, sizes: Sequence[int], offsets: Sequence[int] | None, permute: bool, seed: int
) -> list[Case]:
    """The sub-batches of a batch of ``n`` rows (see ``assert_batch_invariant``).

    Each size below ``n`` is taken at offsets 0, the middle and the end (or
    at ``offsets``); with ``permute``, the whole batch in a seeded order.
    """
    key = (n, tuple(sizes), None if offsets is None else tuple(offsets), permute, seed)
    cached = _CASES.get(key)
    if cached is None:
        cached = _sub_batches(n, sizes, offsets, permute, seed)
        if len(_CASES) > 256:
            _CASES.clear()
        _CASES[key] = cached
    return list(cached)


_CASES: dict[tuple[Any, ...], list[Case]] = {}


def _sub_batches(
    n: int, sizes: Sequence[int], offsets: Sequence[int] | None, permute: bool, seed: int
) -> list[Case]:
    cases: list[Case] = []
    for size in sizes:
        if size >= n:
            continue
        if offsets is not None:
            starts = sorted({o for o in offsets if 0 <= o <= n - size})
        else:
            starts = sorted({0, (n - size) // 2, n - size})
        for start in starts:
            rows = tuple(range(start, start + size))
            label = f"row {start} alone" if size == 1 else f"rows {start}..{start + size - 1}"
            cases.append(Case(label, rows))
    if permute and n > 1:
        # Drawn without a torch op: the cases are cached, and a check inside a test that
        # ``--backends-determinism`` runs again must make the same ops in every run.
        order = tuple(random.Random(seed).sample(range(n), n))
        if order == tuple(range(n)):
            order = tuple(reversed(order))
        cases.append(Case("the batch permuted", order))
    return cases


class Run:
    """One call of ``fn`` on (a selection of) the batch: its outputs and input gradients.

    ``structure`` maps every output leaf's path to ``None`` (an absent
    output) or ``(dtype, shape without the batch dimension)``. ``single``
    says that the output was one tensor with a batch dimension, and no
    gradient was taken: ``parts`` is that tensor alone, and the structure is
    its signature (made when asked for).
    """

    __slots__ = ("_by_label", "_structure", "parts", "single")

    def __init__(
        self,
        parts: list[tuple[str, torch.Tensor, int]],
        structure: dict[str, object] | None = None,
        single: bool = False,
    ) -> None:
        self.parts = parts  # (label, tensor, batch dim)
        self.single = single
        self._structure = structure if structure is not None or single else {}
        self._by_label: dict[str, torch.Tensor] | None = None

    @property
    def structure(self) -> dict[str, object]:
        """Every output leaf's path and signature."""
        if self._structure is None:
            _, t, d = self.parts[0]
            self._structure = {"output": _signature(t, d, t.shape[d])}
        return self._structure

    @property
    def by_label(self) -> dict[str, torch.Tensor]:
        """The parts' tensors by label."""
        if self._by_label is None:
            self._by_label = {label: t for label, t, _ in self.parts}
        return self._by_label


class Inputs:
    """Private copies of the batched inputs, in the inputs' own memory layout.

    A sub-batch of consecutive rows is a view of the copy: the same strides,
    memory format and addresses as those rows have in the full batch, as a
    user slicing ``x[i:i + 1]`` gets. Other selections (the batch permuted)
    are gathered into a tensor with the input's strides. A tensor input that
    is not batched is copied too, and every run gets that copy whole. A copy
    that ``fn`` wrote in place is refreshed before the next run. ``held`` are
    the storages (data pointers) of the copies: an output there is the
    memory of an argument, which a later run may write.
    """

    def __init__(self, inputs: Sequence[object], dims: Sequence[int | None]) -> None:
        import torch

        self.inputs = list(inputs)
        self.dims = list(dims)
        self.copies: list[torch.Tensor | None] = []
        self.versions: list[int] = []
        self.held: set[int] = set()
        # (argument, batch dim, copy, requires grad) per input; copy None: the argument is
        # passed whole (an unbatched tensor's copy, or a value that is not a tensor)
        self._entries: list[tuple[object, int, torch.Tensor | None, bool]] = []
        for i, (x, d) in enumerate(zip(inputs, dims)):
            if not isinstance(x, torch.Tensor):
                self.copies.append(None)
                self.versions.append(0)
                self._entries.append((x, 0, None, False))
                continue
            if x.is_nested or x.layout != torch.strided:
                check_layout(x, f"input {i}")
            # Made outside inference mode: a copy tracks its version (a write is seen).
            with torch.inference_mode(False) if torch.is_inference_mode_enabled() else _NO_CONTEXT:
                try:
                    copy = same_layout(x)
                except RuntimeError:  # a layout with overlaps that strides cannot rebuild
                    copy = x.detach().clone()
            self.copies.append(copy)
            self.versions.append(copy._version)
            self.held.add(storage_of(copy))
            if d is None:
                # Not batched: every run gets this one copy (rewritten where a run wrote it),
                # so that no run sees another's writes and the caller's tensor stays as it is.
                if x.requires_grad:
                    copy.requires_grad_(True)
                self._entries.append((copy, 0, None, False))
                continue
            self._entries.append((x, d, copy, x.requires_grad))
        self._copied = [(i, c) for i, c in enumerate(self.copies) if c is not None]
        self.needs_grad = any(grad for _, _, _, grad in self._entries)

    def copied(self) -> list[tuple[int, torch.Tensor]]:
        """The tensor inputs' copies with their indices (``versions[i]``: a copy's last write)."""
        return self._copied

    def refresh(self) -> None:
        """Rewrite every copy that a run wrote in place."""
        versions = self.versions
        for i, copy in self._copied:
            if copy._version != versions[i]:
                import torch

                with torch.no_grad():  # an unbatched copy may be a leaf that requires grad
                    copy_into(copy, self.inputs[i].detach())  # type: ignore[attr-defined]
                versions[i] = copy._version

    def select(self, rows: Sequence[int] | None, first: int | None = -1) -> list[object]:
        """The arguments of one run: batched inputs selected as detached leaves.

        ``first``: :func:`span` of ``rows`` where the caller knows it (-1: not given).
        """
        args: list[object] = []
        if first == -1:
            first = None if rows is None else span(rows)
        for x, d, copy, grad in self._entries:
            if copy is None:
                args.append(x)
                continue
            if rows is None:
                y = copy.detach()
            elif first is not None:
                # A view of the rows; slicing along dim 0 is the cheapest way to make one.
                y = copy[first : first + len(rows)] if d == 0 else copy.narrow(d, first, len(rows))
            else:
                y = _gather(copy, d, rows)
            if grad:
                y.requires_grad_(True)
            args.append(y)
        return args


def take_rows(x: torch.Tensor, d: int, rows: Sequence[int] | None) -> torch.Tensor:
    """``rows`` of ``x`` along ``d`` in ``x``'s own layout (a view for consecutive rows)."""

    if x.requires_grad:
        x = x.detach()
    if rows is None:
        return x.detach()
    first = span(rows)
    if first is not None:
        return x.narrow(d, first, len(rows))
    return _gather(x, d, rows)


def _gather(x: torch.Tensor, d: int, rows: Sequence[int]) -> torch.Tensor:
    """``rows`` of ``x`` along ``d`` gathered into a new tensor with the strides ``x`` has."""
    gathered = x.index_select(d, row_index(rows, x.device))
    # All the rows (the batch permuted): laid out as ``x`` itself.
    like = x if len(rows) == x.shape[d] else x.narrow(d, 0, len(rows))
    if gathered.stride() == like.stride() and like.storage_offset() == 0:
        return gathered  # already laid out as the input (a contiguous one, say)
    try:
        return same_layout(gathered, like)
    except RuntimeError:
        return gathered


def prepare(
    inputs: Sequence[object], dims: Sequence[int | None], rows: Sequence[int] | None
) -> list[object]:
    """The inputs of one run: batched ones selected in their own layout (detached leaves)."""
    return Inputs(inputs, dims).select(rows)


def _signature(leaf: torch.Tensor, out_dim: int, n: int) -> tuple[object, tuple[int, ...]]:
    """``(dtype, shape)`` of an output leaf, its batch dimension (``n`` rows) shown as -1."""
    shape = leaf.shape
    d = axis(len(shape), out_dim)
    if d is not None and shape[d] == n:
        return (leaf.dtype, (*shape[:d], -1, *shape[d + 1 :]))
    return (leaf.dtype, tuple(shape))


def outputs_of(
    result: object, out_dim: int, n: int, structure: dict[str, object] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """The output tensors of one call with their paths; None leaves are skipped.

    Without ``structure`` (the full batch), an output that is not a tensor
    batched along ``out_dim`` is an error. With it (a sub-batch), every
    leaf's signature is written there and the leaves without ``n`` rows are
    left out: their difference from the full batch's is a failure, not an error.
    """
    import torch

    found: list[tuple[str, torch.Tensor]] = []
    leaves = (
        [("output", result)]
        if isinstance(result, torch.Tensor)  # the common case, without the tree walk
        else _tree.leaves(result, "output")
    )
    for path, leaf in leaves:
        if leaf is None:
            if structure is not None:
                structure[path] = None
            continue  # an absent optional output (attention weights not asked for)
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"assert_batch_invariant: {path} is a {type(leaf).__name__}, not a tensor: fn "
                "must return tensors (or containers of them) batched along out_dim"
            )
        check_layout(leaf, f"output `{path}`")
        d = axis(leaf.dim(), out_dim)
        batched = d is not None and leaf.shape[d] == n
        if structure is not None:
            structure[path] = _signature(leaf, out_dim, n)
            if batched:
                found.append((path, leaf))
            continue
        if not batched:
            raise ValueError(unbatched_output(path, leaf.shape, out_dim, n))
        found.append((path, leaf))
    if not found and structure is None:
        raise ValueError("assert_batch_invariant: fn returned no tensor")
    return found


def _single_output(
    result: torch.Tensor, out_dim: int, n: int, full: bool, structure: dict[str, object]
) -> list[tuple[str, torch.Tensor]]:
    """:func:`outputs_of` and the structure of an output that is one tensor."""
    import torch

    if result.is_nested or result.layout != torch.strided:
        check_layout(result, "output `output`")
    sig = structure["output"] = _signature(result, out_dim, n)
    if -1 in sig[1]:
        return [("output", result)]
    if full:
        outputs_of(result, out_dim, n)  # raises: the full batch's output has no batch dimension
    return []


def upstream_grads(outputs: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor | None]:
    """Seeded random upstream gradients, one per output (``seed + i`` for output ``i``).

    Integer and bool outputs take no part in backward: their entry is None.
    """
    import torch

    grads: list[torch.Tensor | None] = []
    for i, out in enumerate(outputs):
        if not (out.is_floating_point() or out.is_complex()):
            grads.append(None)
            continue
        gen = torch.Generator(device=out.device)
        gen.manual_seed(seed + i)
        grads.append(torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=gen))
    return grads


def differentiable(t: torch.Tensor) -> bool:
    """Whether ``t`` can be back-propagated (requires grad, floating point or complex)."""
    return bool(t.requires_grad and (t.is_floating_point() or t.is_complex()))


@dataclass
class Plan:
    """What one check runs: ``fn``, its inputs and their batch dims, ``N`` and options."""

    fn: Callable[..., object]
    inputs: Sequence[object]
    dims: list[int | None]
    n: int
    out_dim: int
    backward: bool
    seed: int
    copies: Inputs | None = None
    #: Where each input sits in the caller's arguments, where a container was flattened.
    names: Sequence[str] | None = None

    def batched(self) -> Inputs:
        """The private copies of the batched inputs (made on first use)."""
        if self.copies is None:
            self.copies = Inputs(self.inputs, self.dims)
        return self.copies


Grads = list["torch.Tensor | None"]


def arguments(
    plan: Plan, rows: Sequence[int] | None, grads: Grads | None
) -> tuple[list[object], Grads | None]:
    """The arguments of one run and its upstream gradients (rows of the full batch's)."""
    args = plan.batched().select(rows)
    upstream = None
    if plan.backward and grads is not None:
        upstream = (
            grads
            if rows is None
            else [None if g is None else take_rows(g, plan.out_dim, rows) for g in grads]
        )
    return args, upstream


def call(
    plan: Plan,
    rows: Sequence[int] | None,
    grads: Grads | None,
    watch: Any = None,
    prepared: tuple[list[object], Grads | None] | None = None,
) -> tuple[Run, Grads | None]:
    """Run ``fn`` on ``rows`` of the batch (None: the whole batch) and collect its parts.

    ``grads`` are the full batch's upstream gradients; a sub-batch uses their rows.
    The whole batch draws them (seeded) when the plan asks for a backward check
    and none are given. Returns the run and the upstream gradients used (None:
    no backward). Only ``fn`` and its backward run inside ``watch`` (a context
    manager such as an op recorder; its ``backward_starts()`` is called, where
    it has one, between the two); selecting the rows happens outside it,
    or before, in :func:`arguments` (``prepared``).
    """
    import torch

    args, upstream = prepared if prepared is not None else arguments(plan, rows, grads)
    n = plan.n if rows is None else len(rows)
    out_dim = plan.out_dim
    structure: dict[str, object] = {}
    got: Sequence[torch.Tensor | None] = ()
    wrt: list[tuple[int, torch.Tensor, int]] = []
    used = None
    with watch if watch is not None else _NO_CONTEXT:
        result = plan.fn(*args)
        if isinstance(result, torch.Tensor):  # the common case, without the tree walk
            outs = _single_output(result, out_dim, n, rows is None, structure)
        elif rows is None:  # the full batch's outputs must be batched tensors
            outs = outputs_of(result, out_dim, n)
            for path, leaf in _tree.leaves(result, "output"):
                structure[path] = None if leaf is None else _signature(leaf, out_dim, n)
        else:
            outs = outputs_of(result, out_dim, n, structure)
        if plan.backward and plan.batched().needs_grad:
            if (
                grads is None
                and rows is None
                # Drawn only where a backward will run (none under no_grad, say).
                and any(differentiable(t) for _, t in outs)
            ):
                with torch.utils._python_dispatch._disable_current_modes():
                    grads = upstream = upstream_grads([t for _, t in outs], plan.seed)
            if upstream is not None and len(upstream) == len(outs):
                wrt = [
                    (i, a, d)
                    for i, (a, d) in enumerate(zip(args, plan.dims))
                    if d is not None and isinstance(a, torch.Tensor) and a.requires_grad
                ]
                diff = [
                    (t, g)
                    for (_, t), g in zip(outs, upstream)
                    if g is not None and differentiable(t)
                ]
                if wrt and diff:
                    mark = getattr(watch, "backward_starts", None)
                    if mark is not None:
                        mark()
                    got = torch.autograd.grad(
                        [t for t, _ in diff],
                        [a for _, a, _ in wrt],
                        [g for _, g in diff],
                        allow_unused=True,
                    )
                    used = grads
    # Detached outside ``watch``: the check's own ops are not the function's.
    parts = _parts(outs, plan.batched().held, out_dim)
    for (i, _, d), g in zip(wrt, got):
        if g is not None:
            parts.append((f"grad of {plan.names[i] if plan.names else f'input {i}'}", g, d))
    single = isinstance(result, torch.Tensor) and len(parts) == 1 and not got
    return Run(parts, structure, single), used


def _parts(
    outs: list[tuple[str, torch.Tensor]], held: set[int], out_dim: int
) -> list[tuple[str, torch.Tensor, int]]:
    """The compared parts of a run's outputs, detached.

    An output that is an argument's memory (fn wrote an input in place, or
    returned a view of it) is copied: the input copy is rewritten before the
    next run.
    """
    parts = []
    for label, t in outs:
        if storage_of(t) in held:
            t = t.detach().clone()
        elif t.requires_grad:
            t = t.detach()
        d = axis(t.dim(), out_dim)
        parts.append((label, t, out_dim if d is None else d))
    return parts


def nbytes(run: Run) -> int:
    """The bytes of a run's compared tensors."""
    return sum(t.nbytes for _, t, _ in run.parts)


def sweep(
    plan: Plan, cases: Sequence[Case], grads: Grads | None, start: Any, limit: int
) -> Iterator[list[tuple[Run, Case]]]:
    """The runs of ``cases``, each begun from ``start``, in lists of about ``limit`` bytes.

    Where no input gradient is compared, a run is only restore, select and
    call: a tensor output is kept as it is (copied at once where it is an
    argument's memory) and its structure and parts are taken after the
    loop, for a list of runs at a time, instead of between two calls.
    """
    import torch

    inputs = plan.batched()
    forward_only = not (plan.backward and grads is not None and inputs.needs_grad)
    held, fn, out_dim, strided = inputs.held, plan.fn, plan.out_dim, torch.strided
    kept: list[tuple[Case, torch.Tensor | Run]] = []
    size = 0
    if forward_only:
        # Every sub-batch's views made at once (the copies put back first): a copy written in
        # place is rewritten before each run, which its views see.
        start.restore()
        selected = [inputs.select(case.rows, case.first) for case in cases]
    for k, case in enumerate(cases):
        if k or not forward_only:
            start.restore()
        if forward_only:
            try:
                result = fn(*selected[k])
            except Exception as exc:
                note_failure(exc, case, plan.n)
                raise
            selected[k] = []
            if (
                isinstance(result, torch.Tensor)
                and result.layout == strided
                and not result.is_nested
            ):
                if storage_of(result) in held:
                    result = result.detach().clone()
                kept.append((case, result))
                size += result.nbytes
                if size > limit:
                    yield finish_runs(kept, out_dim)
                    kept, size = [], 0
                continue
            structure: dict[str, object] = {}
            outs = outputs_of(result, out_dim, len(case.rows), structure)
            run = Run(_parts(outs, held, out_dim), structure)
        else:
            try:
                run, _ = call(plan, case.rows, grads)
            except Exception as exc:
                note_failure(exc, case, plan.n)
                raise
        kept.append((case, run))
        size += nbytes(run)
        if size > limit:
            yield finish_runs(kept, out_dim)
            kept, size = [], 0
    if kept:
        yield finish_runs(kept, out_dim)


def note_failure(exc: Exception, case: Case, n: int) -> None:
    """``exc`` with a note naming the sub-batch it was raised on (the full batch ran)."""
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(
            f"assert_batch_invariant: fn raised this on the sub-batch `{case.label}` "
            f"({case.size} of {n} rows), after the full batch ran: it fails for another "
            "batch size"
        )


def finish_runs(
    kept: list[tuple[Case, torch.Tensor | Run]], out_dim: int
) -> list[tuple[Run, Case]]:
    """The runs of :func:`sweep`, a tensor output made a run."""
    import torch

    made = []
    for case, got in kept:
        if isinstance(got, torch.Tensor):
            d = axis(got.dim(), out_dim)
            if d is not None and got.shape[d] == len(case.rows):
                if got.requires_grad:
                    got = got.detach()
                got = Run([("output", got, d)], single=True)
            else:
                structure: dict[str, object] = {}
                outs = _single_output(got, out_dim, len(case.rows), False, structure)
                got = Run([(label, t.detach(), out_dim) for label, t in outs], structure)
        made.append((got, case))
    return made


def storage_of(t: torch.Tensor) -> int:
    """The data pointer of ``t``'s storage (-1 where it has none: a tensor subclass)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # no storage (a tensor subclass)
        return -1
