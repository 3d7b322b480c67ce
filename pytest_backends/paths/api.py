"""``assert_paths_agree``: run a function under several configurations and name where they part.

Each configuration runs ``fn`` (and its backward) in this process, with its
flags set and restored, under a recorder that keeps every op's inputs and
outputs.  Outputs and gradients are compared with the reference
configuration's within the tolerance model's bound.  When one differs, the
recorded ops are aligned by identity and each op whose result differs beyond
its own bound is replayed on the reference's inputs under the other
configuration: the first op whose replay still differs is where the paths
part.  An op that differs only because its inputs did is never blamed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pytest_backends import _tree
from pytest_backends.paths.bounds import Bound, pair_bound, reduction_length, term_scale
from pytest_backends.paths.branches import path_difference
from pytest_backends.paths.record import OpRecord, PathRecorder, module_tracking
from pytest_backends.paths.results import Identity, results_of, same_value
from pytest_backends.paths.start import StartState

__all__ = [
    "Divergence",
    "PathsAgreement",
    "PathsDisagreeError",
    "assert_paths_agree",
    "first_divergence",
]

SEED = 20240611


class PathsDisagreeError(AssertionError):
    """Two configurations' results differ beyond the model's bound.

    ``divergence`` is the op where the paths part (``None`` when no single op
    does: the difference built up from ops each within its bound);
    ``not_compared`` as in :class:`PathsAgreement`.
    """

    def __init__(
        self, message: str, divergence: Divergence | None, not_compared: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.divergence = divergence
        self.not_compared = not_compared


@dataclass(frozen=True)
class PathsAgreement:
    """What :func:`assert_paths_agree` compared, when every configuration agrees.

    ``not_compared`` names each result leaf left out, as ``"output 1
    (torch._C.Generator)"``: its path and type, a type with identity
    equality only (each run returns a new object: not a numeric result).
    """

    reference: str
    others: tuple[str, ...]
    not_compared: tuple[str, ...]


@dataclass(frozen=True)
class Divergence:
    """The first op where two configurations' paths part."""

    op: str
    site: str
    module: str
    occurrence: int
    reference: str
    other: str
    max_abs: float
    max_rel: float
    bound: Bound
    inputs_agreed: bool

    def summary(self) -> str:
        """One line: ``the paths part at aten::X (file:line, module M): ...``."""
        module = self.module or "<no module>"
        return (
            f"the paths part at {self.op} ({self.site}, module {module}): max rel error "
            f"{self.max_rel:.3g} (max abs {self.max_abs:.3g}), bound {self.bound.atol:.3g} + "
            f"{self.bound.rtol:.3g}*|x| ({self.reference} vs {self.other})"
        )

    def describe(self) -> str:
        """The summary, where the op ran and the tolerance certificate."""
        state = (
            "its inputs agreed within their bounds"
            if self.inputs_agreed
            else "its inputs differed, but replayed on the reference's inputs it still differs"
        )
        return "\n".join(
            [
                self.summary(),
                f"  occurrence {self.occurrence} of {self.op} at that call site and module; "
                + state,
                self.bound.certificate,
            ]
        )


@dataclass
class ConfigRun:
    config_id: str
    flags: Mapping[str, object]
    device: str
    results: list[tuple[str, object]]
    records: list[OpRecord]


def _clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            out.append(y.requires_grad_(x.requires_grad))
        else:
            out.append(x)
    return out


def _run(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    config_id: str,
    flags: Mapping[str, object],
    device: str,
    backward: bool,
) -> ConfigRun:
    from pytest_backends.flags import override_flags

    args = _clone_inputs(inputs)
    params = (
        [p for p in fn.parameters() if p.requires_grad] if isinstance(fn, torch.nn.Module) else []
    )
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad] + params
    with torch.random.fork_rng(devices=[]), override_flags(flags), module_tracking() as mods:
        torch.manual_seed(SEED)
        recorder = PathRecorder(mods)
        try:
            with recorder:
                out = fn(*args)
        except Exception as exc:
            note = getattr(exc, "add_note", None)  # Python 3.11+
            if note is not None:
                note(f"assert_paths_agree: raised by fn under configuration {config_id}")
            raise
        results, diff = results_of(out)
        if backward and diff and leaves:
            gen = torch.Generator().manual_seed(SEED)
            grads_out = [
                torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in diff
            ]
            recorder.in_backward = True
            mods.stack.clear()
            with recorder:
                grads = torch.autograd.grad(diff, leaves, grads_out, allow_unused=True)
            names = [
                f"grad of input {i}" for i, a in enumerate(args) if any(a is x for x in leaves)
            ]
            names += [f"grad of parameter {i}" for i in range(len(params))]
            for label, g in zip(names, grads, strict=False):
                if g is not None:
                    results.append((label, g.detach().clone()))
    return ConfigRun(config_id, dict(flags), device, results, recorder.records)


