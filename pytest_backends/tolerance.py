"""Numeric tolerances derived from the dtype, the device and the active precision flags.

A result computed on a reduced-precision path (TF32, oneDNN bf16, fp16/bf16
GEMMs with reduced-precision reductions or fp16 accumulation) differs from
the exact result by an amount that depends on which flags let that path run
and on the reduction length ``k``.  :func:`tolerance_for` turns those inputs
into an elementwise bound ``|actual - expected| <= atol + rtol * |expected|``
and :func:`assert_close` applies it.  The model and its calibration are
described in ``docs/explanation/tolerance.rst``; the constants below were
checked by ``benchmarks/calibrate_tolerance.py``.

This module imports torch at import time; the plugin imports it lazily.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_backends import _tree
from pytest_backends.flags import registry

__all__ = [
    "OP_FAMILIES",
    "BackendTolerance",
    "Tolerance",
    "assert_close",
    "kernel_precision",
    "reference",
    "tolerance_for",
]

#: Op families the model knows; each selects the precision flags that apply.
OP_FAMILIES = ("matmul", "conv", "rnn", "sdpa", "reduction", "elementwise")

# Multipliers of the model (the explanation page derives them; the
# calibration in benchmarks/calibrate_tolerance.py checks them).
# Ulps allowed for the op's own arithmetic, independent of k (vectorised libm
# functions are within a few ulps).
_C_OP = 4.0
# Input rounding: the error of a length-k dot product whose inputs are
# rounded to unit roundoff u has a standard deviation of about 0.58 u sqrt(k) s
# for random data; 6 u sqrt(k) s is about 10 of those.
_C_INPUT = 6.0
# Accumulation, random-sign terms: rounding the running sum contributes a
# standard deviation of about 0.17 u sqrt(k m) s (m = terms summed one after
# the other, partial sums grow like sqrt(j) s).  The error is a scale mixture
# with heavy tails (maxima of 12 standard deviations were seen), so 4 u is
# about 24 of those.
_C_ACC_ABS = 4.0
# Accumulation, same-sign terms: the rounding errors can all point the same
# way (constant inputs), so the relative part takes the worst case of
# sequential summation, u (m + k/m): within a block, then across blocks.
# CPU GEMM and oneDNN kernels block the reduction dimension (measured on
# x86: the error follows sequential summation up to k = 256 and grows like
# sqrt(k) beyond).  GPU GEMMs keep one accumulator across the whole
# reduction, so no block is assumed there.
_CPU_BLOCK = 256

_TF32_U = 2.0**-11  # 10 explicit mantissa bits, round to nearest
_BF16_U = 2.0**-8
_FP16_U = 2.0**-11

# Which fp32_precision rows govern an op family, per device.  A conv or RNN
# may be lowered to a GEMM, so the matmul row applies to them as well; an
# unknown op (None) gets every row.
_PRECISION_ROWS: dict[str, dict[str | None, tuple[str, ...]]] = {
    "cpu": {
        "matmul": ("mkldnn.matmul.fp32_precision",),
        "conv": ("mkldnn.conv.fp32_precision", "mkldnn.matmul.fp32_precision"),
        "rnn": ("mkldnn.rnn.fp32_precision", "mkldnn.matmul.fp32_precision"),
        "sdpa": ("mkldnn.matmul.fp32_precision",),
        None: (
            "mkldnn.matmul.fp32_precision",
            "mkldnn.conv.fp32_precision",
            "mkldnn.rnn.fp32_precision",
        ),
    },
    "cuda": {
        "matmul": ("cuda.matmul.fp32_precision",),
        "conv": ("cudnn.conv.fp32_precision", "cuda.matmul.fp32_precision"),
        "rnn": ("cudnn.rnn.fp32_precision", "cuda.matmul.fp32_precision"),
        "sdpa": ("cuda.matmul.fp32_precision",),
        None: (
            "cuda.matmul.fp32_precision",
            "cudnn.conv.fp32_precision",
            "cudnn.rnn.fp32_precision",
        ),
    },
}
# Rows that only matter while their library is enabled.
_LIBRARY_SWITCH = {"mkldnn": "mkldnn.enabled", "cudnn": "cudnn.enabled"}
# Legacy booleans read when the fp32_precision API is missing (torch < 2.9).
_LEGACY_TF32 = {
    "cuda.matmul.fp32_precision": "cuda.matmul.allow_tf32",
    "cudnn.conv.fp32_precision": "cudnn.allow_tf32",
    "cudnn.rnn.fp32_precision": "cudnn.allow_tf32",
}
_GEMM_OPS = (None, "matmul", "conv", "rnn")


@dataclass(frozen=True)
class Tolerance:
    """An elementwise bound ``|actual - expected| <= atol + rtol * |expected|``.

    Unpacks as ``rtol, atol = tolerance``.  The other fields are the model's
    inputs, kept so that a failure can say why the bound is what it is:
    ``flags`` holds every flag that was consulted with its value, ``path``
    one line per error source that the model included.
    """

    rtol: float
    atol: float
    dtype: str
    device: str
    op: str | None
    k: int
    scale: float
    flags: tuple[tuple[str, object], ...]
    path: tuple[str, ...]
    #: where the precision of a reduced-precision flag came from: ``"primitive
    #: log"``, ``"probe"``, ``"worst case"``, or ``""`` when no such flag applied.
    precision_source: str = ""

    def __iter__(self) -> Iterator[float]:
        yield self.rtol
        yield self.atol

    def _source_lines(self) -> list[str]:
        if not self.precision_source:
            return []
        line = f"  precision from: {self.precision_source}"
        if self.precision_source == "worst case":
            line += (
                " (the kernel that ran could not be observed or probed: the bound assumes "
                "the reduced precision the flag allows, so it may be far looser than needed)"
            )
        return [line]

    def describe(self) -> str:
        """The model's inputs and the bound, as a few human-readable lines."""
        flags = ", ".join(f"{n}={v!r}" for n, v in self.flags) or "none apply"
        op = repr(self.op) if self.op else "None (any op: every precision flag counts)"
        return "\n".join(
            [
                f"tolerance model: {self.dtype} on {self.device}, op={op}, k={self.k}, "
                f"scale={self.scale:g}",
                f"  flags consulted: {flags}",
                *(f"  path: {line}" for line in self.path),
                *self._source_lines(),
                f"  bound: |actual - expected| <= atol + rtol * |expected| with "
                f"rtol={self.rtol:.3g}, atol={self.atol:.3g}",
            ]
        )


