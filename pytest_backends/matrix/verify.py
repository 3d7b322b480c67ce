"""Kernel-path verification (``--backends-verify``): did the promised path run?

A flag only *allows* a kernel path; torch still picks kernels per shape, dtype
and device, and may fall back.  So for configs that promise a path, the op names of
the test's call phase are recorded with ``torch.profiler`` and checked against
:data:`PROMISES`, a table of ``config token -> promise``:

* a **hard** promise lists ops that must not run (``mkldnn-off`` must not run
  ``aten::mkldnn_convolution``); a broken one fails the test, saying what was
  requested and what ran;
* a **soft** promise lists ops of which at least one should run
  (``mkldnn-on`` should reach oneDNN).  When none did, the test is reported
  as *not exercised*, naming the path that ran instead; with
  ``--backends-verify=strict`` that is a failure too.

The profiler is used rather than a ``TorchDispatchMode`` because a dispatch
mode only sees the op it intercepts: a conv under a mode shows up as
``aten.convolution`` and never as the ``aten::mkldnn_convolution`` or
``aten::_slow_conv2d_forward`` it dispatches to, while the profiler records
every op the dispatcher runs, nested ones included.

Op names stop at the dispatcher: ``aten::mm`` says nothing about whether
oneDNN computed it, or in which precision.  For the oneDNN tokens
(``mkldnn-on``, ``mkldnn-off``, ``mkldnn_precision-*``) the verifier also
captures oneDNN's primitive log during the call
(:class:`pytest_backends.kernels.PrimitiveLog`) and attributes each
executed primitive to the op that ran it: ``mkldnn-on`` is exercised only
when a primitive computed an op of the test, ``mkldnn-off`` is broken by
any primitive, a precision token is exercised only when a primitive
computed in that precision, and the detail gives the coverage per op
family ("exercised by 1 of 2 convolutions; aten::_slow_conv2d_forward ran
for input (1, 3, 8, 8)").
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pytest

from pytest_backends import _shared
from pytest_backends.kernels import (
    FAMILY_OPS,
    CudaKernel,
    OpEvent,
    Primitive,
    PrimitiveLog,
    attribute,
    classify_cuda_kernel,
)
from pytest_backends.matrix.configs import BackendConfig
from pytest_backends.matrix.op_recorder import ProfilerOpRecorder

__all__ = [
    "PROMISES",
    "KernelTrace",
    "Promise",
    "Verdict",
    "VerifyPlugin",
    "evaluate",
]


# Ops that *implement* a convolution, i.e. that show which path ran.
CONV_IMPLS = (
    "aten::mkldnn_convolution",
    "aten::_slow_conv2d_forward",
    "aten::slow_conv3d_forward",
    "aten::slow_conv_dilated2d",
    "aten::slow_conv_dilated3d",
    "aten::slow_conv_transpose2d",
    "aten::slow_conv_transpose3d",
    "aten::_nnpack_spatial_convolution",
    "aten::_conv_depthwise2d",
    "aten::conv_depthwise3d",
    "aten::cudnn_convolution*",
    "aten::miopen_convolution*",
    "mkldnn::_convolution_pointwise*",
)
_SDPA_FLASH = ("aten::_scaled_dot_product_flash_attention*", "aten::_flash_attention_*")
_SDPA_EFFICIENT = ("aten::_scaled_dot_product_efficient_attention*", "aten::_efficient_attention_*")
_SDPA_CUDNN = ("aten::_scaled_dot_product_cudnn_attention*", "aten::_cudnn_attention_*")
_SDPA_MATH = ("aten::_scaled_dot_product_attention_math*",)
_SDPA_OTHER = ("aten::_scaled_dot_product_fused_attention_overrideable*",)
SDPA_IMPLS = _SDPA_FLASH + _SDPA_EFFICIENT + _SDPA_CUDNN + _SDPA_MATH + _SDPA_OTHER


@dataclass(frozen=True)
class Promise:
    """What a config token promises about the kernels that run.

    ``forbid``: op-name patterns (``fnmatch``) that must not run (hard).
    ``expect``: patterns of which at least one should run (soft).
    ``instead``: patterns whose matches show what ran instead of ``expect``.
    ``ignore``: patterns excluded from ``forbid`` (queries such as
    ``aten::cudnn_is_acceptable`` that run on every path).
    ``path`` names the promised path in messages; ``nothing`` says what was
    missing when no op of ``instead`` ran either.  ``devices`` limits the
    promise to configs running on those devices (``None``: all).
    """

    path: str
    forbid: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    instead: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    nothing: str = "no op of that kind ran"
    devices: frozenset[str] | None = None
    #: what oneDNN's primitive log must show, where it is captured:
    #: ``"none"`` (no primitive may run: hard), ``"computes"`` (a primitive
    #: computed an op: soft) or ``"precision:<mode>"`` (a primitive computed
    #: in ``<mode>``: soft).
    primitives: str | None = None
    #: what the CUDA kernel names must show (profiled on a GPU):
    #: ``"precision:<mode>"`` (a kernel computed in ``<mode>``: soft),
    #: ``"no-precision:<mode>"`` (none may: hard) or ``"library:<name>"``
    #: (a kernel of that library ran: soft).
    cuda_kernels: str | None = None


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


#: config token -> promise.  Extend it (or a copy passed to :class:`VerifyPlugin`)
#: for new axes.
PROMISES: dict[str, Promise] = {
    "mkldnn-off": Promise(
        "no oneDNN kernels",
        forbid=("aten::mkldnn_*", "aten::_mkldnn_*", "aten::to_mkldnn*", "mkldnn::*"),
        ignore=("mkldnn::_is_mkldnn_*",),
        primitives="none",
    ),
    "mkldnn-on": Promise(
        "oneDNN kernels",
        expect=("aten::mkldnn_*", "mkldnn::_convolution_pointwise*", "mkldnn::_linear_pointwise*"),
        instead=CONV_IMPLS,
        nothing="no convolution ran",
        devices=frozenset({"cpu"}),
        primitives="computes",
    ),
    "mkldnn_precision-bf16": Promise(
        "bf16 computation in oneDNN",
        devices=frozenset({"cpu"}),
        primitives="precision:bf16",
    ),
    "mkldnn_precision-tf32": Promise(
        "tf32 computation in oneDNN",
        devices=frozenset({"cpu"}),
        primitives="precision:tf32",
    ),
    "tf32-on": Promise(
        "TF32 kernels",
        devices=frozenset({"cuda"}),
        cuda_kernels="precision:tf32",
    ),
    "tf32-off": Promise(
        "no TF32 kernels",
        devices=frozenset({"cuda"}),
        cuda_kernels="no-precision:tf32",
    ),
    "nnpack-off": Promise("no NNPACK kernels", forbid=("aten::_nnpack_spatial_convolution*",)),
    "nnpack-on": Promise(
        "NNPACK convolutions",
        expect=("aten::_nnpack_spatial_convolution*",),
        instead=CONV_IMPLS,
        nothing="no convolution ran",
        devices=frozenset({"cpu"}),
    ),
    "cudnn-off": Promise(
        "no cuDNN kernels",
        forbid=("aten::cudnn_*", "aten::_cudnn_*"),
        ignore=("aten::cudnn_is_acceptable", "aten::_cudnn_attention_*"),
    ),
    "cudnn-on": Promise(
        "cuDNN kernels",
        expect=("aten::cudnn_*", "aten::_cudnn_rnn*", "aten::miopen_*"),
        instead=(*CONV_IMPLS, "aten::native_batch_norm", "aten::_thnn_fused_*"),
        ignore=("aten::cudnn_is_acceptable",),
        nothing="no convolution, RNN or batch norm ran",
        devices=frozenset({"cuda"}),
        cuda_kernels="library:cudnn",
    ),
    "sdpa-math": Promise(
        "the math SDPA kernel",
        forbid=_SDPA_FLASH + _SDPA_EFFICIENT + _SDPA_CUDNN + _SDPA_OTHER,
        expect=_SDPA_MATH,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
    "sdpa-flash": Promise(
        "the flash-attention SDPA kernel",
        forbid=_SDPA_MATH + _SDPA_EFFICIENT + _SDPA_CUDNN + _SDPA_OTHER,
        expect=_SDPA_FLASH,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
    "sdpa-efficient": Promise(
        "the memory-efficient SDPA kernel",
        forbid=_SDPA_MATH + _SDPA_FLASH + _SDPA_CUDNN + _SDPA_OTHER,
        expect=_SDPA_EFFICIENT,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
    "sdpa-cudnn": Promise(
        "the cuDNN SDPA kernel",
        forbid=_SDPA_MATH + _SDPA_FLASH + _SDPA_EFFICIENT + _SDPA_OTHER,
        expect=_SDPA_CUDNN,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
}


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one test's ops against its config's promises."""

    broken: tuple[str, ...] = ()
    not_exercised: tuple[str, ...] = ()
    exercised: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        """``broken``, ``not exercised`` or ``ok``."""
        if self.broken:
            return "broken"
        return "not exercised" if self.not_exercised else "ok"

    @property
    def detail(self) -> str:
        """The problems (or, when there are none, what was exercised), joined with ``; ``."""
        return "; ".join(self.broken + self.not_exercised or self.exercised)