def _gap(a: torch.Tensor, b: torch.Tensor, bound: Bound) -> tuple[bool, float, float]:
    """(within, max abs error, max rel error) of ``a`` against ``b``.

    Where either is not finite, both must be: a NaN where the other has a NaN
    (any payload), an infinity where the other has the same infinity; anything
    else is an infinite error.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, float("inf"), float("inf")
    if a.numel() == 0:
        return True, 0.0, 0.0
    if not (a.is_floating_point() or a.is_complex()):
        if bool(torch.equal(a, b)):
            return True, 0.0, 0.0
        gap = (a.double() - b.double()).abs()  # bool as 0 and 1
        return False, float(gap.max()), float((gap / b.double().abs().clamp_min(1.0)).max())
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    x, y = a.detach().double(), b.detach().double()
    finite = torch.isfinite(y) & torch.isfinite(x)
    if not bool(finite.all()):
        xs, ys = x[~finite], y[~finite]
        if not bool(((xs == ys) | (xs.isnan() & ys.isnan())).all()):
            return False, float("inf"), float("inf")
    err = (x - y).abs().where(finite, torch.zeros_like(x))
    allowed = bound.allowed(y.where(finite, torch.zeros_like(y)))
    within = bool((err <= allowed).all())
    scale = y.abs().where(finite, torch.ones_like(y))
    rel = err / scale.clamp_min(bound.atol if bound.atol > 0 else 1e-30)
    return within, float(err.max()), float(rel.max())


def _exact_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """How an integer or bool result differs from the reference's."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype} {list(a.shape)} vs {b.dtype} {list(b.shape)} under the reference"
    differ = int((a != b).sum())
    return f"{differ} of {a.numel()} elements differ"


def _op_bound(record: OpRecord, ref: ConfigRun, other: ConfigRun, tensor: torch.Tensor) -> Bound:
    k = reduction_length(record.name, record.inputs, record.outputs)
    scale = term_scale(record.name, record.inputs)
    if record.name == "aten::mean":  # a sum of x_i / k: the bound of the mean, not its sum
        scale /= k
    return pair_bound(
        record.name,
        tensor.dtype,
        tensor.device.type,
        k,
        scale,
        [(ref.config_id, ref.flags), (other.config_id, other.flags)],
    )


#: An integer or bool output: no rounding, so any difference is the op's.
EXACT = Bound(
    0.0,
    0.0,
    "tolerance certificate: none, an integer or bool output is compared value for value:\n"
    "  no rounding, so any difference is the op's",
)


def _compare_outputs(
    record: OpRecord,
    outputs: Sequence[torch.Tensor],
    ref_record: OpRecord,
    ref: ConfigRun,
    other: ConfigRun,
) -> tuple[bool, float, float, Bound | None]:
    worst: tuple[bool, float, float, Bound | None] = (True, 0.0, 0.0, None)
    if len(outputs) != len(ref_record.outputs):
        return False, float("inf"), float("inf"), None
    for a, b in zip(outputs, ref_record.outputs, strict=True):
        if not (b.is_floating_point() or b.is_complex()):
            within, err, rel = _gap(a, b, EXACT)
            if not within:
                return False, err, rel, EXACT
            continue
        bound = _op_bound(ref_record, ref, other, b)
        within, err, rel = _gap(a, b, bound)
        if not within or worst[3] is None:
            if not within or rel >= worst[2]:
                worst = (worst[0] and within, err, rel, bound)
            if not within:
                return worst
    return worst


def _replay(record: OpRecord, flags: Mapping[str, object]) -> list[torch.Tensor] | None:
    """Run the reference's recorded op call again, on copies of its inputs, under ``flags``.

    Memory the op leaves unwritten reads NaN (:mod:`pytest_backends.paths.unwritten`).
    """
    from pytest_backends.paths.record import copy_tree, results_of_call
    from pytest_backends.paths.unwritten import filled_replay

    args, kwargs = copy_tree(record.args), copy_tree(record.kwargs)
    try:
        with torch.random.fork_rng(devices=[]), filled_replay(flags):
            torch.manual_seed(SEED)
            out = record.func(*args, **kwargs)
    except Exception:
        return None
    return [t.detach() for t in results_of_call(record.func, args, kwargs, out)]