# --------------------------------------------------------------------- inputs


def _dtype(dtype: object) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise ValueError(f"dtype must be a torch.dtype or its name, got {dtype!r}")


def _device_type(device: object) -> str:
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        try:
            return torch.device(device).type
        except RuntimeError:
            pass
    raise ValueError(f"device must be a torch.device or a device string, got {device!r}")


def _check_k(k: object, op: str | None) -> int:
    if k is None:
        return 1
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(
            f"k must be a positive int (the reduction length: the inner dimension of a "
            f"matmul, in_channels/groups * kernel size of a conv), got {k!r}"
        )
    if k < 1:
        raise ValueError(
            f"k must be a positive int (the reduction length), got {k}; "
            "use k=1 (or leave it out) for an op without a reduction"
        )
    if op == "elementwise" and k != 1:
        raise ValueError(f"op='elementwise' has no reduction, so k must be 1, got {k}")
    return k


def _check_op(op: object) -> str | None:
    if op is None or (isinstance(op, str) and op in OP_FAMILIES):
        return op
    raise ValueError(f"unknown op {op!r}; choose one of {', '.join(map(repr, OP_FAMILIES))}")


def _check_shape(shape: object) -> tuple[int, ...] | None:
    if shape is None:
        return None
    if isinstance(shape, (tuple, list, torch.Size)) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        return tuple(int(d) for d in shape)
    raise ValueError(
        f"shape must be a sequence of non-negative ints (a result's shape), got {shape!r}"
    )


def _check_scale(scale: object) -> float:
    if (
        isinstance(scale, (int, float))
        and not isinstance(scale, bool)
        and math.isfinite(scale)
        and scale > 0
    ):
        return float(scale)
    raise ValueError(f"scale must be a positive finite number, got {scale!r}")


# ---------------------------------------------------------------------- flags