def _listed(names: Iterable[str], limit: int = 6) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def promises_for(
    config: BackendConfig, table: Mapping[str, Promise] = PROMISES
) -> list[tuple[str, Promise]]:
    """The ``(token, promise)`` pairs that apply to ``config`` on its device."""
    found = []
    for token in config.tokens:
        promise = table.get(token)
        if promise is not None and (promise.devices is None or config.device in promise.devices):
            found.append((token, promise))
    return found


@dataclass(frozen=True)
class KernelTrace:
    """What oneDNN computed during a call: attributed primitives and the op events."""

    primitives: tuple[Primitive, ...]
    events: tuple[OpEvent, ...] = ()

    @classmethod
    def build(cls, primitives: Sequence[Primitive], events: Sequence[OpEvent]) -> KernelTrace:
        """Attribute ``primitives`` to ``events`` (both in execution order)."""
        return cls(tuple(attribute(primitives, events)), tuple(events))


_PLURAL = {"conv": "convolutions", "matmul": "matmuls", "rnn": "RNNs"}
# ops that show which kernel computed an op of a family (the innermost wins)
_IMPL_OPS = {
    "conv": CONV_IMPLS + FAMILY_OPS["conv"],
    "matmul": FAMILY_OPS["matmul"],
    "rnn": FAMILY_OPS["rnn"],
}


