"""Batch invariance: :func:`assert_batch_invariant`.

A function is *batch-invariant* when row ``i`` of its output is the same, bit
for bit, whether row ``i`` of its input is computed alone, in a slice of the
batch, at another position, or in the whole batch. GEMM kernels pick their
blocking (and on GPUs their split-K reduction) from the batch size, so a
``torch.mm`` row usually changes in its last bits with the number of other
rows; see the explanation page of the documentation.

This module imports torch only when the check is called.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_backends import _tree

if TYPE_CHECKING:
    import torch

    from pytest_backends.batch.locate import Finding

__all__ = [
    "BatchInvariance",
    "BatchInvarianceError",
    "CaseResult",
    "assert_batch_invariant",
]

#: Batches up to this size are checked with every row alone; larger ones at three offsets.
EVERY_ROW_UP_TO = 32


class BatchInvarianceError(AssertionError):
    """:func:`assert_batch_invariant` saw a row differ between the full batch and a sub-batch.

    ``result`` is the :class:`BatchInvariance` of the check (every case's
    figures); ``case`` the first failing case; ``finding`` the op located as
    the cause (``finding.op``, ``finding.location``), or None when the check
    was not asked to locate it.
    """

    def __init__(
        self,
        message: str,
        *,
        result: BatchInvariance,
        case: CaseResult,
        finding: Finding | None,
    ) -> None:
        super().__init__(message)
        self.result = result
        self.case = case
        self.finding = finding


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


@dataclass
class BatchInvariance:
    """The outcome of :func:`assert_batch_invariant`: figures for every case and part.

    ``max_abs`` and ``max_rel`` are the largest differences over all cases
    (0.0 when the function is batch-invariant). ``backward`` says whether
    gradients were compared, and if not, why.
    """

    batch: int
    cases: list[CaseResult] = field(default_factory=list)
    backward: str = "not requested"
    tolerance: tuple[float, float] | None = None

    @property
    def invariant(self) -> bool:
        """Whether every compared row was bitwise identical."""
        return all(c.identical for c in self.cases)

    @property
    def max_abs(self) -> float:
        """The largest absolute difference seen."""
        return max((c.max_abs for c in self.cases), default=0.0)

    @property
    def max_rel(self) -> float:
        """The largest relative difference seen (against the full batch's value)."""
        return max((c.max_rel for c in self.cases), default=0.0)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The sub-batch sizes compared."""
        return tuple(sorted({c.size for c in self.cases}))

    def describe(self) -> str:
        """One line per sub-batch size: how many cases, rows differing, max difference."""
        lines = [f"batch of {self.batch}; backward: {self.backward}"]
        for size in self.sizes:
            cases = [c for c in self.cases if c.size == size]
            bad = [c for c in cases if not c.identical]
            lines.append(
                f"  size {size}: {len(bad)} of {len(cases)} compared parts differ; "
                f"max abs {max(c.max_abs for c in cases):.3g}, "
                f"max rel {max(c.max_rel for c in cases):.3g}"
            )
        return "\n".join(lines)


# Set by the batch_invariant marker for the duration of a test's call phase.
_SESSION: contextvars.ContextVar[Any] = contextvars.ContextVar("batch_invariance", default=None)


@dataclass(frozen=True)
class _Case:
    label: str
    rows: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.rows)


def _cases(
    n: int, sizes: Sequence[int], offsets: Sequence[int] | None, permute: bool, seed: int
) -> list[_Case]:
    import torch

    cases: list[_Case] = []
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
            cases.append(_Case(label, rows))
    if permute and n > 1:
        gen = torch.Generator()
        gen.manual_seed(seed)
        order = tuple(int(i) for i in torch.randperm(n, generator=gen))
        if order == tuple(range(n)):
            order = tuple(reversed(order))
        cases.append(_Case("the batch permuted", order))
    return cases


def _dims(inputs: Sequence[object], dim: int | Sequence[int | None] | None) -> list[int | None]:
    import torch

    if dim is None or isinstance(dim, int):
        return [
            dim if isinstance(x, torch.Tensor) and x.dim() > 0 and dim is not None else None
            for x in inputs
        ]
    dims = list(dim)
    if len(dims) != len(inputs):
        raise ValueError(
            f"assert_batch_invariant: dim gives {len(dims)} entries for {len(inputs)} inputs; "
            "give one per input (None for an input that is not batched)"
        )
    for i, (x, d) in enumerate(zip(inputs, dims)):
        if d is None:
            continue
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"assert_batch_invariant: dim[{i}] must be an int or None, got {d!r}")
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise TypeError(
                f"assert_batch_invariant: input {i} ({type(x).__name__}) has no dimension "
                f"{d} to batch over; give dim=None for it"
            )
    return dims


def _batch_size(inputs: Sequence[object], dims: Sequence[int | None]) -> int:
    sizes = {i: x.shape[d] for i, (x, d) in enumerate(zip(inputs, dims)) if d is not None}  # type: ignore[attr-defined]
    if not sizes:
        raise ValueError(
            "assert_batch_invariant: no input is batched (every dim is None); give the batch "
            "dimension of at least one tensor input"
        )
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"input {i}: {n}" for i, n in sizes.items())
        raise ValueError(
            f"assert_batch_invariant: the batched inputs disagree on the batch size ({shown})"
        )
    n = next(iter(sizes.values()))
    if n < 2:
        raise ValueError(
            f"assert_batch_invariant: the batch has {n} row(s); it needs at least 2 to compare "
            "a row alone with the row in a batch"
        )
    return int(n)


def _tolerance(
    rtol: float | None, atol: float | None, tolerance: object
) -> tuple[float, float] | str | None:
    if tolerance is not None:
        if rtol is not None or atol is not None:
            raise TypeError("assert_batch_invariant: give tolerance= or rtol/atol, not both")
        if tolerance == "report":
            return "report"
        try:
            pair: tuple[Any, ...] = tuple(tolerance)  # type: ignore[arg-type]
            if len(pair) != 2:
                raise ValueError
            return float(pair[0]), float(pair[1])
        except (TypeError, ValueError):
            raise TypeError(
                "assert_batch_invariant: tolerance must be (rtol, atol), a Tolerance or "
                f"'report', got {tolerance!r}"
            ) from None
    if rtol is None and atol is None:
        return None
    return (float(rtol or 0.0), float(atol or 0.0))


class _Run:
    """One call of ``fn`` on (a selection of) the batch: its outputs and input gradients."""

    def __init__(self, parts: list[tuple[str, torch.Tensor, int]]) -> None:
        self.parts = parts  # (label, tensor, batch dim)


def _select(x: torch.Tensor, d: int, rows: Sequence[int]) -> torch.Tensor:
    import torch

    index = torch.tensor(list(rows), dtype=torch.long, device=x.device)
    return x.detach().index_select(d, index)


def _prepare(
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
        y = x.detach().clone() if rows is None else _select(x, d, rows)
        if x.requires_grad:
            y.requires_grad_(True)
        prepared.append(y)
    return prepared


def _outputs(result: object, out_dim: int, n: int) -> list[tuple[str, torch.Tensor]]:
    import torch

    found: list[tuple[str, torch.Tensor]] = []
    for path, leaf in _tree.leaves(result, "output"):
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


def _upstream(outputs: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    import torch

    grads = []
    for i, out in enumerate(outputs):
        gen = torch.Generator(device=out.device)
        gen.manual_seed(seed + i)
        grads.append(torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=gen))
    return grads


def _differentiable(t: torch.Tensor) -> bool:
    return bool(t.requires_grad and (t.is_floating_point() or t.is_complex()))


@dataclass
class _Plan:
    fn: Callable[..., object]
    inputs: Sequence[object]
    dims: list[int | None]
    n: int
    out_dim: int
    backward: bool
    seed: int


def _arguments(
    plan: _Plan, rows: Sequence[int] | None, grads: list[torch.Tensor] | None
) -> tuple[list[object], list[torch.Tensor] | None]:
    """The arguments of one run and its upstream gradients (rows of the full batch's)."""
    args = _prepare(plan.inputs, plan.dims, rows)
    upstream = None
    if plan.backward and grads is not None:
        upstream = grads if rows is None else [_select(g, plan.out_dim, rows) for g in grads]
    return args, upstream


def _call(
    plan: _Plan,
    rows: Sequence[int] | None,
    grads: list[torch.Tensor] | None,
    watch: Any = None,
    prepared: tuple[list[object], list[torch.Tensor] | None] | None = None,
) -> tuple[_Run, list[torch.Tensor] | None]:
    """Run ``fn`` on ``rows`` of the batch (None: the whole batch) and collect its parts.

    ``grads`` are the full batch's upstream gradients; a sub-batch uses their rows.
    The whole batch draws them (seeded) when the plan asks for a backward check
    and none are given. Returns the run and the upstream gradients used (None:
    no backward). Only ``fn`` and its backward run inside ``watch`` (a context
    manager such as an op recorder); selecting the rows happens outside it,
    or before, in :func:`_arguments` (``prepared``).
    """
    import contextlib

    import torch

    args, upstream = prepared if prepared is not None else _arguments(plan, rows, grads)
    n = plan.n if rows is None else len(rows)
    with watch if watch is not None else contextlib.nullcontext():
        result = plan.fn(*args)
        outs = _outputs(result, plan.out_dim, n)
        parts = [(label, t.detach(), plan.out_dim) for label, t in outs]
        if plan.backward and grads is None and rows is None:
            with torch.utils._python_dispatch._disable_current_modes():
                grads = upstream = _upstream([t for _, t in outs], plan.seed)
        used = None
        if upstream is not None:
            wrt = [
                (i, a, d)
                for i, (a, d) in enumerate(zip(args, plan.dims))
                if d is not None and isinstance(a, torch.Tensor) and a.requires_grad
            ]
            diff = [(t, g) for (_, t), g in zip(outs, upstream) if _differentiable(t)]
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
    return _Run(parts), used


def _bits(t: torch.Tensor) -> torch.Tensor:
    import torch

    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view(torch.uint8) if flat.element_size() == 1 else flat.view(_int_of(flat))


def _int_of(t: torch.Tensor) -> torch.dtype:
    import torch

    return {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[t.element_size()]


def rows_differ(full_rows: torch.Tensor, sub: torch.Tensor, d: int) -> torch.Tensor:
    """A bool per row (along ``d``): whether the two tensors' rows differ bitwise."""
    import torch

    a = torch.movedim(full_rows.detach(), d, 0).contiguous()
    b = torch.movedim(sub.detach(), d, 0).contiguous()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    rows = a.shape[0]
    if a.numel() == 0:
        return torch.zeros(rows, dtype=torch.bool, device=a.device)
    return (_bits(a) != _bits(b)).reshape(rows, -1).any(dim=1)


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
    same_nan = torch.isnan(x) & torch.isnan(y) if not x.is_complex() else torch.isnan(diff) & False
    diff = torch.where(same_nan, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=math.inf)
    max_abs = float(diff.max())
    scale = y.abs()
    rel = torch.where(scale > 0, diff / torch.where(scale > 0, scale, torch.ones_like(scale)), diff)
    return max_abs, float(rel.max())


def _within(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    import torch

    if not (a.is_floating_point() or a.is_complex()):
        return bool(torch.equal(a, b))
    return bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all())


def _compare(
    full: _Run, sub: _Run, case: _Case, tol: tuple[float, float] | str | None
) -> list[CaseResult]:
    import torch

    results: list[CaseResult] = []
    full_parts = {label: (t, d) for label, t, d in full.parts}
    for label, t, d in sub.parts:
        if label not in full_parts:
            continue
        ref, _ = full_parts[label]
        index = torch.tensor(case.rows, dtype=torch.long, device=ref.device)
        ref_rows = ref.index_select(d, index)
        if ref_rows.shape != t.shape or ref_rows.dtype != t.dtype:
            raise AssertionError(
                f"assert_batch_invariant: {label} of {case.label} has shape "
                f"{list(t.shape)} ({t.dtype}), but the full batch's rows have "
                f"{list(ref_rows.shape)} ({ref_rows.dtype})"
            )
        differ = rows_differ(ref_rows, t, d).cpu().tolist()
        bad = [case.rows[j] for j, x in enumerate(differ) if x]
        max_abs, max_rel = differences(t, ref_rows) if bad else (0.0, 0.0)
        within = None
        if isinstance(tol, tuple):
            within = True if not bad else _within(t, ref_rows, tol[0], tol[1])
        results.append(
            CaseResult(
                case.label,
                case.size,
                case.rows,
                label,
                bad[0] if bad else None,
                len(bad),
                max_abs,
                max_rel,
                within,
            )
        )
    return results


def assert_batch_invariant(
    fn: Callable[..., object],
    *inputs: Any,
    dim: int | Sequence[int | None] | None = 0,
    sizes: Sequence[int] | None = None,
    offsets: Sequence[int] | None = None,
    permute: bool = True,
    backward: bool = True,
    out_dim: int = 0,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    tolerance: object = None,
    locate: bool = True,
) -> BatchInvariance:
    """Assert that each row of ``fn(*inputs)`` is the same whatever batch it is computed in.

    ``fn`` runs once on the whole batch of ``N`` rows and once per sub-batch:
    slices of each size in ``sizes`` (default ``(1, 2, N // 2)``) at offsets
    0, the middle and the end (each row alone when ``N <= 32``; ``offsets``
    overrides), and, with ``permute``, the whole batch in a seeded random
    order. Every output row of a sub-batch must equal, **bitwise**, the
    corresponding row of the full batch's output.

    ``dim`` is the batch dimension of every tensor input, or one entry per
    input, with None for inputs that are not batched (parameters, masks,
    lookup tables): they are passed unchanged to every call. Outputs are
    batched along ``out_dim``.

    With ``backward`` (default), where batched inputs require grad, the
    outputs are back-propagated with seeded random upstream gradients (the
    sub-batch gets the rows of the full batch's) and the input gradients,
    which are per-sample gradients, are compared row by row too. Parameter
    gradients sum over the batch, so they are not compared.

    ``rtol``/``atol`` or ``tolerance=(rtol, atol)`` (a
    :class:`~pytest_backends.tolerance.Tolerance` works) switch to tolerance
    mode: the check fails only where ``|sub - full| > atol + rtol * |full|``;
    ``tolerance="report"`` never fails. Either way the returned
    :class:`BatchInvariance` says how far from invariant ``fn`` is
    (``max_abs``, ``max_rel``, per case).

    On failure, raises :class:`BatchInvarianceError` (an ``AssertionError``)
    naming the output or gradient, the first differing row, the sub-batch and
    the max difference; with ``locate`` (default) the ops of both runs are
    recorded once more and the first op whose output rows differ for
    identical input rows is named, with its source line and module path.
    The global RNGs are reset to the call's state before every run.
    """
    from pytest_backends.determinism.api import RngState

    session = _SESSION.get()
    if session is not None:
        overrides = session.defaults(
            sizes=sizes, rtol=rtol, atol=atol, tolerance=tolerance, permute=permute
        )
        sizes, rtol, atol, tolerance, permute = (
            overrides["sizes"],
            overrides["rtol"],
            overrides["atol"],
            overrides["tolerance"],
            overrides["permute"],
        )
    if not callable(fn):
        raise TypeError(f"assert_batch_invariant: fn must be callable, got {fn!r}")
    tol = _tolerance(rtol, atol, tolerance)
    dims = _dims(inputs, dim)
    n = _batch_size(inputs, dims)
    if sizes is None:
        sizes = sorted({1, 2, n // 2})
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"assert_batch_invariant: sizes must be positive ints, got {s!r}")
    cases = _cases(n, sizes, offsets, permute, seed)
    plan = _Plan(fn, inputs, dims, n, out_dim, backward, seed)
    result = BatchInvariance(n, tolerance=tol if isinstance(tol, tuple) else None)
    start = RngState.capture()
    try:
        start.restore()
        full, grads = _call(plan, None, None)
        if backward:
            result.backward = _backward_note(plan, grads)
        for case in cases:
            start.restore()
            sub, _ = _call(plan, case.rows, grads)
            result.cases.extend(_compare(full, sub, case, tol))
        if session is not None:
            session.record(plan, cases, grads, result, start)
    finally:
        start.restore()
    failing = _first_failure(result, tol)
    if failing is not None:
        finding = None
        if locate:
            from pytest_backends.batch.locate import find_op

            case = next(c for c in cases if c.label == failing.case)
            start.restore()
            try:
                finding = find_op(plan, case, grads, failing.part)
            finally:
                start.restore()
        if session is not None and session.accepts(finding):
            return result
        raise BatchInvarianceError(
            _message(result, failing, finding, tol), result=result, case=failing, finding=finding
        )
    return result


def _backward_note(plan: _Plan, grads: list[torch.Tensor] | None) -> str:
    import torch

    wanted = [
        x
        for x, d in zip(plan.inputs, plan.dims)
        if d is not None and isinstance(x, torch.Tensor) and x.requires_grad
    ]
    if not wanted:
        return "not checked: no batched input requires grad"
    if grads is None:
        return "not checked: no output is differentiable with respect to a batched input"
    return "input gradients compared (seeded random upstream gradients)"


def _first_failure(
    result: BatchInvariance, tol: tuple[float, float] | str | None
) -> CaseResult | None:
    for c in result.cases:
        if tol is None and not c.identical:
            return c
        if isinstance(tol, tuple) and c.within is False:
            return c
    return None


def _message(
    result: BatchInvariance,
    c: CaseResult,
    finding: Finding | None,
    tol: tuple[float, float] | str | None,
) -> str:
    size = f"a sub-batch of size {c.size} ({c.case})" if c.size < result.batch else c.case
    mode = "compared bitwise"
    if isinstance(tol, tuple):
        mode = f"beyond rtol={tol[0]:g}, atol={tol[1]:g}"
    lines = [
        f"assert_batch_invariant: {c.part} row {c.first_row} differs between the full batch "
        f"(size {result.batch}) and {size}: max abs difference {c.max_abs:.3g}, max rel "
        f"{c.max_rel:.3g}; {c.differing} of {c.size} rows differ ({mode})"
    ]
    others = [x for x in result.cases if not x.identical and x is not c]
    if others:
        worst = max(others, key=lambda x: x.max_abs)
        lines.append(
            f"  {len(others)} other compared part(s) differ too; worst: {worst.part} in "
            f"{worst.case} (max abs {worst.max_abs:.3g})"
        )
    if finding is not None:
        lines.append(f"  {finding.describe()}")
    return "\n".join(lines)