class _FlagView:
    """Reads single flags from the registry, with an optional overlay.

    The precision getters report *effective* values (a leaf set to "none"
    reads what it inherits).  An overlaid parent therefore also changes a
    leaf that reads the same as its parent does now, the rule the registry
    uses when it restores.
    """

    def __init__(self, overlay: Mapping[str, object] | None) -> None:
        self._reg = registry()
        self._overlay = dict(self._reg.validate(overlay)) if overlay else {}

    @property
    def overlay(self) -> dict[str, object]:
        """The overlaid (validated) flag values."""
        return dict(self._overlay)

    def _active(self, name: str) -> object:
        row = self._reg.by_name.get(name)
        if row is None:
            return None
        try:
            return row.plain(row.read())
        except RuntimeError:  # legacy getters can raise after the new API was used
            return None

    def get(self, name: str) -> object:
        if name in self._overlay:
            value = self._overlay[name]
            if value == "none":
                return self._parent_value(name)
            return value
        active = self._active(name)
        row = self._reg.by_name.get(name)
        if (
            row is not None
            and row.parent is not None
            and self._touches_ancestor(name)
            and active == self._active(row.parent)
        ):
            return self.get(row.parent)
        return active

    def _parent_value(self, name: str) -> object:
        row = self._reg.by_name.get(name)
        return self.get(row.parent) if row is not None and row.parent else "none"

    def _touches_ancestor(self, name: str) -> bool:
        row = self._reg.by_name.get(name)
        while row is not None and row.parent is not None:
            if row.parent in self._overlay:
                return True
            row = self._reg.by_name.get(row.parent)
        return False

    def exists(self, name: str) -> bool:
        return name in self._reg.by_name


@dataclass
class _Path:
    """The unit roundoffs of one computation, and what decided them."""

    u_out: float
    u_acc: float
    u_in: float = 0.0
    u_red: float = 0.0
    consulted: dict[str, object] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def note(self, name: str, value: object) -> None:
        self.consulted.setdefault(name, value)

    def say(self, line: str) -> None:
        self.lines.append(line)


def _precision_u(value: object) -> tuple[float, str] | None:
    if value == "bf16":
        return _BF16_U, "bf16"
    if value == "tf32":
        return _TF32_U, "tf32"
    return None


def _fp32_path(
    view: _FlagView,
    device: str,
    op: str | None,
    path: _Path,
    kernel: bool,
    shape: tuple[int, ...] | None = None,
    k: int | None = None,
) -> None:
    rows = _PRECISION_ROWS.get(device, {}).get(op, ())
    worst: tuple[float, str, str] | None = None
    for name in rows:
        library = name.split(".", 1)[0]
        switch = _LIBRARY_SWITCH.get(library)
        if switch is not None and view.exists(switch):
            enabled = view.get(switch)
            path.note(switch, enabled)
            if enabled is False:
                continue
        if view.exists(name):
            value = view.get(name)
        elif name in _LEGACY_TF32 and view.exists(_LEGACY_TF32[name]):
            legacy = _LEGACY_TF32[name]
            value = "tf32" if view.get(legacy) is True else "ieee"
            name = legacy
        else:
            continue
        path.note(name, value)
        found = _precision_u(value)
        if found is None:
            continue
        if kernel:
            used, source, why = kernel_precision(
                device, name, found[1], view.overlay, shape=_row_shape(name, op, shape), k=k
            )
        else:
            used, source, why = True, "worst case", "the flag's worst case (kernel=False)"
        path.sources.append(source)
        if not used:
            path.say(f"{name}={value!r} allowed {found[1]}, but {why}: fp32 arithmetic")
            continue
        if worst is None or found[0] > worst[0]:
            worst = (found[0], found[1], f"{name} ({why})")
    if worst is not None:
        path.u_in = worst[0]
        path.say(f"inputs rounded to {worst[1]} (u=2^{math.log2(worst[0]):.0f}) by {worst[2]}")


# --------------------------------------------------------- kernel precision