def _kernels_of(record: OpRecord, config_id: str, flags: Mapping[str, object]) -> str:
    """The oneDNN primitives the op runs under ``flags``, from its primitive log.

    The op is replayed alone on the reference's inputs with the log on, so what
    the log shows is this op's, not its neighbours'.
    """
    from pytest_backends.kernels.log import PrimitiveLog

    if any(t.device.type != "cpu" for t in record.inputs):
        return f"[{config_id}] not logged (the primitive log sees CPU kernels only)"
    log = PrimitiveLog()
    if not log.start():
        return f"[{config_id}] not logged ({log.error})"
    try:
        _replay(record, flags)
    finally:
        primitives = log.stop()
    seen = list(dict.fromkeys(f"{p.kind} {p.impl}" for p in primitives if p.computes))
    return f"[{config_id}] " + (", ".join(seen) or "no oneDNN primitive (ATen's own kernel)")


def _with_kernels(bound: Bound, record: OpRecord, ref: ConfigRun, other: ConfigRun) -> Bound:
    """``bound`` whose certificate names the kernels the op ran under each configuration."""
    kernels = [_kernels_of(record, run.config_id, run.flags) for run in (ref, other)]
    lines = bound.certificate.splitlines()
    lines[-1:-1] = [f"  kernels seen: {'; '.join(kernels)}"]
    return Bound(bound.rtol, bound.atol, "\n".join(lines))


def _with_outputs(record: OpRecord, outputs: list[torch.Tensor]) -> OpRecord:
    return OpRecord(
        record.index,
        record.identity,
        record.func,
        record.args,
        record.kwargs,
        record.inputs,
        outputs,
        record.backward,
    )


def _inputs_agree(record: OpRecord, ref_record: OpRecord, ref: ConfigRun, other: ConfigRun) -> bool:
    if len(record.inputs) != len(ref_record.inputs):
        return False
    for a, b in zip(record.inputs, ref_record.inputs, strict=True):
        if a.shape != b.shape:
            return False
        if b.is_floating_point() or b.is_complex():
            bound = pair_bound(
                "input", b.dtype, b.device.type, 1, 1.0, [(ref.config_id, ref.flags)] * 2
            )
            if not _gap(a, b, bound)[0]:
                return False
        elif not torch.equal(a, b):
            return False
    return True


#: Ops whose results are random or uninitialised memory: never compared, never blamed.
SKIPPED = (
    "aten::native_dropout",
    "aten::bernoulli",
    "aten::rand",
    "aten::normal",
    "aten::uniform",
    "aten::empty",
    "aten::new_empty",
    "aten::resize",
    "aten::set_",
)


def first_divergence(ref: ConfigRun, other: ConfigRun) -> Divergence | None:
    """The first op of ``other`` (in its order) that parts from the reference on its own."""
    by_identity = {r.identity: r for r in ref.records}
    for record in other.records:
        ref_record = by_identity.get(record.identity)
        if ref_record is None or record.name.startswith(SKIPPED):
            continue
        within, _err, _rel, _bound = _compare_outputs(
            record, record.outputs, ref_record, ref, other
        )
        if within:
            continue
        # The isolating check: the same (reference) inputs under both configurations.
        # An op that does not reproduce its own recorded result (uninitialised memory,
        # a random op) cannot be judged this way and is never blamed.
        replayed = _replay(ref_record, other.flags)
        again = _replay(ref_record, ref.flags)
        if replayed is None or again is None:
            continue
        if not _compare_outputs(record, again, ref_record, ref, other)[0]:
            continue
        baseline = _with_outputs(ref_record, again)
        r_within, r_err, r_rel, r_bound = _compare_outputs(record, replayed, baseline, ref, other)
        if r_within or r_bound is None:
            continue
        return Divergence(
            op=record.name,
            site=record.site,
            module=record.module,
            occurrence=record.identity[3],
            reference=ref.config_id,
            other=other.config_id,
            max_abs=r_err,
            max_rel=r_rel,
            bound=_with_kernels(r_bound, ref_record, ref, other),
            inputs_agreed=_inputs_agree(record, ref_record, ref, other),
        )
    return None


