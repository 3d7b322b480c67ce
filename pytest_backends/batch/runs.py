"""The runs of a batch-invariance check: sub-batches, one call of ``fn``, row comparison.

Shared by :mod:`~pytest_backends.batch.api` (the check) and
:mod:`~pytest_backends.batch.locate` (the op-by-op comparison); the state each
run starts from is in :mod:`~pytest_backends.batch.state`. Importing this
module does not import torch; its functions do.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_backends import _tree

if TYPE_CHECKING:
    import torch

__all__ = [
    "Case",
    "Inputs",
    "Plan",
    "Run",
    "arguments",
    "call",
    "differences",
    "row_differences",
    "rows_differ",
    "rows_within",
    "same_bits",
    "sub_batches",
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
        import torch

        gen = torch.Generator()
        gen.manual_seed(seed)
        order = tuple(int(i) for i in torch.randperm(n, generator=gen))
        if order == tuple(range(n)):
            order = tuple(reversed(order))
        cases.append(Case("the batch permuted", order))
    return cases


class Run:
    """One call of ``fn`` on (a selection of) the batch: its outputs and input gradients.

    ``structure`` maps every output leaf's path to ``None`` (an absent
    output) or ``(dtype, shape without the batch dimension)``.
    """

    def __init__(
        self,
        parts: list[tuple[str, torch.Tensor, int]],
        structure: dict[str, object] | None = None,
    ) -> None:
        self.parts = parts  # (label, tensor, batch dim)
        self.structure = structure if structure is not None else {}
        self.by_label = {label: t for label, t, _ in parts}


def _span(rows: Sequence[int]) -> int | None:
    """The first row when ``rows`` are consecutive and ascending, else None."""
    first = rows[0]
    if all(r == first + i for i, r in enumerate(rows)):
        return first
    return None


def _blank_like(x: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``x``'s sizes, strides and storage offset (so its alignment too)."""
    import torch

    if x.numel() == 0:
        return torch.empty_like(x)
    extent = 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))
    buf = torch.empty(x.storage_offset() + extent, dtype=x.dtype, device=x.device)
    return buf.as_strided(x.shape, x.stride(), x.storage_offset())


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` where ``dst`` may repeat elements along stride-0 dimensions."""
    for k in range(dst.dim()):
        if dst.stride(k) == 0 and dst.shape[k] > 1:
            dst, src = dst.narrow(k, 0, 1), src.narrow(k, 0, 1)
    dst.copy_(src)


def same_layout(x: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of ``x`` laid out as ``like`` (default ``x``): sizes, strides, storage offset."""
    dst = _blank_like(like if like is not None else x)
    _copy_into(dst, x.detach())
    return dst


def _check_layout(x: object, what: str) -> None:
    import torch

    if not isinstance(x, torch.Tensor):
        return
    if x.is_nested:
        raise TypeError(f"assert_batch_invariant: not supported: nested {what}")
    if x.layout != torch.strided:
        kind = "sparse" if x.is_sparse or "sparse" in str(x.layout) else str(x.layout)
        raise TypeError(f"assert_batch_invariant: not supported: {kind} {what}")


class Inputs:
    """Private copies of the batched inputs, in the inputs' own memory layout.

    A sub-batch of consecutive rows is a view of the copy: the same strides,
    memory format and addresses as those rows have in the full batch, as a
    user slicing ``x[i:i + 1]`` gets. Other selections (the batch permuted)
    are gathered into a tensor with the input's strides. A copy that ``fn``
    wrote in place is refreshed before the next run.
    """

    def __init__(self, inputs: Sequence[object], dims: Sequence[int | None]) -> None:
        import torch

        self.inputs = list(inputs)
        self.dims = list(dims)
        self.copies: list[torch.Tensor | None] = []
        self.versions: list[int] = []
        for i, (x, d) in enumerate(zip(inputs, dims)):
            if d is None or not isinstance(x, torch.Tensor):
                self.copies.append(None)
                self.versions.append(0)
                continue
            _check_layout(x, f"input {i}")
            try:
                copy = same_layout(x)
            except RuntimeError:  # a layout with overlaps that strides alone cannot rebuild
                copy = x.detach().clone()
            self.copies.append(copy)
            self.versions.append(copy._version)

    def refresh(self) -> None:
        """Rewrite every copy that a run wrote in place."""
        import torch

        for i, copy in enumerate(self.copies):
            if copy is not None and copy._version != self.versions[i]:
                x = self.inputs[i]
                assert isinstance(x, torch.Tensor)
                _copy_into(copy, x.detach())
                self.versions[i] = copy._version

    def select(self, rows: Sequence[int] | None) -> list[object]:
        """The arguments of one run: batched inputs selected as detached leaves."""
        args: list[object] = []
        for x, d, copy in zip(self.inputs, self.dims, self.copies):
            if copy is None or d is None:
                args.append(x)
                continue
            y = take_rows(copy, d, rows)
            if y is copy:
                y = copy.detach()
            if x.requires_grad:  # type: ignore[attr-defined]
                y.requires_grad_(True)
            args.append(y)
        return args


def take_rows(x: torch.Tensor, d: int, rows: Sequence[int] | None) -> torch.Tensor:
    """``rows`` of ``x`` along ``d`` in ``x``'s own layout (a view for consecutive rows)."""
    import torch

    if x.requires_grad:
        x = x.detach()
    if rows is None:
        return x.detach()
    first = _span(rows)
    if first is not None:
        return x.narrow(d, first, len(rows))
    index = torch.tensor(list(rows), dtype=torch.long, device=x.device)
    gathered = x.index_select(d, index)
    try:
        return same_layout(gathered, x.narrow(d, 0, len(rows)))
    except RuntimeError:
        return gathered


def select_rows(x: torch.Tensor, d: int, rows: Sequence[int]) -> torch.Tensor:
    """``rows`` of ``x`` along ``d``, in that order (a view for consecutive rows)."""
    return take_rows(x, d, rows)


def prepare(
    inputs: Sequence[object], dims: Sequence[int | None], rows: Sequence[int] | None
) -> list[object]:
    """The inputs of one run: batched ones selected in their own layout (detached leaves)."""
    return Inputs(inputs, dims).select(rows)


def _signature(leaf: torch.Tensor, out_dim: int, n: int) -> tuple[str, tuple[int, ...]]:
    shape = list(leaf.shape)
    if leaf.dim() > out_dim and shape[out_dim] == n:
        shape[out_dim] = -1  # the batch
    return (str(leaf.dtype), tuple(shape))


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
        _check_layout(leaf, f"output `{path}`")
        batched = leaf.dim() > out_dim and leaf.shape[out_dim] == n
        if structure is not None:
            structure[path] = _signature(leaf, out_dim, n)
            if batched:
                found.append((path, leaf))
            continue
        if not batched:
            raise ValueError(
                f"assert_batch_invariant: {path} has shape {list(leaf.shape)}, which has no "
                f"batch dimension {out_dim} of size {n}; return per-row results (a loss "
                "reduced over the batch cannot be compared row by row)"
            )
        found.append((path, leaf))
    if not found and structure is None:
        raise ValueError("assert_batch_invariant: fn returned no tensor")
    return found


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
    structure: dict[str, object] = {}
    got: Sequence[torch.Tensor | None] = ()
    wrt: list[tuple[int, torch.Tensor, int]] = []
    used = None
    with watch if watch is not None else contextlib.nullcontext():
        result = plan.fn(*args)
        if rows is None:  # the full batch's outputs must be batched tensors
            outs = outputs_of(result, plan.out_dim, n)
            if isinstance(result, torch.Tensor):
                structure["output"] = _signature(result, plan.out_dim, n)
            else:
                for path, leaf in _tree.leaves(result, "output"):
                    structure[path] = None if leaf is None else _signature(leaf, plan.out_dim, n)
        else:
            outs = outputs_of(result, plan.out_dim, n, structure)
        if plan.backward and grads is None and rows is None:
            with torch.utils._python_dispatch._disable_current_modes():
                grads = upstream = upstream_grads([t for _, t in outs], plan.seed)
        if upstream is not None and len(upstream) == len(outs):
            wrt = [
                (i, a, d)
                for i, (a, d) in enumerate(zip(args, plan.dims))
                if d is not None and isinstance(a, torch.Tensor) and a.requires_grad
            ]
            diff = [
                (t, g) for (_, t), g in zip(outs, upstream) if g is not None and differentiable(t)
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
    # An output that is an input's memory (fn wrote it in place) is copied: the input
    # copy is rewritten before the next run.
    held = {_storage(a) for a in args if isinstance(a, torch.Tensor)}
    parts = [
        (label, t.detach().clone() if _storage(t) in held else t.detach(), plan.out_dim)
        for label, t in outs
    ]
    for (i, _, d), g in zip(wrt, got):
        if g is not None:
            parts.append((f"grad of input {i}", g, d))
    return Run(parts, structure), used


def _storage(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # no storage (a tensor subclass)
        return -1


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as integers of its element size (no copy), so NaNs and -0.0 compare by bits."""
    import torch

    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    size = t.element_size()
    if size == 1:
        return t.view(torch.uint8)
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one shape and dtype are bitwise equal (one op: the fast path)."""
    import torch

    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    return bool(torch.equal(_bits(a), _bits(b)))


def rows_differ(full_rows: torch.Tensor, sub: torch.Tensor, d: int) -> torch.Tensor:
    """A bool per row (along ``d``): whether the two tensors' rows differ bitwise."""
    import torch

    a, b = full_rows.detach(), sub.detach()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    ne = _bits(a) != _bits(b)
    if ne.dim() == 1:
        return ne
    if ne.numel() == 0:
        return torch.zeros(ne.shape[d], dtype=torch.bool, device=ne.device)
    return torch.movedim(ne, d, 0).reshape(ne.shape[d], -1).any(1)


def differences(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``(max abs, max rel)`` difference of ``a`` from the reference ``b``; NaN vs number is inf."""
    import torch

    if a.numel() == 0 or not (a.is_floating_point() or a.is_complex()):
        if torch.equal(a, b):
            return 0.0, 0.0
        diff = (a.double() - b.double()).abs()
        m = float(diff.max())
        return m, m
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.detach().to(wide), b.detach().to(wide)
    diff = (x - y).abs()
    if not bool(torch.isfinite(diff).all()):
        same_nan = torch.isnan(x) & torch.isnan(y)
        diff = torch.where(same_nan, torch.zeros_like(diff), diff)
        diff = torch.nan_to_num(diff, nan=math.inf)
    scale = y.abs()
    rel = torch.where(scale > 0, diff / scale, diff)
    return float(diff.max()), float(rel.max())


def _per_row(t: torch.Tensor, d: int) -> torch.Tensor:
    """``t`` (non-empty) as one row per index along ``d``: shape ``(rows, elements per row)``."""
    import torch

    if t.dim() == 1:
        return t.reshape(-1, 1)
    return torch.movedim(t, d, 0).reshape(t.shape[d], -1)


def row_differences(a: torch.Tensor, b: torch.Tensor, d: int) -> tuple[list[float], list[float]]:
    """Per row along ``d``: :func:`differences` of that row of ``a`` from that row of ``b``.

    One pass over the tensors for every row at once; the max over a set of
    rows is the :func:`differences` of those rows.
    """
    import torch

    n = a.shape[d]
    if a.numel() == 0:
        return [0.0] * n, [0.0] * n
    if not (a.is_floating_point() or a.is_complex()):
        diff = (a.double() - b.double()).abs()
        m = _per_row(diff, d).amax(1).tolist()
        return m, list(m)
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.detach().to(wide), b.detach().to(wide)
    diff = (x - y).abs()
    scale = y.abs()
    for finite in (True, False):
        if not finite:  # a NaN or infinity somewhere (amax propagates NaN)
            same_nan = torch.isnan(x) & torch.isnan(y)
            diff = torch.where(same_nan, torch.zeros_like(diff), diff)
            diff = torch.nan_to_num(diff, nan=math.inf)
        rel = torch.where(scale > 0, diff / scale, diff)
        both = torch.stack([_per_row(diff, d).amax(1), _per_row(rel, d).amax(1)])
        abs_rows, rel_rows = both.tolist()
        if not finite or all(math.isfinite(v) for v in abs_rows):
            break
    return abs_rows, rel_rows


def rows_within(a: torch.Tensor, b: torch.Tensor, d: int, rtol: float, atol: float) -> list[bool]:
    """Per row along ``d``: whether ``|a - b| <= atol + rtol * |b|`` everywhere (NaN equals NaN).

    Integer and bool rows are within only when equal.
    """
    import torch

    n = a.shape[d]
    if a.numel() == 0:
        return [True] * n
    if not (a.is_floating_point() or a.is_complex()):
        return (~rows_differ(b, a, d)).tolist()
    close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if close.dim() == 0:
        close = close.reshape(1)
    return _per_row(close, d).all(1).tolist()