def _row_shape(row: str, op: str | None, shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The result shape to ask ``row``'s kernels about, for a result of ``op`` of ``shape``.

    A convolution that oneDNN lowers to a GEMM multiplies its ``(out_channels x k)``
    weights by ``(k x output pixels)`` columns per image, so its matmul row is
    asked about a ``(batch, out_channels, pixels)`` result; an RNN's GEMMs have
    shapes the result does not tell, so they are asked about the family.
    """
    if shape is None or _ROW_FAMILY.get(row) != "matmul" or op in ("matmul", None):
        return shape
    if op == "conv" and len(shape) >= 3:
        return (shape[0], shape[1], math.prod(shape[2:]))
    return None


# The op family each precision row governs (its probe computes one of those).
_ROW_FAMILY = {
    "mkldnn.matmul.fp32_precision": "matmul",
    "mkldnn.conv.fp32_precision": "conv",
    "mkldnn.rnn.fp32_precision": "rnn",
    "cuda.matmul.fp32_precision": "matmul",
    "cuda.matmul.allow_tf32": "matmul",
    "cudnn.conv.fp32_precision": "conv",
    "cudnn.rnn.fp32_precision": "rnn",
    "cudnn.allow_tf32": "conv",
}
# A flag's effect counts as reduced precision when the probe's output moved
# by more than this fraction of the mode's unit roundoff (normwise).  fp32
# kernels that merely block differently move it by ~1e-7, a bf16 path by
# ~2e-3 and a TF32 path by ~3e-4, so u/16 separates them by 10x each way.
_PROBE_FRACTION = 1 / 16


def kernel_precision(
    device: str,
    row: str,
    mode: str,
    overlay: Mapping[str, object] | None = None,
    *,
    shape: Sequence[int] | None = None,
    k: int | None = None,
) -> tuple[bool, str, str]:
    """Whether the kernels governed by ``row`` compute in ``mode`` (``bf16``/``tf32``).

    ``shape`` is the shape of the op's result and ``k`` its reduction length,
    where known: oneDNN picks its kernel per shape (on a CPU with AMX a
    64x256 @ 256x64 matmul computes in bf16 under ``fp32_precision="bf16"``
    while 64x8 @ 8x64 stays in f32, and a matrix-vector product may not use
    oneDNN at all), so the answer is for that shape.

    Returns ``(used, source, why)``.  The sources, in order:

    1. ``"primitive log"``: while oneDNN's log is captured (by default in a
       test whose backend configuration sets a reduced precision,
       ``--backends-verify``, :func:`pytest_backends.kernels.observe`) and a
       primitive of the row's op family ran with ``attr-fpmath:<mode>`` (for
       that result shape, when given), what that primitive did;
    2. ``"probe"``: a one-time run of the op family on this machine with the
       flag set to ``mode`` and to ``ieee``, compared (cached per process):
       of the same shape and reduction length when they are given, else of a
       64x256 @ 256x64 matmul, a conv or an LSTM;
    3. ``"worst case"``: where no probe can run (the device is missing, the
       op raised), the flag is assumed to take effect, and the reason says so.
    """
    family = _ROW_FAMILY.get(row)
    if family is None:
        return True, "worst case", f"the flag's worst case ({row} has no probe)"
    dims = None if shape is None else tuple(int(d) for d in shape)
    if device == "cpu" and row.startswith("mkldnn."):
        from pytest_backends.kernels import computed_precision

        seen = computed_precision(family, mode, dims, k)
        if seen is not None:
            precision, primitive = seen
            what = f"{primitive.impl} ({primitive.problem or primitive.kind})"
            if precision == mode:
                return True, "primitive log", f"primitive log: {what} computed in {mode}"
            return False, "primitive log", f"primitive log: {what} computed in f32"
    probe_shape = _probe_shape(family, dims, k)
    result = _probe(device, row, mode, dict(overlay or {}), probe_shape)
    if result is None:
        return True, "worst case", f"the flag's worst case (no {device} probe could run)"
    moved, effect = result
    what = f"a {family}" if probe_shape is None else f"a {family} of this shape"
    if moved:
        return True, "probe", f"probe: {what} on this machine moved by {effect:.2g} relative"
    return (
        False,
        "probe",
        (f"probe: {what} on this machine moved by {effect:.2g} relative, not {mode}-sized"),
    )


# Multiply-adds above which a same-shape probe is not run (the generic one is).
_PROBE_MAX_MACS = 2**28


def _probe_shape(
    family: str, dims: tuple[int, ...] | None, k: int | None
) -> tuple[tuple[int, ...], int] | None:
    """``(result shape, k)`` for a same-shape probe, or ``None`` for the generic probe."""
    if dims is None or k is None or family not in ("matmul", "conv") or any(d < 1 for d in dims):
        return None
    if family == "conv" and not 3 <= len(dims) <= 5:
        return None
    if math.prod(dims) * k > _PROBE_MAX_MACS:
        return None
    return dims, k


def _same_shape_inputs(
    device: str, family: str, dims: tuple[int, ...], k: int, gen: torch.Generator
) -> Callable[[], object]:
    if family == "matmul":
        if not dims:  # a dot product
            u, v = torch.randn(k, generator=gen), torch.randn(k, generator=gen)
            u, v = u.to(device), v.to(device)
            return lambda: u @ v
        if len(dims) == 1:  # a matrix-vector product
            m = torch.randn(dims[0], k, generator=gen).to(device)
            v = torch.randn(k, generator=gen).to(device)
            return lambda: m @ v
        *batch, rows, cols = dims
        a = torch.randn(*batch, rows, k, generator=gen).to(device)
        b = torch.randn(*batch, k, cols, generator=gen).to(device)
        return lambda: a @ b
    # a convolution with the result's batch, channels and size and the same k:
    # a 3-wide window where k allows it, else a pointwise one
    spatial = len(dims) - 2
    width = 3 if k % 3**spatial == 0 else 1
    cin = k // width**spatial
    x = torch.randn(dims[0], cin, *(d + width - 1 for d in dims[2:]), generator=gen)
    w = torch.randn(dims[1], cin, *([width] * spatial), generator=gen)
    x, w = x.to(device), w.to(device)
    conv = (
        torch.nn.functional.conv1d,
        torch.nn.functional.conv2d,
        torch.nn.functional.conv3d,
    )[spatial - 1]
    return lambda: conv(x, w)


def _probe_inputs(
    device: str, family: str, shape: tuple[tuple[int, ...], int] | None = None
) -> Callable[[], object] | None:
    gen = torch.Generator().manual_seed(20240611)
    if shape is not None:
        return _same_shape_inputs(device, family, shape[0], shape[1], gen)
    if family == "matmul":
        a = torch.randn(64, 256, generator=gen).to(device)
        b = torch.randn(256, 64, generator=gen).to(device)
        return lambda: a @ b
    if family == "conv":
        x = torch.randn(2, 64, 12, 12, generator=gen).to(device)
        w = torch.randn(32, 64, 3, 3, generator=gen).to(device)
        return lambda: torch.nn.functional.conv2d(x, w)
    if family == "rnn":
        with torch.random.fork_rng(devices=[]):
            lstm = torch.nn.LSTM(64, 64).to(device)
        with torch.no_grad():
            for param in lstm.parameters():
                param.copy_(torch.randn(param.shape, generator=gen).to(device) / 8)
        seq = torch.randn(8, 2, 64, generator=gen).to(device)
        return lambda: lstm(seq)[0]
    return None


# (device, row, mode, overlay, shape) -> (reduced?, relative size) or None; once per process
_PROBES: dict[tuple[str, str, str, str, str], tuple[bool, float] | None] = {}


def _probe(
    device: str,
    row: str,
    mode: str,
    settings: Mapping[str, object],
    shape: tuple[tuple[int, ...], int] | None = None,
) -> tuple[bool, float] | None:
    """Run the row's op family with the flag at ``mode`` and at its full-precision value."""
    key = (device, row, mode, repr(sorted(settings.items())), repr(shape))
    if key not in _PROBES:
        _PROBES[key] = _run_probe(device, row, mode, settings, shape)
    return _PROBES[key]


