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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_backends import _tree
from pytest_backends.batch.compare import HELD_BYTES, CaseResult, compare, compare_all
from pytest_backends.batch.dims import axis, check_out_dim
from pytest_backends.batch.fast import run_cases
from pytest_backends.batch.nested import flatten
from pytest_backends.batch.runs import Case, Plan, Run, call, sub_batches, sweep
from pytest_backends.batch.state import State

if TYPE_CHECKING:
    import torch

    from pytest_backends.batch.locate import Finding

__all__ = [
    "BatchInvariance",
    "BatchInvarianceError",
    "CaseResult",
    "assert_batch_invariant",
]


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
            what = f"size {size}" if size < self.batch else f"size {size} (the batch permuted)"
            lines.append(
                f"  {what}: {len(bad)} of {len(cases)} compared parts differ; "
                f"max abs {max(c.max_abs for c in cases):.3g}, "
                f"max rel {max(c.max_rel for c in cases):.3g}"
            )
        return "\n".join(lines)


# Set by the batch_invariant marker for the duration of a test's call phase.
ACTIVE_CHECK: contextvars.ContextVar[Any] = contextvars.ContextVar("batch_invariance", default=None)


def _dims(inputs: Sequence[object], dim: int | Sequence[int | None] | None) -> list[int | None]:
    import torch

    if isinstance(dim, bool) or not (dim is None or isinstance(dim, (int, list, tuple))):
        raise TypeError(
            f"assert_batch_invariant: dim must be an int, None or one entry per input, got {dim!r}"
        )
    if dim is None or isinstance(dim, int):
        dims_all: list[int | None] = [
            dim if isinstance(x, torch.Tensor) and x.dim() > 0 and dim is not None else None
            for x in inputs
        ]
        return _check_dims(inputs, dims_all)
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
    return _check_dims(inputs, dims)