def _shape(shapes: Sequence[tuple[int, ...]]) -> str:
    first = next((s for s in shapes if s), None)
    return str(tuple(first)) if first is not None else "()"


def _outermost(events: Sequence[OpEvent], patterns: tuple[str, ...]) -> dict[int, int]:
    """``event index -> index of its outermost ancestor-or-self matching ``patterns``."""
    member = [_matches(e.name, patterns) for e in events]
    owner: dict[int, int] = {}
    for index in range(len(events)):
        top: int | None = None
        at: int | None = index
        while at is not None:
            if member[at]:
                top = at
            at = events[at].parent
        if top is not None:
            owner[index] = top
    return owner


def coverage(trace: KernelTrace) -> list[str]:
    """Per op family: how many of its ops a oneDNN primitive computed, and what ran for the rest.

    ``["exercised by 1 of 2 convolutions; aten::_slow_conv2d_forward ran for
    input (1, 3, 8, 8)"]``
    """
    events = trace.events
    computed = {p.op_index for p in trace.primitives if p.computes and p.op_index is not None}
    lines = []
    for family, patterns in _IMPL_OPS.items():
        owner = _outermost(events, patterns)
        roots = sorted(set(owner.values()))
        if not roots:
            continue
        trees: dict[int, list[int]] = {root: [] for root in roots}
        for index, root in owner.items():
            trees[root].append(index)
        covered, missed = 0, []
        for root in roots:
            if computed.intersection(trees[root]):
                covered += 1
                continue
            # the innermost (last-started) op of the family names the kernel that ran
            impl = events[max(i for i in trees[root] if _matches(events[i].name, patterns))]
            missed.append(f"{impl.name} ran for input {_shape(events[root].shapes)}")
        shown = list(dict.fromkeys(missed))
        extra = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        line = f"exercised by {covered} of {len(roots)} {_PLURAL[family]}"
        lines.append("; ".join([line, *shown[:3]]) + extra)
    return lines


def _described(primitives: Sequence[Primitive], limit: int = 3) -> str:
    shown = list(dict.fromkeys(p.describe() for p in primitives))
    extra = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + extra


