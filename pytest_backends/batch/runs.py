"""The runs of a batch-invariance check: sub-batches, one call of ``fn``, row comparison.

Shared by :mod:`~pytest_backends.batch.api` (the check) and
:mod:`~pytest_backends.batch.locate` (the op-by-op comparison). Importing this
module does not import torch; its functions do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_backends import _tree

if TYPE_CHECKING:
    import torch

__all__ = [
    "EVERY_ROW_UP_TO",
    "Case",
    "Plan",
    "Run",
    "arguments",
    "call",
    "differences",
    "rows_differ",
    "sub_batches",
]

#: Batches up to this size are checked with every row alone; larger ones at three offsets.
EVERY_ROW_UP_TO = 32


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
    """The sub-batches of a batch of ``n`` rows (see ``assert_batch_invariant``)."""
    import torch

    cases: list[Case] = []
    for size in sizes:
        if size >= n:
            continue
        if offsets is not None:
            starts = sorted({o for o in offsets if 0 <= o <= n - size})
        elif size == 1 and n <= EVERY_ROW_UP_TO:
            starts = list(range(n))
        else:
            starts = sorted({0, (n - size) // 2, n - size})
        for start in starts:
            rows = tuple(range(start, start + size))
            label = f"row {start} alone" if size == 1 else f"rows {start}..{start + size - 1}"
            cases.append(Case(label, rows))
    if permute and n > 1:
        gen = torch.Generator()
        gen.manual_seed(seed)
        order = tuple(int(i) for i in torch.randperm(n, generator=gen))
        if order == tuple(range(n)):
            order = tuple(reversed(order))
        cases.append(Case("the batch permuted", order))
    return cases


class Run:
    """One call of ``fn`` on (a selection of) the batch: its outputs and input gradients."""

    def __init__(self, parts: list[tuple[str, torch.Tensor, int]]) -> None:
        self.parts = parts  # (label, tensor, batch dim)


def select_rows(x: torch.Tensor, d: int, rows: Sequence[int]) -> torch.Tensor:
    """A detached copy of ``rows`` of ``x`` along ``d``, in that order."""
    import torch

    index = torch.tensor(list(rows), dtype=torch.long, device=x.device)
    return x.detach().index_select(d, index)


def prepare(
    inputs: Sequence[object], dims: Sequence[int | None], rows: Sequence[int] | None
) -> list[object]:
    """The inputs of one run: batched ones selected (detached leaves), others as given."""
    import torch

    prepared: list[object] = []
    for x, d in zip(inputs, dims):
        if d is None:
            prepared.append(x)
            continue
        assert isinstance(x, torch.Tensor)
        y = x.detach().clone() if rows is None else select_rows(x, d, rows)
        if x.requires_grad:
            y.requires_grad_(True)
        prepared.append(y)
    return prepared


def outputs_of(result: object, out_dim: int, n: int) -> list[tuple[str, torch.Tensor]]:
    """The output tensors of one call with their paths; None leaves are skipped."""
    import torch

    found: list[tuple[str, torch.Tensor]] = []
    for path, leaf in _tree.leaves(result, "output"):
        if leaf is None:
            continue  # an absent optional output (attention weights not asked for)
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"assert_batch_invariant: {path} is a {type(leaf).__name__}, not a tensor: fn "
                "must return tensors (or containers of them) batched along out_dim"
            )
        if leaf.dim() <= out_dim or leaf.shape[out_dim] != n:
            raise ValueError(
                f"assert_batch_invariant: {path} has shape {list(leaf.shape)}, which has no "
                f"batch dimension {out_dim} of size {n}; return per-row results (a loss "
                "reduced over the batch cannot be compared row by row)"
            )
        found.append((path, leaf))
    if not found:
        raise ValueError("assert_batch_invariant: fn returned no tensor")
    return found


def upstream_grads(outputs: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Seeded random upstream gradients, one per output (``seed + i`` for output ``i``)."""
    import torch

    grads = []
    for i, out in enumerate(outputs):
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


