"""Unit tests of the tolerance model: which flags apply, growth with k, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_backends import override_flags, snapshot_flags
from pytest_backends.tolerance import OP_FAMILIES, Tolerance
from pytest_backends.tolerance import tolerance_for as _tolerance_for


def tolerance_for(*args: object, **kwargs: object) -> Tolerance:
    """The flag model itself (``kernel=False``), so these checks hold on every CPU.

    How the kernel's real precision narrows it is tested in test_tolerance_kernel.py.
    """
    return _tolerance_for(*args, kernel=False, **kwargs)  # type: ignore[arg-type]


def test_unpacks_as_rtol_atol() -> None:
    tol = tolerance_for(torch.float32, op="matmul", k=64)
    rtol, atol = tol
    assert isinstance(tol, Tolerance)
    assert (rtol, atol) == (tol.rtol, tol.atol)
    assert 0 < rtol < 1e-4 and 0 < atol < 1e-3


def test_bound_grows_like_sqrt_k_for_reduced_precision_inputs() -> None:
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        atols = {k: tolerance_for(torch.float32, op="matmul", k=k).atol for k in (64, 256, 1024)}
    assert atols[64] < atols[256] < atols[1024]
    # the input-rounding term dominates: 4x the reduction length, 2x the bound
    assert atols[1024] / atols[256] == pytest.approx(2.0, rel=0.05)
    assert atols[256] / atols[64] == pytest.approx(2.0, rel=0.05)


def test_ieee_bound_grows_with_k_too() -> None:
    small = tolerance_for(torch.float32, op="matmul", k=16)
    large = tolerance_for(torch.float32, op="matmul", k=4096)
    assert large.atol > 10 * small.atol
    assert large.rtol > small.rtol


def test_precision_flags_order_the_bounds_on_cpu() -> None:
    bounds = {}
    for value in ("ieee", "tf32", "bf16"):
        with override_flags({"mkldnn.matmul.fp32_precision": value}):
            bounds[value] = tolerance_for(torch.float32, op="matmul", k=1024)
    assert bounds["ieee"].atol < bounds["tf32"].atol < bounds["bf16"].atol
    assert bounds["ieee"].rtol < bounds["tf32"].rtol < bounds["bf16"].rtol
    assert dict(bounds["bf16"].flags)["mkldnn.matmul.fp32_precision"] == "bf16"
    assert any("bf16" in line for line in bounds["bf16"].path)


def test_only_the_flags_of_the_named_op_apply() -> None:
    with override_flags({"mkldnn.conv.fp32_precision": "bf16"}):
        matmul = tolerance_for(torch.float32, op="matmul", k=256)
        conv = tolerance_for(torch.float32, op="conv", k=256)
        unknown = tolerance_for(torch.float32, k=256)
        reduction = tolerance_for(torch.float32, op="reduction", k=256)
    ieee = tolerance_for(torch.float32, op="matmul", k=256)
    assert matmul == ieee
    assert reduction.atol == ieee.atol and reduction.flags == ()
    assert conv.atol > 100 * ieee.atol
    assert unknown.atol == conv.atol  # op=None: any op, so every precision flag counts
    assert "mkldnn.conv.fp32_precision" not in dict(matmul.flags)


def test_precision_flags_do_not_apply_with_onednn_disabled() -> None:
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16", "mkldnn.enabled": False}):
        tol = tolerance_for(torch.float32, op="matmul", k=1024)
    assert tol.atol == tolerance_for(torch.float32, op="matmul", k=1024).atol
    assert dict(tol.flags)["mkldnn.enabled"] is False


def test_generic_precision_is_inherited_by_the_leaves() -> None:
    with override_flags({"mkldnn.fp32_precision": "bf16"}):
        inherited = tolerance_for(torch.float32, op="matmul", k=512)
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        direct = tolerance_for(torch.float32, op="matmul", k=512)
    assert inherited == direct


def test_overlay_does_not_change_global_state() -> None:
    before = snapshot_flags()
    tol = tolerance_for(
        torch.float32, op="matmul", k=1024, flags={"mkldnn.matmul.fp32_precision": "bf16"}
    )
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        assert tol == tolerance_for(torch.float32, op="matmul", k=1024)
    assert snapshot_flags() == before


def test_cuda_tf32_bounds_follow_cublas_and_cudnn_flags() -> None:
    ieee = {"cuda.matmul.fp32_precision": "ieee", "cudnn.conv.fp32_precision": "ieee"}
    base = tolerance_for(torch.float32, device="cuda", op="matmul", k=1024, flags=ieee)
    tf32_mm = tolerance_for(
        torch.float32,
        device="cuda",
        op="matmul",
        k=1024,
        flags={**ieee, "cuda.matmul.fp32_precision": "tf32"},
    )
    conv_only = {**ieee, "cudnn.conv.fp32_precision": "tf32"}
    conv = tolerance_for(torch.float32, device="cuda", op="conv", k=1024, flags=conv_only)
    mm_under_conv_flag = tolerance_for(
        torch.float32, device="cuda", op="matmul", k=1024, flags=conv_only
    )
    assert tf32_mm.atol > 100 * base.atol
    assert conv.atol == tf32_mm.atol
    assert mm_under_conv_flag == base
    # the same flag on the CPU matters nothing for a CPU result
    cpu = tolerance_for(
        torch.float32,
        device="cpu",
        op="matmul",
        k=1024,
        flags={"cuda.matmul.fp32_precision": "tf32"},
    )
    assert cpu.atol == tolerance_for(torch.float32, op="matmul", k=1024).atol
    # a conv with cuDNN disabled is not governed by cudnn.conv.fp32_precision
    no_cudnn = tolerance_for(
        torch.float32, device="cuda", op="conv", k=1024, flags={**conv_only, "cudnn.enabled": False}
    )
    assert no_cudnn.atol == base.atol


def test_cuda_reduced_precision_reductions_and_fp16_accumulation() -> None:
    off = {
        "cuda.matmul.allow_fp16_reduced_precision_reduction": False,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": False,
        "cuda.matmul.allow_fp16_accumulation": False,
    }
    for dtype, flag in (
        (torch.float16, "cuda.matmul.allow_fp16_reduced_precision_reduction"),
        (torch.bfloat16, "cuda.matmul.allow_bf16_reduced_precision_reduction"),
    ):
        plain = tolerance_for(dtype, device="cuda", op="matmul", k=1024, flags=off)
        rpr = tolerance_for(dtype, device="cuda", op="matmul", k=1024, flags={**off, flag: True})
        assert rpr.rtol > plain.rtol and rpr.atol > plain.atol
        assert dict(rpr.flags)[flag] == (True, True)
    fp16 = tolerance_for(torch.float16, device="cuda", op="matmul", k=1024, flags=off)
    acc = tolerance_for(
        torch.float16,
        device="cuda",
        op="matmul",
        k=1024,
        flags={**off, "cuda.matmul.allow_fp16_accumulation": True},
    )
    assert acc.atol > 100 * fp16.atol
    assert any("fp16 accumulation" in line for line in acc.path)


def test_reduced_precision_dtype_bounds_cover_output_rounding() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        tol = tolerance_for(dtype, op="matmul", k=64)
        assert tol.rtol >= torch.finfo(dtype).eps / 2


def test_scale_multiplies_atol_only() -> None:
    one = tolerance_for(torch.float32, op="matmul", k=256)
    ten = tolerance_for(torch.float32, op="matmul", k=256, scale=10.0)
    assert ten.rtol == one.rtol
    assert ten.atol == pytest.approx(10 * one.atol, rel=1e-6)


def test_integer_results_are_exact() -> None:
    assert tuple(tolerance_for(torch.int64, op="matmul", k=8)) == (0.0, 0.0)


def test_dtype_and_device_accept_names() -> None:
    assert tolerance_for("float16", device=torch.device("cpu")) == tolerance_for(torch.float16)


def test_describe_states_the_model_inputs() -> None:
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        text = tolerance_for(torch.float32, op="matmul", k=1024).describe()
    for part in (
        "float32",
        "cpu",
        "op='matmul'",
        "k=1024",
        "mkldnn.matmul.fp32_precision='bf16'",
        "rtol=",
        "atol=",
    ):
        assert part in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be a positive int"),
        ({"k": -3}, "k must be a positive int"),
        ({"k": 2.5}, "k must be a positive int"),
        ({"k": True}, "k must be a positive int"),
        ({"op": "gemm"}, "unknown op 'gemm'"),
        ({"op": "elementwise", "k": 4}, "op='elementwise' has no reduction"),
        ({"scale": 0}, "scale must be a positive finite number"),
        ({"scale": math.nan}, "scale must be a positive finite number"),
        ({"flags": {"mkldnn.matmul.fp32_precision": "fp8"}}, "mkldnn.matmul.fp32_precision"),
        ({"flags": {"no.such.flag": 1}}, "unknown backend flag"),
    ],
)
def test_bad_input_is_a_clear_value_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tolerance_for(torch.float32, **kwargs)  # type: ignore[arg-type]


def test_unknown_op_lists_the_families() -> None:
    with pytest.raises(ValueError) as info:
        tolerance_for(torch.float32, op="attention")
    assert all(repr(op) in str(info.value) for op in OP_FAMILIES)


def test_bad_dtype_and_device() -> None:
    with pytest.raises(ValueError, match="dtype"):
        tolerance_for("float33")
    with pytest.raises(ValueError, match="device"):
        tolerance_for(torch.float32, device="gpu0")


def test_a_numpy_integer_k_is_an_int() -> None:
    """``k`` computed from a NumPy shape (``np.int64``) is the same bound as the int."""
    np = pytest.importorskip("numpy")
    assert tolerance_for(torch.float32, k=np.int64(64)) == tolerance_for(torch.float32, k=64)
    with pytest.raises(ValueError, match="k must be a positive int"):
        tolerance_for(torch.float32, k=np.int64(0))