def _run_probe(
    device: str,
    row: str,
    mode: str,
    settings: Mapping[str, object],
    shape: tuple[tuple[int, ...], int] | None = None,
) -> tuple[bool, float] | None:
    from pytest_backends.effect import flag_effect
    from pytest_backends.flags import registry

    if device == "cuda" and not torch.cuda.is_available():
        return None
    if device not in ("cpu", "cuda") or row not in registry().by_name:
        return None
    family = _ROW_FAMILY[row]
    legacy = row.startswith(("cuda.matmul.allow", "cudnn.allow"))
    values: tuple[object, object] = (False, True) if legacy else ("ieee", mode)
    overlay = {k: v for k, v in settings.items() if k != row}
    try:
        from pytest_backends.flags import override_flags

        with override_flags(overlay), torch.no_grad(), _probe_scope():
            fn = _probe_inputs(device, family, shape)
            if fn is None:
                return None
            effect = flag_effect(fn, row, values, check_reproducible=False)
    except (RuntimeError, ValueError, NotImplementedError):
        return None
    size = effect.max_rel_diff[1]
    if size is None:
        return None
    u = _BF16_U if mode == "bf16" else _TF32_U
    return size > u * _PROBE_FRACTION, size


@contextlib.contextmanager
def _probe_scope() -> Iterator[None]:
    """Keep the probe out of a primitive log and op recording that may be running."""
    from pytest_backends.kernels import PROBE_SCOPE, paused_log

    with paused_log(), torch.profiler.record_function(PROBE_SCOPE):
        yield


