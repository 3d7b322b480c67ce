"""Reproducibility checks: :func:`assert_reproducible` and :func:`expect_nondeterministic_alert`.

Both import torch only when called, so importing this module is cheap.
Outputs and gradients are compared through 128-bit digests
(:mod:`pytest_backends.determinism.digest`) computed on the tensors' own device; the
digests of all runs are copied to the host once, at the end.
"""

from __future__ import annotations

import random
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_backends import _tree
from pytest_backends.determinism import DEFAULT_RUNS

if TYPE_CHECKING:
    import torch

__all__ = [
    "ALERT_TEXT",
    "DEFAULT_RUNS",
    "AlertExpectationError",
    "DeterminismError",
    "NondeterministicOpError",
    "NotReproducibleError",
    "RngState",
    "assert_reproducible",
    "expect_nondeterministic_alert",
]


#: The text of torch's error (or warning, with ``warn_only=True``) for an op
#: that has no deterministic implementation under
#: ``torch.use_deterministic_algorithms(True)``.
ALERT_TEXT = "does not have a deterministic implementation"


class DeterminismError(AssertionError):
    """Base class of the determinism harness's failures (an ``AssertionError``)."""


class NotReproducibleError(DeterminismError):
    """:func:`assert_reproducible` saw an output or gradient differ between runs.

    ``what`` names it (``"output[0]"``, ``"grad of parameter 'fc.weight'"``),
    ``run`` is the first run (0-based) that differed from run 0.
    """

    def __init__(self, message: str, *, what: str, run: int, runs: int) -> None:
        super().__init__(message)
        self.what = what
        self.run = run
        self.runs = runs


class NondeterministicOpError(DeterminismError):
    """A test marked for the determinism check gave different results between runs.

    ``op`` is the first divergent op (``"aten::index_add_"``), ``run`` the run
    (0-based) that differed from run 0, ``output_index`` the op's output that
    differed and ``op_index`` the op's position in the run's op sequence.
    ``op`` is None when no single op can be blamed (the runs' inputs already
    differed, or their op sequences did).
    """

    def __init__(
        self,
        message: str,
        *,
        op: str | None,
        run: int,
        output_index: int | None,
        op_index: int,
    ) -> None:
        super().__init__(message)
        self.op = op
        self.run = run
        self.output_index = output_index
        self.op_index = op_index


class AlertExpectationError(DeterminismError):
    """:func:`expect_nondeterministic_alert` did not see the expected behaviour."""


@dataclass
class RngState:
    """The state of torch's (CPU and initialised CUDA), Python's and NumPy's global RNGs.

    :meth:`restore` puts every generator back to the captured state, so runs
    started from the same :class:`RngState` draw the same random numbers.
    NumPy is included only when the test process has already imported it.
    """

    torch_cpu: Any
    torch_cuda: Any
    python: Any
    numpy: Any

    @classmethod
    def capture(cls) -> RngState:
        """The current state of every generator."""
        import torch

        initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        cuda = torch.cuda.get_rng_state_all() if initialized else None
        np = sys.modules.get("numpy")
        np_state = np.random.get_state() if np is not None else None
        return cls(torch.get_rng_state(), cuda, random.getstate(), np_state)

    def restore(self) -> None:
        """Put every generator back to the captured state."""
        import torch

        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)


def _seed_all(seed: int) -> None:
    """Seed torch's CPU and CUDA generators, :mod:`random` and NumPy (if imported).

    Cheaper than ``torch.manual_seed``, which records a traceback for every
    lazily seeded device type (about 0.1 ms a call).
    """
    import torch

    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


# --- flattening ------------------------------------------------------------


_NUMBERS = (bool, int, float, complex)
# Values compared by equality of their repr: not numbers, but stable and common in outputs.
_PLAIN_VALUES = (str, bytes, type(None))