def arguments(
    plan: Plan, rows: Sequence[int] | None, grads: list[torch.Tensor] | None
) -> tuple[list[object], list[torch.Tensor] | None]:
    """The arguments of one run and its upstream gradients (rows of the full batch's)."""
    args = prepare(plan.inputs, plan.dims, rows)
    upstream = None
    if plan.backward and grads is not None:
        upstream = grads if rows is None else [select_rows(g, plan.out_dim, rows) for g in grads]
    return args, upstream


def call(
    plan: Plan,
    rows: Sequence[int] | None,
    grads: list[torch.Tensor] | None,
    watch: Any = None,
    prepared: tuple[list[object], list[torch.Tensor] | None] | None = None,
) -> tuple[Run, list[torch.Tensor] | None]:
    """Run ``fn`` on ``rows`` of the batch (None: the whole batch) and collect its parts.

    ``grads`` are the full batch's upstream gradients; a sub-batch uses their rows.
    The whole batch draws them (seeded) when the plan asks for a backward check
    and none are given. Returns the run and the upstream gradients used (None:
    no backward). Only ``fn`` and its backward run inside ``watch`` (a context
    manager such as an op recorder); selecting the rows happens outside it,
    or before, in :func:`arguments` (``prepared``).
    """
    import contextlib

    import torch

    args, upstream = prepared if prepared is not None else arguments(plan, rows, grads)
    n = plan.n if rows is None else len(rows)
    with watch if watch is not None else contextlib.nullcontext():
        result = plan.fn(*args)
        outs = outputs_of(result, plan.out_dim, n)
        parts = [(label, t.detach(), plan.out_dim) for label, t in outs]
        if plan.backward and grads is None and rows is None:
            with torch.utils._python_dispatch._disable_current_modes():
                grads = upstream = upstream_grads([t for _, t in outs], plan.seed)
        used = None
        if upstream is not None:
            wrt = [
                (i, a, d)
                for i, (a, d) in enumerate(zip(args, plan.dims))
                if d is not None and isinstance(a, torch.Tensor) and a.requires_grad
            ]
            diff = [(t, g) for (_, t), g in zip(outs, upstream) if differentiable(t)]
            if wrt and diff:
                got = torch.autograd.grad(
                    [t for t, _ in diff],
                    [a for _, a, _ in wrt],
                    [g for _, g in diff],
                    allow_unused=True,
                )
                used = grads
                for (i, _, d), g in zip(wrt, got):
                    if g is not None:
                        parts.append((f"grad of input {i}", g, d))
    return Run(parts), used


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as integers of its element size (no copy), so NaNs and -0.0 compare by bits."""
    import torch

    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    size = t.element_size()
    if size == 1:
        return t.view(torch.uint8)
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def rows_differ(full_rows: torch.Tensor, sub: torch.Tensor, d: int) -> torch.Tensor:
    """A bool per row (along ``d``): whether the two tensors' rows differ bitwise."""
    import torch

    a = torch.movedim(full_rows.detach(), d, 0)
    b = torch.movedim(sub.detach(), d, 0)
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dim() == 1:
        return _bits(a) != _bits(b)
    if a.numel() == 0:
        return torch.zeros(a.shape[0], dtype=torch.bool, device=a.device)
    return (_bits(a) != _bits(b)).sum(dim=tuple(range(1, a.dim()))) > 0


def differences(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``(max abs, max rel)`` difference of ``a`` from the reference ``b``; NaN vs number is inf."""
    import torch

    if a.numel() == 0 or not (a.is_floating_point() or a.is_complex()):
        if torch.equal(a, b):
            return 0.0, 0.0
        diff = (a.double() - b.double()).abs()
        m = float(diff.max())
        return m, m
    x, y = (
        a.detach().to(torch.complex128 if a.is_complex() else torch.float64),
        b.detach().to(torch.complex128 if b.is_complex() else torch.float64),
    )
    diff = (x - y).abs()
    same_nan = torch.isnan(x) & torch.isnan(y)
    diff = torch.where(same_nan, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=math.inf)
    max_abs = float(diff.max())
    scale = y.abs()
    rel = torch.where(scale > 0, diff / torch.where(scale > 0, scale, torch.ones_like(scale)), diff)
    return max_abs, float(rel.max())