def _check_primitives(
    token: str,
    promise: Promise,
    config: BackendConfig,
    trace: KernelTrace,
    broken: list[str],
    missing: list[str],
    exercised: list[str],
    ops: Collection[str],
) -> None:
    rule = promise.primitives or ""
    prims = trace.primitives
    computing = [p for p in prims if p.computes]
    if rule == "none":
        if prims:
            broken.append(
                f"{token} promised {promise.path}, but oneDNN ran "
                f"{_described(computing or prims)}. The flags of {config.id} were set around "
                "the test, so something inside it changed them (torch.backends.*.flags(), "
                "an assignment)"
            )
    elif rule == "computes":
        cover = coverage(trace)
        if computing:
            exercised.append(f"{token} exercised: {_described(computing)}")
            exercised.extend(f"{token} {line}" for line in cover)
        else:
            instead = "; ".join(line.partition("; ")[2] for line in cover if "; " in line)
            other = [o for o in ops if _matches(o, promise.instead)]
            ran = instead or (f"ran {_listed(other)} instead" if other else promise.nothing)
            missing.append(
                f"{token} not exercised: no oneDNN primitive computed an op of the test; {ran}"
            )
    elif rule.startswith("precision:"):
        mode = rule.partition(":")[2]
        family = [p for p in computing if p.family]
        done = [p for p in family if _computed_as_promised(p, mode)]
        if done:
            exercised.append(f"{token} exercised: {_per_op(done, mode)}")
        elif family:
            missing.append(f"{token} not exercised: {_per_op(family, mode)}")
        else:
            ran = f"; oneDNN computed {_described(computing)}" if computing else ""
            missing.append(f"{token} not exercised: no oneDNN matmul, convolution or RNN ran{ran}")


def _computed_as_promised(primitive: Primitive, mode: str) -> bool:
    """An fp32 primitive that computed in ``mode`` because the flag let it."""
    return (
        "f32" in primitive.input_dtypes()
        and primitive.fpmath == mode
        and primitive.precision == mode
    )


def _op_verdict(primitive: Primitive, mode: str) -> str:
    """One statement for one primitive: what ran, on which ISA, in which precision, and why."""
    where = f" for {primitive.op}" if primitive.op else ""
    isa = primitive.isa or "unknown"
    head = f"{primitive.kind} {primitive.impl}{where}: ISA {isa}, computed in {primitive.precision}"
    if _computed_as_promised(primitive, mode):
        return f"{head} as promised"
    if "f32" not in primitive.input_dtypes():
        inputs = "/".join(dict.fromkeys(primitive.input_dtypes())) or "non-fp32"
        return f"{head} from {inputs} inputs, not an fp32 op that the flag governs"
    if primitive.fpmath == mode:
        return f"{head}, not {mode}: the flag allowed {mode}, this kernel has no {mode} arithmetic"
    return f"{head}, not {mode}: oneDNN got no attr-fpmath:{mode} for this primitive"


def _per_op(primitives: Sequence[Primitive], mode: str, limit: int = 3) -> str:
    shown = list(dict.fromkeys(_op_verdict(p, mode) for p in primitives))
    extra = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    return "; ".join(shown[:limit]) + extra


def _check_cuda(
    token: str,
    promise: Promise,
    config: BackendConfig,
    names: Sequence[str],
    broken: list[str],
    missing: list[str],
    exercised: list[str],
) -> None:
    kernels = [classify_cuda_kernel(n) for n in dict.fromkeys(names)]
    rule, _, what = (promise.cuda_kernels or "").partition(":")

    def shown(found: Sequence[CudaKernel]) -> str:
        return _listed(k.name[:80] for k in found)

    if rule == "library":
        hit = [k for k in kernels if k.library == what]
        if hit:
            exercised.append(f"{token} exercised: {what} kernels {shown(hit)}")
        else:
            work = [k for k in kernels if k.role != "other"]
            ran = f"ran {shown(work)}" if work else "no GEMM, convolution or RNN kernel ran"
            missing.append(f"{token} not exercised: no {what} kernel ran; {ran}")
        return
    hit = [k for k in kernels if k.precision == what]
    if rule == "no-precision":
        if hit:
            broken.append(
                f"{token} promised {promise.path}, but the GPU ran {shown(hit)}. The flags of "
                f"{config.id} were set around the test, so something inside it changed them"
            )
    elif hit:
        exercised.append(f"{token} exercised: {shown(hit)}")
    elif [k for k in kernels if k.precision is None and k.role in ("gemm", "conv")]:
        # cuBLASLt's nvjet kernels do not name their precision
        unknown = [k for k in kernels if k.precision is None and k.role in ("gemm", "conv")]
        exercised.append(
            f"{token}: the kernel names do not tell whether {what} ran ({shown(unknown)})"
        )
    else:
        fp32 = [k for k in kernels if k.precision == "f32" and k.role != "other"]
        ran = f"{shown(fp32)} computed in f32" if fp32 else "no fp32 GEMM or convolution ran"
        missing.append(f"{token} not exercised: the flag allowed {what}, but {ran}")