def _result_bound(
    run: ConfigRun, ref: ConfigRun, tensor: torch.Tensor, *, floor: bool = True
) -> Bound:
    """The bound of a result: its largest reduction, at the scale ``max(1, max|result|)``.

    The floor of 1 leaves room for terms larger than the result that cancelled
    in it; ``floor=False`` is the bound at the result's own scale.
    """
    k = max(
        [reduction_length(r.name, r.inputs, r.outputs) for r in ref.records] or [1],
    )
    top = float(tensor.detach().abs().double().max()) if tensor.numel() else 1.0
    return pair_bound(
        "the result",
        tensor.dtype,
        tensor.device.type,
        k,
        max(1.0, top) if floor else top,
        [(ref.config_id, ref.flags), (run.config_id, run.flags)],
    )


def _configs(
    axes: Sequence[str] | Mapping[str, Sequence[str]], reference: str | None = None
) -> list[Any]:
    from pytest_backends.matrix import availability, markers
    from pytest_backends.matrix.axes import builtin_registry
    from pytest_backends.matrix.configs import unavailable_reason

    registry = builtin_registry()
    if isinstance(axes, str) or not isinstance(axes, (Sequence, Mapping)):
        raise TypeError(
            f"assert_paths_agree: axes is a list of axis names (or a mapping of axis to "
            f"values), not {type(axes).__name__} {axes!r}"
        )
    if not axes:
        raise ValueError(
            "assert_paths_agree: axes names no axis: give one or more, e.g. "
            "axes=['mkldnn'] or axes={'sdpa': ['math', 'flash']}"
        )
    mark: tuple[Sequence[object], Mapping[str, object]] = (
        ((), dict(axes)) if isinstance(axes, Mapping) else (tuple(axes), {})
    )
    try:
        selection = markers.resolve([mark], registry)
    except Exception as exc:
        raise ValueError(f"assert_paths_agree: bad axes {axes!r}: {exc}") from exc
    for name in selection:
        if registry.axis(name).process_level:
            raise ValueError(
                f"assert_paths_agree: axis {name!r} can only change in a new process; "
                "compare its levels offline with --backends-trace and `pytest-backends diverge`"
            )
    avail = availability.probe()
    configs = [
        registry.make(c, available_flags=avail.flags, cuda_available=avail.cuda)
        for c in registry.product(selection)
    ]
    if len(configs) < 2:
        raise ValueError(
            f"assert_paths_agree: axes {axes!r} give {len(configs)} configuration(s): "
            "nothing to compare; give an axis with two values or more"
        )
    runnable = []
    for config in configs:
        reason = unavailable_reason(config, registry, avail)
        if reason is None:
            runnable.append(config)
        elif config.id == reference:
            import pytest

            pytest.skip(f"the reference configuration {reference!r} cannot run here: {reason}")
    return runnable


def assert_paths_agree(
    fn: Callable[..., Any],
    *inputs: Any,
    axes: Sequence[str] | Mapping[str, Sequence[str]] = (),
    reference: str | None = None,
    backward: bool = True,
) -> PathsAgreement:
    """Assert that ``fn(*inputs)`` agrees across the configurations of ``axes``.

    ``axes`` names flag-level axes (``["mkldnn"]``) or maps axis to values
    (``{"mkldnn": ["on", "off"]}``); every configuration this machine can run
    is run in this process, its flags set and restored around the call, from
    the state ``fn`` found (the modules, optimizers and schedulers it reaches, Python's and
    NumPy's generators; see :class:`~pytest_backends.paths.start.StartState`),
    which is put back after the last run.
    ``reference`` is the id of the configuration the others are compared
    with (default: the first).  With ``backward`` the gradients of the
    inputs that require grad (and of ``fn``'s parameters when it is a
    module) are compared too, for a fixed random upstream gradient.

    Raises :class:`PathsDisagreeError` naming the first op where the paths
    part, with its call site, module path, both configurations, the error,
    the bound and the bound's derivation.  Results that are not floating
    point (integer and bool tensors, Python ints, bools, strings, None, dtypes,
    sizes, devices) and the result's structure are compared exactly, and so
    are a floating-point result's dtype and shape; a Python float as a float32
    value. A leaf whose type has identity equality only (a ``torch.Generator``,
    a module, a plain ``object()``) is not a numeric result: it is never
    compared, only its type is, and the returned :class:`PathsAgreement` (or
    the error) lists it as not compared. A NaN agrees with a
    NaN and an infinity with the same infinity; any other non-finite
    difference is an infinite error. ``ValueError`` for an unknown or
    process-level axis, axes that give fewer than two configurations, or an
    unknown reference, ``TypeError`` for axes that are not a list or mapping; the
    test is skipped where fewer than two of them, or the reference, can run on this
    machine. An exception ``fn`` raises propagates with a note naming the
    configuration it ran under.
    """
    if not callable(fn):
        raise TypeError(f"assert_paths_agree: fn must be callable, got {_tree.shown(fn)}")
    configs = _configs(axes, reference)
    if len(configs) < 2:
        import pytest

        pytest.skip(f"fewer than two configurations of {list(axes)} can run here")
    ids = [c.id for c in configs]
    if reference is None:
        ref_config = configs[0]
    elif reference in ids:
        ref_config = configs[ids.index(reference)]
    else:
        raise ValueError(f"reference {reference!r} is not one of the configurations {ids}")
    start = StartState(fn)  # each configuration's run starts from the state fn found
    try:
        return _compare_configs(fn, inputs, configs, ref_config, backward, start)
    finally:
        start.restore()