def _flatten(value: object, label: str, out: list[tuple[str, object]], strict: bool = True) -> None:
    """Collect ``(label, leaf)`` for every comparable leaf of nested containers.

    Leaves are tensors, NumPy arrays and scalars, Python numbers, strings and
    None; containers are those of :mod:`pytest_backends._tree` (lists, tuples,
    named tuples and dataclasses by field, dicts). With ``strict``, any other
    leaf raises a TypeError naming its type and path: a value that cannot be
    compared must not pass silently. Without it (walking arguments), other
    values are skipped.
    """
    import torch

    np = sys.modules.get("numpy")
    for path, leaf in _tree.leaves(value, label):
        if isinstance(leaf, torch.Tensor):
            if strict:
                _check_tensor(leaf, path)
            out.append((path, leaf))
        elif np is not None and isinstance(leaf, (np.ndarray, np.generic)):
            if strict:
                out.append((path, _numpy_tensor(np, leaf, path)))
        elif isinstance(leaf, (*_NUMBERS, *_PLAIN_VALUES)):
            out.append((path, leaf))
        elif strict:
            raise TypeError(
                f"assert_reproducible: cannot compare {path} of type {type(leaf).__qualname__}: "
                "return tensors, NumPy arrays, Python numbers, or lists, tuples, dicts, named "
                "tuples and dataclasses of them (convert a set to a sorted list, consume a "
                "generator into a list)"
            )


def _check_tensor(t: torch.Tensor, label: str) -> None:
    import torch

    if t.is_nested:
        raise TypeError(
            f"assert_reproducible: {label} is a nested tensor, which cannot be digested; "
            "return its components (t.unbind()) or a padded tensor (t.to_padded_tensor(0))"
        )
    if t.layout != torch.strided and _sparse_parts(t) is None:
        raise TypeError(
            f"assert_reproducible: {label} has layout {t.layout}, which cannot be digested; "
            "return t.to_dense() instead"
        )
    if t.is_quantized:
        raise TypeError(
            f"assert_reproducible: {label} is a quantized tensor; return t.int_repr() "
            "(and its scale and zero point) instead"
        )
    if t.is_meta:
        raise TypeError(f"assert_reproducible: {label} is a meta tensor and holds no data")


def _sparse_parts(t: torch.Tensor) -> list[torch.Tensor] | None:
    """The tensors a sparse ``t`` is stored as, then its layout and size; None if not sparse.

    A sparse tensor (an output, or the gradient of ``nn.Embedding(sparse=True)``)
    is compared by these, bitwise: by its stored form, so an uncoalesced
    tensor's entries are compared in the order they are stored.
    """
    import torch

    layout = t.layout
    if layout == torch.sparse_coo:
        parts = [t._indices(), t._values()]
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = [t.crow_indices(), t.col_indices(), t.values()]
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = [t.ccol_indices(), t.row_indices(), t.values()]
    else:
        return None
    form = [_SPARSE_LAYOUTS.index(str(layout)), *t.shape]
    return [*parts, torch.tensor(form, dtype=torch.int64, device=t.device)]


_SPARSE_LAYOUTS = [f"torch.sparse_{name}" for name in ("coo", "csr", "csc", "bsr", "bsc")]


def _numpy_tensor(np: Any, value: Any, label: str) -> torch.Tensor:
    import torch

    array = np.ascontiguousarray(value)
    try:
        return torch.from_numpy(array)
    except TypeError:
        raise TypeError(
            f"assert_reproducible: cannot compare {label}, a NumPy array of dtype "
            f"{array.dtype}: only numeric and bool arrays are compared"
        ) from None


def _output_leaves(value: object) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    _flatten(value, "output", out)
    return out


