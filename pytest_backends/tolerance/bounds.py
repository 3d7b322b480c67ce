"""From dtype, device, op and flags to an elementwise bound: :func:`tolerance_for`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from pytest_backends.tolerance.model import (
    C_ACC_ABS,
    C_INPUT,
    C_OP,
    C_RNN_CELL,
    C_SDPA_PROB,
    CPU_BLOCK,
    FP16_U,
    TORCH_DEFAULTS,
    Tolerance,
    as_device_type,
    as_dtype,
    check_k,
    check_op,
    check_scale,
    check_shape,
    component_dtype,
    dtype_name,
)
from pytest_backends.tolerance.paths import fp32_path, half_path
from pytest_backends.tolerance.view import FlagView, PrecisionPath


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
    of the device counts.  ``"mean"`` is a ``"reduction"`` (a sum) of the
    terms ``x_i / k``: its ``scale`` is divided by ``k``.  ``k`` is the
    reduction length (``None``: no reduction).  ``scale`` is the
    root-mean-square magnitude of the reduced terms (``a_i * b_i`` of a dot
    product), 1 for standard-normal inputs.
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

    For an fp16/bf16 result, ``op="sdpa"`` adds ``u * scale`` to ``atol`` while a
    fused attention kernel is enabled (it rounds the probabilities before
    ``P @ V``; ``scale`` is then the rms of ``v``), ``op="rnn"`` adds ``6 u`` (a
    cell's per-step roundings of its gates and state, which saturate over the
    sequence), and while autocast is on for ``device`` and ``dtype`` the inputs
    count as rounded to ``dtype``.

    Raises ``ValueError`` for an unknown op or dtype, ``k < 1`` or a bad
    scale or flag.
    """
    if op == "mean":  # a sum of x_i / k: its terms' scale is the inputs' over k
        op, scale = "reduction", check_scale(scale) / check_k(k, "reduction")
    torch_dtype = as_dtype(dtype)
    device_type = as_device_type(device)
    op_family = check_op(op)
    length = check_k(k, op_family)
    s = check_scale(scale)
    dims = check_shape(shape)
    name = dtype_name(torch_dtype)
    if not (torch_dtype.is_floating_point or torch_dtype.is_complex):
        return Tolerance(0.0, 0.0, name, device_type, op_family, length, s, (), ("exact",))

    view = FlagView(flags)
    real = component_dtype(torch_dtype)
    finfo = torch.finfo(real)
    u_out = finfo.eps / 2
    u_acc = u_out if real == torch.float64 else min(u_out, 2.0**-24)
    path = PrecisionPath(u_out=u_out, u_acc=u_acc)
    if real == torch.float32:
        fp32_path(
            view, device_type, op_family, path, kernel, dims, length if k is not None else None
        )
    elif real in (torch.float16, torch.bfloat16):
        half_path(view, device_type, op_family, real, path)
    block = CPU_BLOCK if device_type == "cpu" else length
    m = min(length, block)

    sqrt_k = math.sqrt(length)
    rounded = path.u_in + path.u_red
    rtol = path.u_out + 2 * rounded + path.u_acc * (C_OP + m + (length - 1) // m)
    terms = C_OP * path.u_acc + C_INPUT * rounded * sqrt_k
    terms += C_ACC_ABS * path.u_acc * math.sqrt(length * m)
    subnormal = finfo.eps * finfo.tiny  # the rounding error of a subnormal result
    atol = s * terms + subnormal
    # fused attention: u * sum_j P_ij |v_j|, a P-weighted mean of |v| (rms s);
    # a recurrent cell: roundings of values bounded by 1, independent of s
    atol += C_SDPA_PROB * path.u_prob * s + C_RNN_CELL * path.u_cell
    acc_name = (
        "fp16"
        if path.u_acc == FP16_U
        else dtype_name(torch.float64 if real == torch.float64 else torch.float32)
    )
    lines = list(path.lines)
    if length > 1:
        blocked = f", blocks of <= {block}" if block < length else ""
        lines.append(f"{acc_name} accumulation over k={length}{blocked}")
    lines.append(f"result rounded to {name}")
    floor = TORCH_DEFAULTS.get(torch_dtype) if op_family in (None, "elementwise") else None
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