def _compare_configs(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    configs: Sequence[Any],
    ref_config: Any,
    backward: bool,
    start: StartState,
) -> PathsAgreement:
    """Run each configuration (``start`` put back before each); compare it with the reference."""
    ids = [c.id for c in configs]
    ref = _run(fn, inputs, ref_config.id, ref_config.flags, ref_config.device, backward)
    not_compared = tuple(
        f"{label} ({leaf.type_name})" for label, leaf in ref.results if isinstance(leaf, Identity)
    )
    failures: list[str] = []
    error_divergence: Divergence | None = None
    for config in configs:
        if config is ref_config:
            continue
        start.restore()
        other = _run(fn, inputs, config.id, config.flags, config.device, backward)
        bad: list[str] = []
        numeric = False
        floored: list[str] = []  # within the bound only thanks to its scale's floor of 1
        for (label, a), (_label, b) in zip(other.results, ref.results, strict=False):
            if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
                if not same_value(a, b):
                    bad.append(f"{label}: {a!r} vs {b!r} under the reference (compared exactly)")
                continue
            if not (b.is_floating_point() or b.is_complex()):
                if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                    bad.append(f"{label}: {_exact_difference(a, b)} (compared exactly)")
                continue
            if a.dtype != b.dtype or a.shape != b.shape:
                bad.append(f"{label}: {_exact_difference(a, b)}")
                continue
            bound = _result_bound(other, ref, b)
            within, err, rel = _gap(a, b, bound)
            if within and not (own := _gap(a, b, _result_bound(other, ref, b, floor=False)))[0]:
                floored.append(
                    f"{label}: max abs error {own[1]:.3g}, max rel error {own[2]:.3g}: beyond "
                    "the bound at the result's own scale (within it only at scale 1)"
                )
            if not within:
                numeric = True
                bad.append(
                    f"{label}: max abs error {err:.3g}, max rel error {rel:.3g}\n"
                    + bound.certificate
                )
        if len(other.results) != len(ref.results):
            bad.append(f"{len(other.results)} results vs {len(ref.results)} under the reference")
        if not bad and not floored:
            continue
        divergence = first_divergence(ref, other)
        if not bad:
            # A small result differs beyond its own scale's bound: it agrees only if no
            # op parts on its own (the difference may be cancellation of larger terms).
            if divergence is None:
                continue
            bad, numeric = floored, True
        error_divergence = error_divergence or divergence
        if divergence is not None:
            head = divergence.describe()
        elif (branch := path_difference(ref, other, SKIPPED)) is not None:
            head = branch
        elif numeric:
            head = "no single op parts beyond its bound: the difference built up across ops"
        else:
            head = (
                "the results differ where they are compared exactly "
                "(structure, dtype, shape, exact values)"
            )
        failures.append(f"{config.id} vs {ref.config_id} (reference):\n{head}\n" + "\n".join(bad))
    if failures:
        if not_compared:
            failures.append(
                "not compared (identity equality only, not numeric results): "
                + ", ".join(not_compared)
            )
        raise PathsDisagreeError("\n\n".join(failures), error_divergence, not_compared)
    return PathsAgreement(ref.config_id, tuple(i for i in ids if i != ref.config_id), not_compared)