def _half_path(
    view: _FlagView, device: str, op: str | None, dtype: torch.dtype, path: _Path
) -> None:
    short = "fp16" if dtype == torch.float16 else "bf16"
    rpr: list[str] = []
    if op in _GEMM_OPS:
        if device == "cuda":
            rpr.append(f"cuda.matmul.allow_{short}_reduced_precision_reduction")
            if dtype == torch.float16:
                name = "cuda.matmul.allow_fp16_accumulation"
                if view.exists(name):
                    value = view.get(name)
                    path.note(name, value)
                    if value is True:
                        path.u_acc = _FP16_U
                        path.say(f"fp16 accumulation (u=2^-11) by {name}")
        elif device == "cpu" and dtype == torch.float16:
            rpr.append("cpu.allow_fp16_reduced_precision_reduction")
    if op in (None, "sdpa"):
        rpr.append("sdp.allow_fp16_bf16_reduction_math")
    for name in rpr:
        if not view.exists(name):
            continue
        value = view.get(name)
        path.note(name, value)
        allowed = value[0] if isinstance(value, (tuple, list)) else value
        if allowed is True and path.u_red == 0.0:
            path.u_red = path.u_out
            path.say(f"partial sums rounded to {dtype_name(dtype)} by {name}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def _component(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def tolerance_for(
    dtype: torch.dtype | str,
    *,
    device: torch.device | str = "cpu",
    op: str | None = None,
    k: int | None = None,
    scale: float = 1.0,
    flags: Mapping[str, object] | None = None,
    kernel: bool = True,
    shape: Sequence[int] | None = None,
) -> Tolerance:
    """The model's ``(rtol, atol)`` for a result of ``dtype`` computed on ``device``.

    ``op`` names the op family (one of :data:`OP_FAMILIES`) so that only the
    flags governing it count; ``None`` means any op, so every precision flag
    of the device counts.  ``k`` is the reduction length (``None``: no
    reduction).  ``scale`` is the root-mean-square magnitude of the reduced
    terms (``a_i * b_i`` of a dot product), 1 for standard-normal inputs.
    ``flags`` overlays flag values on the active ones (for example a
    configuration's flags), without changing any global state.

    A reduced-precision flag (``fp32_precision="bf16"``/``"tf32"``) only
    *allows* the fast path.  With ``kernel=True`` (the default) the bound
    follows the precision the kernel used (:func:`kernel_precision`: oneDNN's
    primitive log where it is captured, else a one-time probe of the op
    family on this machine, else the flag's worst case); ``shape``, the
    shape of the result (:func:`assert_close` passes it), makes both the log
    and the probe answer for that shape and ``k``, since oneDNN picks its
    kernel per shape.  ``kernel=False`` always takes the flag's worst case.

    For an elementwise or unnamed op (``op`` ``"elementwise"`` or ``None``)
    the bound is never tighter than :func:`torch.testing.assert_close`'s
    defaults for the dtype, so torch's own kernels (vectorised ``gelu``,
    ``exp``) pass; named reductions keep the k-scaled model.

    Raises ``ValueError`` for an unknown op or dtype, ``k < 1`` or a bad
    scale or flag.
    """
    torch_dtype = _dtype(dtype)
    device_type = _device_type(device)
    op_family = _check_op(op)
    length = _check_k(k, op_family)
    s = _check_scale(scale)
    dims = _check_shape(shape)
    name = dtype_name(torch_dtype)
    if not (torch_dtype.is_floating_point or torch_dtype.is_complex):
        return Tolerance(0.0, 0.0, name, device_type, op_family, length, s, (), ("exact",))

    view = _FlagView(flags)
    real = _component(torch_dtype)
    finfo = torch.finfo(real)
    u_out = finfo.eps / 2
    u_acc = u_out if real == torch.float64 else min(u_out, 2.0**-24)
    path = _Path(u_out=u_out, u_acc=u_acc)
    if real == torch.float32:
        _fp32_path(
            view, device_type, op_family, path, kernel, dims, length if k is not None else None
        )
    elif real in (torch.float16, torch.bfloat16):
        _half_path(view, device_type, op_family, real, path)
    block = _CPU_BLOCK if device_type == "cpu" else length
    m = min(length, block)

    sqrt_k = math.sqrt(length)
    rounded = path.u_in + path.u_red
    rtol = path.u_out + 2 * rounded + path.u_acc * (_C_OP + m + (length - 1) // m)
    terms = _C_OP * path.u_acc + _C_INPUT * rounded * sqrt_k
    terms += _C_ACC_ABS * path.u_acc * math.sqrt(length * m)
    subnormal = finfo.eps * finfo.tiny  # the rounding error of a subnormal result
    atol = s * terms + subnormal
    acc_name = (
        "fp16"
        if path.u_acc == _FP16_U
        else dtype_name(torch.float64 if real == torch.float64 else torch.float32)
    )
    lines = list(path.lines)
    if length > 1:
        blocked = f", blocks of <= {block}" if block < length else ""
        lines.append(f"{acc_name} accumulation over k={length}{blocked}")
    lines.append(f"result rounded to {name}")
    floor = _TORCH_DEFAULTS.get(torch_dtype) if op_family in (None, "elementwise") else None
    if floor is not None and (floor[0] > rtol or floor[1] > atol):
        rtol, atol = max(rtol, floor[0]), max(atol, floor[1])
        lines.append(
            f"no tighter than torch.testing.assert_close's defaults for {name} "
            f"(rtol={floor[0]:.2g}, atol={floor[1]:.2g}): an elementwise or unnamed op"
        )
    consulted = tuple(path.consulted.items())
    source = "worst case" if "worst case" in path.sources else (path.sources or [""])[0]
    return Tolerance(
        rtol, atol, name, device_type, op_family, length, s, consulted, tuple(lines), source
    )


# torch.testing.assert_close's default (rtol, atol) per dtype: the floor for
# elementwise and unnamed ops, whose libm-style kernels torch itself accepts.
_TORCH_DEFAULTS: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


# --------------------------------------------------------------- comparison


def _is_reference_pair(actual: object, expected: object) -> bool:
    """``expected`` is a wider floating reference for ``actual`` (e.g. fp64 for fp32)."""
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        return False
    a, e = actual.dtype, expected.dtype
    if a == e or not (a.is_floating_point or a.is_complex):
        return False
    if a.is_complex != e.is_complex:
        return False
    return torch.finfo(e).eps < torch.finfo(a).eps


def assert_close(
    actual: Any,
    expected: Any,
    *,
    k: int | None = None,
    op: str | None = None,
    scale: float = 1.0,
    rtol: float | None = None,
    atol: float | None = None,
    kernel: bool = True,
    **kwargs: Any,
) -> None:
    """Like :func:`torch.testing.assert_close`, with tolerances from the active flags.

    The default ``rtol``/``atol`` come from :func:`tolerance_for` for
    ``actual``'s dtype and device, the op family ``op`` and the reduction
    length ``k``; an explicit ``rtol`` or ``atol`` wins over the model's.
    A reduced-precision flag widens the bound only where the kernel used
    that precision for a result of ``actual``'s shape (``kernel=False``:
    wherever the flag allows it; see :func:`tolerance_for`).
    ``expected`` may be a wider reference (an fp64 result for an fp32
    ``actual``, e.g. from :func:`reference`): ``actual`` is then compared in
    the reference's dtype.  Nested sequences and mappings are compared leaf
    by leaf, each with the tolerance of its own dtype.  Other keyword
    arguments go to :func:`torch.testing.assert_close`.

    On failure the message states the model's inputs (dtype, device, op, k,
    the flags that were consulted) and the bound.
    """
    op_family = _check_op(op)
    _check_k(k, op_family)
    _check_scale(scale)
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
        ):
            raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    user_msg = kwargs.pop("msg", None)
    for where, a, e in _tree.zip_leaves(actual, expected):
        leaf_kwargs = dict(kwargs)
        if isinstance(a, torch.Tensor):
            tol = tolerance_for(
                a.dtype,
                device=a.device,
                op=op_family,
                k=k,
                scale=scale,
                kernel=kernel,
                shape=tuple(a.shape),
            )
            if _is_reference_pair(a, e):
                a = a.to(e.dtype)
                leaf_kwargs["check_dtype"] = False
            leaf_rtol = tol.rtol if rtol is None else float(rtol)
            leaf_atol = tol.atol if atol is None else float(atol)
            message: str | Callable[[str], str] | None = (
                user_msg if user_msg is not None else _explain(tol, where, rtol, atol)
            )
            torch.testing.assert_close(
                a, e, rtol=leaf_rtol, atol=leaf_atol, msg=message, **leaf_kwargs
            )
        else:
            if rtol is not None or atol is not None:
                leaf_kwargs["rtol"] = float(rtol if rtol is not None else 0.0)
                leaf_kwargs["atol"] = float(atol if atol is not None else 0.0)
            torch.testing.assert_close(a, e, msg=user_msg, **leaf_kwargs)