def evaluate(
    config: BackendConfig,
    ops: Collection[str],
    table: Mapping[str, Promise] = PROMISES,
    kernels: KernelTrace | None = None,
    cuda_kernels: Sequence[str] | None = None,
) -> Verdict:
    """Check the op names a test ran against the promises of ``config``'s tokens.

    With ``kernels`` (oneDNN's primitive log of the same call), promises
    that name ``primitives`` are checked against the primitives that ran
    instead of the op names.  With ``cuda_kernels`` (the CUDA kernel names
    the profiler saw), promises that name ``cuda_kernels`` are checked
    against them (:func:`pytest_backends.kernels.classify_cuda_kernel`).
    """
    broken: list[str] = []
    missing: list[str] = []
    exercised: list[str] = []
    for token, promise in promises_for(config, table):
        if kernels is not None and promise.primitives is not None:
            before = len(broken)
            _check_primitives(token, promise, config, kernels, broken, missing, exercised, ops)
            if promise.primitives != "none" or len(broken) > before:
                continue
        if cuda_kernels is not None and promise.cuda_kernels is not None:
            _check_cuda(token, promise, config, cuda_kernels, broken, missing, exercised)
            if not (promise.forbid or promise.expect):
                continue
        if promise.forbid:
            bad = [
                o for o in ops if _matches(o, promise.forbid) and not _matches(o, promise.ignore)
            ]
            if bad:
                broken.append(
                    f"{token} promised {promise.path}, but the test ran {_listed(bad)}. "
                    f"The flags of {config.id} were set around the test, so something "
                    "inside it changed them (torch.backends.*.flags(), sdpa_kernel(), "
                    "an assignment)"
                )
        if promise.expect:
            hit = [o for o in ops if _matches(o, promise.expect)]
            if hit:
                exercised.append(f"{token} exercised: {_listed(hit)}")
            else:
                other = [o for o in ops if _matches(o, promise.instead)]
                ran = f"ran {_listed(other)} instead" if other else promise.nothing
                missing.append(f"{token} not exercised: {promise.path} never ran; {ran}")
    return Verdict(tuple(broken), tuple(missing), tuple(exercised))


class VerifyPlugin:
    """Records ops during each matrix item's call phase and checks its promises."""

    def __init__(self, *, strict: bool, table: Mapping[str, Promise] = PROMISES) -> None:
        self.strict = strict
        self.table = table

    def _wants_primitives(self, config: BackendConfig) -> bool:
        return any(p.primitives for _, p in promises_for(config, self.table))

    def _wants_cuda_kernels(self, config: BackendConfig) -> bool:
        if config.device != "cuda" or not any(
            p.cuda_kernels for _, p in promises_for(config, self.table)
        ):
            return False
        import torch

        return bool(torch.cuda.is_available())

    # trylast: inside pytest's capture wrapper, which points fd 1 at its own
    # file when the call starts; the primitive log must redirect fd 1 after it.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        config = item.stash.get(_shared.CONFIG_KEY, None)
        if not isinstance(config, BackendConfig) or not promises_for(config, self.table):
            return (yield)
        log = PrimitiveLog() if self._wants_primitives(config) else None
        recorder = ProfilerOpRecorder(shapes=log is not None, cuda=self._wants_cuda_kernels(config))
        if not recorder.start():
            _shared.attach(item, _shared.PROPERTY_VERIFY_STATUS, "unverified")
            _shared.attach(item, _shared.PROPERTY_VERIFY_DETAIL, recorder.error or "")
            return (yield)
        logging = log is not None and log.start()
        try:
            result = yield
        finally:
            primitives = log.stop() if log is not None and logging else None
            ops = recorder.stop()
        if not ops and not primitives:
            # A torch.profiler started inside the test takes the session over and
            # leaves this one empty; a test that runs no op at all looks the same.
            _shared.attach(item, _shared.PROPERTY_VERIFY_STATUS, "unverified")
            _shared.attach(
                item,
                _shared.PROPERTY_VERIFY_DETAIL,
                "no op was recorded: the test ran no torch op, or started its own "
                "torch.profiler, which takes the profiling session over",
            )
            return result
        trace = None if primitives is None else KernelTrace.build(primitives, recorder.events)
        kernels = recorder.kernels if recorder.cuda else None
        verdict = evaluate(config, ops, self.table, trace, kernels)
        _shared.attach(item, _shared.PROPERTY_VERIFY_STATUS, verdict.status)
        _shared.attach(item, _shared.PROPERTY_VERIFY_DETAIL, verdict.detail)
        if verdict.broken:
            pytest.fail("backends-verify: " + "\n".join(verdict.broken), pytrace=False)
        if self.strict and verdict.not_exercised:
            pytest.fail(
                "backends-verify=strict: " + "\n".join(verdict.not_exercised), pytrace=False
            )
        return result
