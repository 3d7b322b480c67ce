"""The tolerance model's vocabulary and constants, :class:`Tolerance`, and input checks."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass

import torch

#: Op families the model knows; each selects the precision flags that apply.
OP_FAMILIES = ("matmul", "conv", "rnn", "sdpa", "reduction", "elementwise")

# Multipliers of the model (the explanation page derives them; the
# calibration in benchmarks/calibrate_tolerance.py checks them).
# Ulps allowed for the op's own arithmetic, independent of k (vectorised libm
# functions are within a few ulps).
C_OP = 4.0
# Input rounding: the error of a length-k dot product whose inputs are
# rounded to unit roundoff u has a standard deviation of about 0.58 u sqrt(k) s
# for random data; 6 u sqrt(k) s is about 10 of those.
C_INPUT = 6.0
# Accumulation, random-sign terms: rounding the running sum contributes a
# standard deviation of about 0.17 u sqrt(k m) s (m = terms summed one after
# the other, partial sums grow like sqrt(j) s).  The error is a scale mixture
# with heavy tails (maxima of 12 standard deviations were seen), so 4 u is
# about 24 of those.
C_ACC_ABS = 4.0
# Accumulation, same-sign terms: the rounding errors can all point the same
# way (constant inputs), so the relative part takes the worst case of
# sequential summation, u (m + k/m): within a block, then across blocks.
# CPU GEMM and oneDNN kernels block the reduction dimension (measured on
# x86: the error follows sequential summation up to k = 256 and grows like
# sqrt(k) beyond).  GPU GEMMs keep one accumulator across the whole
# reduction, so no block is assumed there.
CPU_BLOCK = 256

# Fused attention in fp16/bf16 (flash, memory-efficient, cuDNN kernels) rounds the
# softmax probabilities P to the result dtype before P @ V, so each output
# element gains an error of at most u * sum_j P_ij |v_j|: a P-weighted mean of
# |v|, about 0.8 s for randn values (s = rms of v), which does not shrink where
# the output cancels.  The rounding errors have random signs, so the measured
# maximum is 0.4 u s (shapes up to 1024 keys): 1 u s keeps the bound tight.
C_SDPA_PROB = 1.0
# The kernels whose P is rounded to the result dtype (the math kernel computes
# fp16/bf16 attention in fp32 unless sdp.allow_fp16_bf16_reduction_math is set).
SDPA_FUSED = ("sdp.flash", "sdp.mem_efficient", "sdp.cudnn", "sdp.fa3")
# An fp16/bf16 recurrent cell rounds its state several times a step, each
# rounding at most u of a value bounded by 1 (gates in (0, 1), h and tanh(c) in
# (-1, 1)): an LSTM's gate pre-activations (through sigmoid' <= 1/4, tanh' <= 1),
# its four gates, f*c, i*g, c, tanh(c) and o*tanh(c), nine roundings; a GRU's
# and a tanh RNN's fewer.  Their random-sign sum has an rms of about
# sqrt(9/3) u = 1.7 u a step, and the errors carried in c and h decay with the
# forget gate and sigmoid'/tanh' (contraction about 1/2 at the default
# initialisation), so they saturate after a few steps instead of growing with
# the sequence: measured maxima are 0.8 u after one step and 4 u after 32 to
# 128 steps (LSTM, GRU, RNN; fp16 and bf16).  6 u is about 3.5 rms of the
# saturated error, and independent of the inputs' scale since h is bounded.
C_RNN_CELL = 6.0

TF32_U = 2.0**-11  # 10 explicit mantissa bits, round to nearest
BF16_U = 2.0**-8
FP16_U = 2.0**-11

# Which fp32_precision rows govern an op family, per device.  A conv or RNN
# may be lowered to a GEMM, so the matmul row applies to them as well; an
# unknown op (None) gets every row.
PRECISION_ROWS: dict[str, dict[str | None, tuple[str, ...]]] = {
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
LIBRARY_SWITCH = {"mkldnn": "mkldnn.enabled", "cudnn": "cudnn.enabled"}
# Legacy booleans read when the fp32_precision API is missing (torch < 2.9).
LEGACY_TF32 = {
    "cuda.matmul.fp32_precision": "cuda.matmul.allow_tf32",
    "cudnn.conv.fp32_precision": "cudnn.allow_tf32",
    "cudnn.rnn.fp32_precision": "cudnn.allow_tf32",
}
GEMM_OPS = (None, "matmul", "conv", "rnn")


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


def as_dtype(dtype: object) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise ValueError(f"dtype must be a torch.dtype or its name, got {dtype!r}")


def as_device_type(device: object) -> str:
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        try:
            return torch.device(device).type
        except RuntimeError:
            pass
    raise ValueError(f"device must be a torch.device or a device string, got {device!r}")


def check_k(k: object, op: str | None) -> int:
    if k is None:
        return 1
    if not isinstance(k, (bool, int)) and hasattr(k, "__index__"):
        k = operator.index(k)  # a NumPy integer, computed from shapes
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


def check_op(op: object) -> str | None:
    if op is None or (isinstance(op, str) and op in OP_FAMILIES):
        return op
    raise ValueError(f"unknown op {op!r}; choose one of {', '.join(map(repr, OP_FAMILIES))}")


def check_shape(shape: object) -> tuple[int, ...] | None:
    if shape is None:
        return None
    if isinstance(shape, (tuple, list, torch.Size)) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        return tuple(int(d) for d in shape)
    raise ValueError(
        f"shape must be a sequence of non-negative ints (a result's shape), got {shape!r}"
    )


def check_scale(scale: object) -> float:
    if (
        isinstance(scale, (int, float))
        and not isinstance(scale, bool)
        and math.isfinite(scale)
        and scale > 0
    ):
        return float(scale)
    raise ValueError(f"scale must be a positive finite number, got {scale!r}")


# ---------------------------------------------------------------------- flags


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def component_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


TORCH_DEFAULTS: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


# --------------------------------------------------------------- comparison