def _explain(
    tol: Tolerance, where: str, rtol: float | None, atol: float | None
) -> Callable[[str], str]:
    def message(generated: str) -> str:
        lines = [generated, ""]
        if where:
            lines.append(f"compared element: {where}")
        lines.append(tol.describe())
        if rtol is not None or atol is not None:
            given = ", ".join(
                f"{n}={v!r}" for n, v in (("rtol", rtol), ("atol", atol)) if v is not None
            )
            lines.append(f"  explicit {given} replaced the model's value")
        if tol.k == 1 and tol.op != "elementwise":
            lines.append("  (k=1 assumed: pass k=<reduction length> for a matmul, conv or sum)")
        return "\n".join(lines)

    return message


# ---------------------------------------------------------------- reference


def _widen(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.detach().to(torch.complex128)
        if value.is_floating_point():
            return value.detach().to(torch.float64)
        return value
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(torch.float64)
    if isinstance(value, tuple):
        return tuple(_widen(v) for v in value)
    if isinstance(value, list):
        return [_widen(v) for v in value]
    if isinstance(value, dict):
        return {key: _widen(v) for key, v in value.items()}
    return value


def reference(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Compute ``fn(*args, **kwargs)`` in float64 from the same inputs.

    Floating tensors (also inside lists, tuples and dicts) are converted to
    float64 (complex ones to complex128) on their device; a
    :class:`torch.nn.Module`, passed as ``fn`` or as an argument, is replaced
    by a float64 copy.  The default dtype is float64 during the call, so
    tensors ``fn`` creates match.  Reduced-precision flags do not apply to
    float64 ops, so the result is the reference a reduced-precision path
    should be compared with::

        expected = pytest_backends.reference(torch.matmul, a, b)
        pytest_backends.assert_close(a @ b, expected, k=a.shape[-1], op="matmul")
    """
    from pytest_backends.flags import override_flags

    function = _widen(fn) if isinstance(fn, torch.nn.Module) else fn
    with override_flags({"default_dtype": "float64"}), torch.no_grad():
        return function(*_widen(args), **_widen(kwargs))


# ------------------------------------------------------------------ fixture


class BackendTolerance:
    """The value of the ``backend_tolerance`` fixture.

    ``rtol, atol = backend_tolerance`` gives the bound for the default dtype
    and no named op; ``backend_tolerance(torch.float16, op="matmul", k=512)``
    gives a :class:`Tolerance` for another dtype, op or reduction length.
    Both read the flags active at that moment (the current backend
    configuration's, as the plugin applies them around the test) and use the
    configuration's device.
    """

    def __init__(self, device: str, config: object | None = None) -> None:
        self.device = device
        self.config = config

    @classmethod
    def for_config(cls, config: object) -> BackendTolerance:
        """For a ``BackendConfig`` (or anything with a ``device`` attribute)."""
        device = getattr(config, "device", None) or "cpu"
        return cls(_device_type(str(device)), config)

    def __call__(
        self,
        dtype: torch.dtype | str | None = None,
        *,
        op: str | None = None,
        k: int | None = None,
        scale: float = 1.0,
        kernel: bool = True,
        shape: Sequence[int] | None = None,
    ) -> Tolerance:
        """The bound for ``dtype`` (default: torch's default dtype) on this device.

        Like :func:`tolerance_for`, it follows the precision the kernel used
        for a result of ``shape`` where given (``kernel=False``: the flags'
        worst case).
        """
        chosen = torch.get_default_dtype() if dtype is None else dtype
        return tolerance_for(
            chosen, device=self.device, op=op, k=k, scale=scale, kernel=kernel, shape=shape
        )

    def __iter__(self) -> Iterator[float]:
        return iter(self())

    def __repr__(self) -> str:
        rtol, atol = self()
        return f"BackendTolerance(device={self.device!r}, rtol={rtol:.3g}, atol={atol:.3g})"