def _check_dims(inputs: Sequence[object], dims: Sequence[int | None]) -> list[int | None]:
    """The batch dimensions counted from 0; raise where one is out of its input's range."""
    counted: list[int | None] = []
    for i, (x, d) in enumerate(zip(inputs, dims)):
        if d is None:
            counted.append(None)  # passed whole: any value
            continue
        rank = x.dim()  # type: ignore[attr-defined]
        k = axis(rank, d)
        if k is None:
            raise ValueError(
                f"assert_batch_invariant: dim {d} is out of range for input {i}, which has "
                f"{rank} dimension(s)"
            )
        counted.append(k)
    return counted


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
    per_sample_grads: bool = False,
) -> BatchInvariance:
    """Assert that each row of ``fn(*inputs)`` is the same whatever batch it is computed in.

    ``fn`` runs once on the whole batch of ``N`` rows and once per sub-batch:
    slices of each size in ``sizes`` (default ``(1, N // 2)``) at offsets
    0, the middle and the end (``offsets`` overrides), and, with ``permute``,
    the whole batch in a seeded random order. A slice keeps the input's own
    memory layout (strides, memory format, addresses): it is a view of the
    rows, as ``x[i:i + 1]`` is. Every output row of a sub-batch must equal,
    **bitwise**, the corresponding row of the full batch's output, and every
    output leaf must have the same path, dtype and shape (but for the batch
    dimension); integer and bool outputs are compared bitwise in every mode
    and take no part in backward. A check that compares no sub-batch smaller
    than the batch is an error.

    ``dim`` is the batch dimension of every tensor input, or one entry per
    input, with None for inputs that are not batched (parameters, masks,
    lookup tables): they are passed whole to every call, as a copy made once
    (rewritten where a run wrote it in place). A list, tuple or dict input
    holding tensors has each of them batched along its ``dim`` and is rebuilt
    for every call. Outputs are batched along ``out_dim``.

    With ``backward`` (default), where batched inputs require grad, the
    outputs are back-propagated with seeded random upstream gradients (the
    sub-batch gets the rows of the full batch's) and the input gradients,
    which are per-sample gradients, are compared row by row too. Parameter
    gradients sum over the batch, so they are not compared; with
    ``per_sample_grads=True`` (``fn`` an ``nn.Module``), each parameter's
    per-sample gradients, computed for the whole batch in one
    ``torch.func.vmap`` pass, are compared with those of each row alone (the
    rows of the size-1 sub-batches).

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
    Before every run the global RNGs, the buffers and ``training`` flags of
    the modules ``fn`` reaches (itself, its closure, its globals) and the
    input copies are put back as they were at the call, and after the check too:
    a train-mode BatchNorm's running statistics are left as found.
    """
    __tracebackhide__ = True  # a failure shows the caller's line, not this function
    session = ACTIVE_CHECK.get()
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
        raise TypeError(f"assert_batch_invariant: fn must be callable, got {_tree.shown(fn)}")
    if per_sample_grads and not backward:
        raise ValueError("assert_batch_invariant: per_sample_grads needs backward=True")
    tol = _tolerance(rtol, atol, tolerance)
    out_dim = check_out_dim(out_dim)
    flat = flatten(fn, inputs, dim) if not per_sample_grads else None
    names = None
    if flat is not None:  # a container of tensors: each tensor is an input of its own
        fn, inputs, dim, names = flat.fn, tuple(flat.leaves), flat.dim, flat.names
    dims = _dims(inputs, dim)
    n = _batch_size(inputs, dims)
    if sizes is None:
        sizes = sorted({1, n // 2})
    for name, value in (("sizes", sizes), ("offsets", offsets)):
        if (
            value is not None
            and type(value) not in (list, tuple)  # the common case, without the ABC check
            and (isinstance(value, (str, bytes)) or not isinstance(value, Iterable))
        ):
            raise TypeError(f"assert_batch_invariant: {name} must be a list of ints, got {value!r}")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"assert_batch_invariant: sizes must be positive ints, got {s!r}")
    cases = sub_batches(n, sizes, offsets, permute, seed)
    if not any(c.size < n for c in cases):
        shown = f"sizes {list(sizes)}" + (f" at offsets {list(offsets)}" if offsets else "")
        raise ValueError(
            f"assert_batch_invariant: no sub-batch fits a batch of {n} ({shown}): nothing "
            f"would be compared; give sizes below {n} and offsets from 0 to {n} - size"
        )
    plan = Plan(fn, inputs, dims, n, out_dim, backward, seed, names=names)
    result = BatchInvariance(n, tolerance=tol if isinstance(tol, tuple) else None)
    start = State(fn, plan.batched())
    try:
        full, grads = call(plan, None, None)
        if backward:
            result.backward = _backward_note(plan, grads)
        # No backward ran and no op is recorded: the common case may take one native call.
        fast = (
            run_cases(plan, full, cases, start, tol)
            if grads is None and session is None and not per_sample_grads
            else None
        )
        if fast is not None:
            result.cases.extend(fast)
        else:
            for runs in sweep(plan, cases, grads, start, HELD_BYTES):
                result.cases.extend(compare_all(full, runs, tol))
            del runs
        if per_sample_grads:
            _per_sample(plan, full, cases, grads, result, tol, start)
        findings: dict[tuple[str, str], Finding] = {}
        if session is not None:
            start.restore()
            findings = session.record(plan, cases, grads, result, start)
    finally:
        start.restore()
    failures = _failures(result, tol)
    if not failures:
        return result
    failing = failures[0]
    finding = None
    also: list[str] = []
    if session is not None:
        reported, finding, also = _unexplained(session, failures, findings)
        if reported is None:
            return result
        failing = reported
    if failing.part.startswith("per-sample"):
        from pytest_backends.batch.locate import Finding as _Finding

        finding = _Finding(
            "none",
            failing.case,
            reason="per-sample gradients come from one torch.func.vmap pass, which the "
            "op-by-op comparison does not follow",
        )
    elif failing.part.startswith("output structure"):
        finding = None
    elif locate:
        from pytest_backends.batch.explain import find_op, with_location

        case = next(c for c in cases if c.label == failing.case)
        start.restore()
        try:
            if finding is None:
                finding = find_op(plan, case, grads, failing.part)
            else:
                finding = with_location(finding, plan, case.rows, grads)
        finally:
            start.restore()
    part = full.by_label.get(failing.part)
    exact = part is not None and not (part.is_floating_point() or part.is_complex())
    raise BatchInvarianceError(
        _message(result, failing, finding, tol, also, exact),
        result=result,
        case=failing,
        finding=finding,
    )


def _per_sample(
    plan: Plan,
    full: Run,
    cases: list[Case],
    grads: list[torch.Tensor | None] | None,
    result: BatchInvariance,
    tol: tuple[float, float] | str | None,
    start: Any,
) -> None:
    from pytest_backends.batch.per_sample import per_sample_runs
    from pytest_backends.batch.runs import upstream_grads

    outputs = [t for label, t, _ in full.parts if not label.startswith("grad of")]
    upstream = grads if grads is not None else upstream_grads(outputs, plan.seed)
    rows = sorted({c.rows[0] for c in cases if c.size == 1}) or [0]
    batched, alone = per_sample_runs(plan, rows, upstream, start)
    for r, run in alone.items():
        result.cases.extend(compare(batched, run, Case(f"row {r} alone", (r,)), tol))
    result.backward += (
        "; per-sample parameter gradients compared (torch.func.vmap over the batch against "
        "each row alone)"
    )


def _backward_note(plan: Plan, grads: list[torch.Tensor | None] | None) -> str:
    import torch

    wanted = [
        x
        for x, d in zip(plan.inputs, plan.dims)
        if d is not None and isinstance(x, torch.Tensor) and x.requires_grad
    ]
    if not wanted:
        return "input gradients not checked: no batched input requires grad"
    if grads is None:
        return (
            "input gradients not checked: no output is differentiable with respect to a "
            "batched input"
        )
    return "input gradients compared (seeded random upstream gradients)"


def _failures(result: BatchInvariance, tol: tuple[float, float] | str | None) -> list[CaseResult]:
    """The compared parts that fail the check, in order."""
    failures = []
    for c in result.cases:
        if c.first_row is None:
            continue  # identical rows (a structure difference names a first row)
        if (
            c.part.startswith("output structure")  # the same or not, in every mode
            or (tol is None and not c.identical)
            or (isinstance(tol, tuple) and c.within is False)
        ):
            failures.append(c)
    return failures


def _unexplained(
    session: Any, failures: list[CaseResult], findings: dict[tuple[str, str], Finding]
) -> tuple[CaseResult | None, Finding | None, list[str]]:
    """The failure a marked test reports, its cause, and lines on new ops elsewhere.

    A failing part is explained only when every cause found in its sub-batch's
    run is an op the batch baseline accepts (or is being added); a structure
    difference and per-sample gradients never are. ``(None, None, [])``: every
    failure is explained and no op outside the baseline ran, so the test passes.
    A failing part whose own run has an op outside the baseline is reported
    first, then any other unexplained one, each with its own case's cause.
    """
    from pytest_backends.batch.explain import finding_of

    new = session.unaccepted()
    pending: list[tuple[CaseResult, Finding | None]] = []
    for c in failures:
        finding = finding_of(findings, c.case, c.part)
        if c.part.startswith(("output structure", "per-sample")) or finding is None:
            pending.append((c, finding))
            continue
        cause = next((x for x in finding.causes if not session.accepts(x)), None)
        if cause is not None:
            pending.append((c, cause))
    if not pending and not new:
        return None, None, []
    own_new = [(c, f) for c, f in pending if f is not None and f.key() in new]
    if own_new or pending:
        failing, cause = (own_new or pending)[0]
        return failing, cause, []
    # Every failure is explained by accepted ops; an op outside the baseline ran where
    # the compared rows are equal. It fails the test, and is named with its own case.
    elsewhere = next(
        (x for (_, part), f in findings.items() if part == "*" for x in f.causes if x.key() in new),
        None,
    )
    failing = failures[0]
    line = "  an op outside the batch baseline ran too: " + (
        elsewhere.describe() if elsewhere is not None else ", ".join(map(str, sorted(new)))
    )
    return failing, finding_of(findings, failing.case, failing.part), [line]


def _message(
    result: BatchInvariance,
    c: CaseResult,
    finding: Finding | None,
    tol: tuple[float, float] | str | None,
    also: Sequence[str] = (),
    exact: bool = False,
) -> str:
    size = f"a sub-batch of size {c.size} ({c.case})" if c.size < result.batch else c.case
    mode = "compared bitwise"
    if exact and isinstance(tol, tuple):
        mode = "an integer or bool output: compared bitwise, whatever the tolerance"
    elif isinstance(tol, tuple):
        mode = f"beyond rtol={tol[0]:g}, atol={tol[1]:g}"
    if c.part.startswith("output structure ("):
        lines = [
            f"assert_batch_invariant: the outputs differ in structure between the full batch "
            f"(size {result.batch}) and {size}: {c.part[len('output structure (') : -1]}"
        ]
    else:
        lines = [
            f"assert_batch_invariant: {c.part} row {c.first_row} differs between the full "
            f"batch (size {result.batch}) and {size}: max abs difference {c.max_abs:.3g}, max "
            f"rel {c.max_rel:.3g}; {c.differing} of {c.size} rows differ ({mode})"
        ]
        if c.max_abs == 0.0:
            lines.append(
                "  the values are equal; only their bits differ (a -0.0 for a 0.0, or another "
                "NaN payload or sign)"
            )
    others = [x for x in result.cases if not x.identical and x is not c]
    if others and not c.part.startswith("output structure"):
        worst = max(others, key=lambda x: x.max_abs)
        lines.append(
            f"  {len(others)} other compared part(s) differ too; worst: {worst.part} in "
            f"{worst.case} (max abs {worst.max_abs:.3g})"
        )
    if finding is not None:
        lines.append(f"  {finding.describe()}")
    lines.extend(also)
    return "\n".join(lines)
