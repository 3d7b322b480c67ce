"""Which precision paths the active flags let an fp32 or half-precision result take."""

from __future__ import annotations

import math

import torch

from pytest_backends.tolerance.kernel import ROW_FAMILY, kernel_precision
from pytest_backends.tolerance.model import (
    FP16_U,
    GEMM_OPS,
    LEGACY_TF32,
    LIBRARY_SWITCH,
    PRECISION_ROWS,
    SDPA_FUSED,
    dtype_name,
)
from pytest_backends.tolerance.view import FlagView, PrecisionPath, precision_u


def fp32_path(
    view: FlagView,
    device: str,
    op: str | None,
    path: PrecisionPath,
    kernel: bool,
    shape: tuple[int, ...] | None = None,
    k: int | None = None,
) -> None:
    rows = PRECISION_ROWS.get(device, {}).get(op, ())
    worst: tuple[float, str, str] | None = None
    for name in rows:
        library = name.split(".", 1)[0]
        switch = LIBRARY_SWITCH.get(library)
        if switch is not None and view.exists(switch):
            enabled = view.get(switch)
            path.note(switch, enabled)
            if enabled is False:
                continue
        if view.exists(name):
            value = view.get(name)
        elif name in LEGACY_TF32 and view.exists(LEGACY_TF32[name]):
            legacy = LEGACY_TF32[name]
            value = "tf32" if view.get(legacy) is True else "ieee"
            name = legacy
        else:
            continue
        path.note(name, value)
        found = precision_u(value)
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
    if shape is None or ROW_FAMILY.get(row) != "matmul" or op in ("matmul", None):
        return shape
    if op == "conv" and len(shape) >= 3:
        return (shape[0], shape[1], math.prod(shape[2:]))
    return None


# The op family each precision row governs (its probe computes one of those).
def half_path(
    view: FlagView, device: str, op: str | None, dtype: torch.dtype, path: PrecisionPath
) -> None:
    short = "fp16" if dtype == torch.float16 else "bf16"
    rpr: list[str] = []
    if op in GEMM_OPS:
        if device == "cuda":
            rpr.append(f"cuda.matmul.allow_{short}_reduced_precision_reduction")
            if dtype == torch.float16:
                name = "cuda.matmul.allow_fp16_accumulation"
                if view.exists(name):
                    value = view.get(name)
                    path.note(name, value)
                    if value is True:
                        path.u_acc = FP16_U
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
    _autocast(view, device, dtype, path)
    if op == "sdpa":
        fused = [name for name in SDPA_FUSED if view.exists(name) and view.get(name) is True]
        for name in fused:
            path.note(name, True)
        if fused:
            path.u_prob = path.u_out
            path.say(
                f"attention probabilities rounded to {dtype_name(dtype)} before P @ V "
                f"(fused kernel allowed by {', '.join(fused)}): <= u * sum_j P_ij |v_j|"
            )
    elif op == "rnn":
        path.u_cell = path.u_out
        path.say(
            f"cell state rounded to {dtype_name(dtype)} each step (gates, c and h): "
            "decays with the forget gate, so bounded across time steps"
        )


def _autocast(view: FlagView, device: str, dtype: torch.dtype, path: PrecisionPath) -> None:
    """Autocast, on while the bound is made, rounds fp32 inputs and weights to ``dtype``."""
    name = f"autocast.{device}.enabled"
    if not view.exists(name) or view.get(name) is not True:
        return
    path.note(name, True)
    cast = view.get(f"autocast.{device}.dtype")
    if cast in (dtype, dtype_name(dtype)) and path.u_in < path.u_out:
        path.u_in = path.u_out
        path.say(f"inputs rounded to {dtype_name(dtype)} by {name} (torch.autocast)")
