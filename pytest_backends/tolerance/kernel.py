"""The kernel that really ran: :func:`kernel_precision` narrows a flag's worst case to it.

Where no primitive log says which kernel computed a result, a probe runs the op
once on a same-shape input to see which kernel oneDNN picks; a probe's answer is
cached per (family, dtype, shape, flags) for the session."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from pytest_backends.flags import registry
from pytest_backends.tolerance.model import BF16_U, TF32_U

ROW_FAMILY = {
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
    family = ROW_FAMILY.get(row)
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

    if device == "cuda" and not torch.cuda.is_available():
        return None
    if device not in ("cpu", "cuda") or row not in registry().by_name:
        return None
    family = ROW_FAMILY[row]
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
    u = BF16_U if mode == "bf16" else TF32_U
    return size > u * _PROBE_FRACTION, size


@contextlib.contextmanager
def _probe_scope() -> Iterator[None]:
    """Keep the probe out of a primitive log and op recording that may be running."""
    from pytest_backends.kernels import PROBE_SCOPE, paused_log

    with paused_log(), torch.profiler.record_function(PROBE_SCOPE):
        yield