def _grad_targets(
    fn: Callable[..., object], args: Sequence[object], kwargs: Mapping[str, object]
) -> list[tuple[str, torch.Tensor]]:
    """Leaf tensors that require grad: tensor arguments, then the module's parameters."""
    import torch

    leaves: list[tuple[str, object]] = []
    _flatten(list(args), "args", leaves, strict=False)
    _flatten(dict(kwargs), "kwargs", leaves, strict=False)
    seen: set[int] = set()
    targets: list[tuple[str, torch.Tensor]] = []
    for label, leaf in leaves:
        if (
            isinstance(leaf, torch.Tensor)
            and leaf.is_leaf
            and leaf.requires_grad
            and id(leaf) not in seen
        ):
            seen.add(id(leaf))
            targets.append((f"grad of {label}", leaf))
    module = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if isinstance(module, torch.nn.Module):
        for name, param in module.named_parameters():
            if param.requires_grad and id(param) not in seen:
                seen.add(id(param))
                targets.append((f"grad of parameter {name!r}", param))
    return targets


def _graph_leaves(
    outputs: Sequence[torch.Tensor], known: Sequence[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """Leaf tensors in the autograd graph of ``outputs`` that are not in ``known``."""
    seen_tensors = {id(t) for _, t in known}
    found: list[tuple[str, torch.Tensor]] = []

    def add(t: torch.Tensor) -> None:
        if id(t) not in seen_tensors:
            seen_tensors.add(id(t))
            dtype = str(t.dtype).replace("torch.", "", 1)
            found.append((f"grad of leaf #{len(found)} ({dtype}{list(t.shape)})", t))

    stack: list[Any] = []
    for out in outputs:
        if out.grad_fn is None:
            if out.is_leaf and out.requires_grad:
                add(out)
        else:
            stack.append(out.grad_fn)
    seen_nodes: set[int] = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf
        if variable is not None:
            add(variable)
        stack.extend(reversed([next_fn for next_fn, _ in node.next_functions]))
    return found


# --- digests ----------------------------------------------------------------


class _Digests:
    """Digests of one run, kept on device until :func:`_to_host` resolves them."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self.values: list[object] = []

    def add(self, label: str, value: object) -> None:
        import torch

        from pytest_backends.determinism.digest import digest

        self.labels.append(label)
        parts = _sparse_parts(value) if isinstance(value, torch.Tensor) else None
        if parts is not None:  # one digest of its parts' digests
            self.values.append(digest(torch.stack([digest(p.detach()) for p in parts])))
        elif isinstance(value, torch.Tensor):
            self.values.append(digest(value))
        elif isinstance(value, float):
            self.values.append(("float", value.hex()))
        else:
            self.values.append((type(value).__name__, repr(value)))


def _to_host(runs: list[_Digests]) -> list[list[object]]:
    """Replace each run's digest tensors by host tuples, with one transfer per device."""
    import torch

    by_device: dict[torch.device, list[tuple[int, int]]] = {}
    for r, run in enumerate(runs):
        for i, value in enumerate(run.values):
            if isinstance(value, torch.Tensor):
                by_device.setdefault(value.device, []).append((r, i))
    resolved = [list(run.values) for run in runs]
    for positions in by_device.values():
        stacked = torch.stack([runs[r].values[i] for r, i in positions])  # type: ignore[misc]
        for (r, i), row in zip(positions, stacked.cpu().tolist()):
            resolved[r][i] = tuple(row)
    return resolved


# --- assert_reproducible ------------------------------------------------------


def _upstream_grads(outputs: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Seeded random upstream gradients, one per output (same values for the same seed)."""
    import torch

    generators: dict[torch.device, torch.Generator] = {}
    grads: list[torch.Tensor] = []
    for out in outputs:
        gen = generators.get(out.device)
        if gen is None:
            gen = torch.Generator(device=out.device)
            gen.manual_seed(seed)
            generators[out.device] = gen
        grads.append(torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=gen))
    return grads


def _differentiable(value: object) -> bool:
    import torch

    return (
        isinstance(value, torch.Tensor)
        and value.requires_grad
        and (value.is_floating_point() or value.is_complex())
    )


def assert_reproducible(
    fn: Callable[..., object],
    *args: Any,
    runs: int = DEFAULT_RUNS,
    backward: bool = True,
    seed: int | None = 0,
    **kwargs: Any,
) -> None:
    """Run ``fn(*args, **kwargs)`` ``runs`` times and assert bitwise-identical results.

    Before every run the global RNGs (torch CPU and CUDA, :mod:`random`, and
    NumPy if imported) are seeded with ``seed``; with ``seed=None`` they are
    instead reset to the state they had when ``assert_reproducible`` was
    called. Afterwards they are put back to that state either way.

    Every leaf of the output is compared: tensors and NumPy arrays bitwise
    (through their digests), Python numbers, strings and None by value, nested
    in lists, tuples, named tuples, dicts and dataclasses. Any other value (a
    set, a generator, an arbitrary object) raises TypeError naming its type and
    its path (``output[1].state``), as do nested, quantized and meta tensors
    and layouts other than strided and sparse, which cannot be digested. A
    sparse tensor (COO, CSR, CSC, BSR, BSC; also a sparse gradient, such as
    ``nn.Embedding(sparse=True)``'s) is compared by its stored indices and
    values, its layout and its size. With ``backward=True``, the outputs that
    require grad are back-propagated with **seeded random** upstream
    gradients (the same in every run; not ``.sum()``, whose all-ones gradient
    hides order-dependent reductions), and the gradients of the tensor
    arguments that require grad, of ``fn``'s parameters (when ``fn`` is an
    ``nn.Module`` or a method of one) and of every other leaf the outputs'
    autograd graph reaches in run 0 (e.g. a model captured by a closure) are
    digested too. Their ``.grad`` is cleared before each run and put back
    afterwards.

    Raises :class:`NotReproducibleError` (an ``AssertionError``) naming the
    first output or gradient that differed and the first run that differed
    from run 0. ``fn`` runs under whatever flags are active: wrap the call
    in ``override_flags({"deterministic_algorithms": True})`` to check the
    deterministic kernels.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the message
    import torch

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"assert_reproducible: runs must be an int >= 2, got {runs!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"assert_reproducible: seed must be an int or None, got {seed!r}")
    targets = _grad_targets(fn, args, kwargs) if backward else []
    saved_grads = [t.grad for _, t in targets]
    start = RngState.capture()
    grad_seed = 0 if seed is None else seed
    cached_grads: list[torch.Tensor] | None = None
    digests: list[_Digests] = []
    try:
        for _ in range(runs):
            for _, t in targets:
                t.grad = None
            if seed is None:
                start.restore()
            else:
                _seed_all(seed)
            result = fn(*args, **kwargs)
            run = _Digests()
            leaves = _output_leaves(result)
            for label, leaf in leaves:
                run.add(label, leaf)
            if backward:
                diff = [leaf for _, leaf in leaves if _differentiable(leaf)]
                if diff:
                    tensors: list[torch.Tensor] = diff  # type: ignore[assignment]
                    if not digests:
                        # Leaves fn reaches without naming them (a model captured by a
                        # closure): found once, in run 0, before their grads change.
                        for label, t in _graph_leaves(tensors, targets):
                            targets.append((label, t))
                            saved_grads.append(t.grad)
                            t.grad = None
                    if cached_grads is None or [
                        (g.shape, g.dtype, g.device) for g in cached_grads
                    ] != [(t.shape, t.dtype, t.device) for t in tensors]:
                        cached_grads = _upstream_grads(tensors, grad_seed)
                    torch.autograd.backward(tensors, cached_grads)
                for label, t in targets:
                    run.add(label, t.grad)
            del result, leaves
            digests.append(run)
    finally:
        for (_, t), grad in zip(targets, saved_grads):
            t.grad = grad
        start.restore()
    _check_runs(digests, runs, seed)


def _check_runs(digests: list[_Digests], runs: int, seed: int | None) -> None:
    __tracebackhide__ = True
    host = _to_host(digests)
    reference_labels = digests[0].labels
    for r in range(1, runs):
        labels = digests[r].labels
        if labels != reference_labels:
            raise NotReproducibleError(
                f"assert_reproducible: run {r} returned a different structure than run 0 "
                f"(run 0: {', '.join(reference_labels) or 'nothing'}; "
                f"run {r}: {', '.join(labels) or 'nothing'})",
                what="output structure",
                run=r,
                runs=runs,
            )
        differing = [label for label, a, b in zip(labels, host[0], host[r]) if a != b]
        if differing:
            first = differing[0]
            also = ""
            if differing[1:]:
                also = f"; also differing in run {r}: {', '.join(differing[1:])}"
            seeded = f"seeded with {seed}" if seed is not None else "reset to the call's state"
            raise NotReproducibleError(
                f"assert_reproducible: {first} differs between run 0 and run {r} "
                f"({runs} runs, RNGs {seeded}; compared bitwise){also}",
                what=first,
                run=r,
                runs=runs,
            )


# --- expect_nondeterministic_alert ---------------------------------------------


def _alert_warnings(caught: Sequence[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if ALERT_TEXT in str(w.message)]


def _call_raising(fn: Callable[[], object], should_alert: bool) -> None:
    __tracebackhide__ = True
    from pytest_backends.flags import override_flags

    mode = "torch.use_deterministic_algorithms(True)"
    with override_flags(
        {"deterministic_algorithms": True, "deterministic_algorithms.warn_only": False}
    ):
        try:
            fn()
        except RuntimeError as exc:
            if ALERT_TEXT not in str(exc):
                raise
            if not should_alert:
                raise AlertExpectationError(
                    f"expected no nondeterministic-op alert under {mode}, but fn raised: {exc}"
                ) from exc
            return
    if should_alert:
        raise AlertExpectationError(
            f"expected fn to raise the {ALERT_TEXT!r} RuntimeError under {mode}, "
            "but it returned normally"
        )


def _call_warning(fn: Callable[[], object], should_alert: bool) -> None:
    __tracebackhide__ = True
    from pytest_backends.flags import override_flags

    mode = "torch.use_deterministic_algorithms(True, warn_only=True)"
    with (
        override_flags(
            {"deterministic_algorithms": True, "deterministic_algorithms.warn_only": True}
        ),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        try:
            fn()
        except RuntimeError as exc:
            if ALERT_TEXT in str(exc):
                raise AlertExpectationError(
                    f"expected only a warning under {mode}, but fn raised: {exc}"
                ) from exc
            raise
    alerts = _alert_warnings(caught)
    for w in caught:
        if ALERT_TEXT not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if should_alert and not alerts:
        raise AlertExpectationError(
            f"expected fn to warn {ALERT_TEXT!r} under {mode}, but it gave no such warning"
        )
    if not should_alert and alerts:
        raise AlertExpectationError(
            f"expected no nondeterministic-op alert under {mode}, but fn warned: {alerts[0]}"
        )


def expect_nondeterministic_alert(fn: Callable[[], object], should_alert: bool = True) -> None:
    """Check how ``fn()`` behaves under ``torch.use_deterministic_algorithms``.

    ``fn`` is called twice: once with deterministic mode on, where it must
    raise torch's ``RuntimeError`` "... does not have a deterministic
    implementation" (the error is caught), and once with ``warn_only=True``,
    where it must complete and emit that warning. With ``should_alert=False``
    it must do neither, in both modes. Other exceptions propagate. All flags
    are restored afterwards.

    Raises :class:`AlertExpectationError` (an ``AssertionError``) naming the
    mode in which the expectation failed.
    """
    __tracebackhide__ = True
    if not callable(fn):
        raise TypeError(
            f"expect_nondeterministic_alert: fn must be callable, got {_tree.shown(fn)}"
        )
    _call_raising(fn, should_alert)
    _call_warning(fn, should_alert)
