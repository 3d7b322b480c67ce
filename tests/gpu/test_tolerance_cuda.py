"""Tolerances and flag effects on CUDA: TF32, RPR, fp16 accumulation (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from pytest_backends import assert_close, flag_effect, override_flags, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to TF32's 10 explicit mantissa bits (nearest, ties to even)."""
    raw = t.contiguous().view(torch.int32)
    bias = ((raw >> 13) & 1) + ((1 << 12) - 1)
    return ((raw + bias) & ~((1 << 13) - 1)).view(torch.float32)


def _inputs(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=gen).cuda() for shape in shapes]


def test_tf32_rounded_result_needs_the_tf32_bound() -> None:
    a, b = _inputs((256, 1024), (1024, 256))
    with override_flags({"cuda.matmul.fp32_precision": "ieee"}):
        actual = _round_to_tf32(a) @ _round_to_tf32(b)  # a stand-in for a TF32 path
    expected = reference(torch.matmul, a, b)
    rel = float((actual.double() - expected).norm() / expected.norm())
    assert 1e-4 < rel < 1e-3
    with pytest.raises(AssertionError):
        torch.testing.assert_close(actual, expected.float())
    with override_flags({"cuda.matmul.fp32_precision": "tf32"}):
        assert_close(actual, expected, k=1024, op="matmul")
    with override_flags({"cuda.matmul.fp32_precision": "ieee"}), pytest.raises(AssertionError):
        assert_close(actual, expected, k=1024, op="matmul")


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_real_cuda_matmul_and_conv_stay_within_the_bound(precision: str) -> None:
    a, b = _inputs((512, 2048), (2048, 512))
    x, w = _inputs((8, 64, 32, 32), (64, 64, 3, 3))
    flags = {"cuda.matmul.fp32_precision": precision, "cudnn.conv.fp32_precision": precision}
    with override_flags(flags):
        assert_close(a @ b, reference(torch.matmul, a, b), k=2048, op="matmul")
        conv = torch.nn.functional.conv2d
        assert_close(conv(x, w), reference(conv, x, w), k=64 * 9, op="conv")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rpr", [False, True])
def test_half_gemms_stay_within_the_bound(dtype: torch.dtype, rpr: bool) -> None:
    a, b = (t.to(dtype) for t in _inputs((256, 4096), (4096, 256)))
    short = "fp16" if dtype == torch.float16 else "bf16"
    with override_flags({f"cuda.matmul.allow_{short}_reduced_precision_reduction": rpr}):
        assert_close(a @ b, reference(torch.matmul, a, b), k=4096, op="matmul")


def test_fp16_accumulation_stays_within_the_bound() -> None:
    a, b = (t.half() for t in _inputs((256, 1024), (1024, 256)))
    try:
        with override_flags({"cuda.matmul.allow_fp16_accumulation": True}):
            assert_close(a @ b, reference(torch.matmul, a, b), k=1024, op="matmul")
    except ValueError as exc:  # the flag does not exist in this torch
        pytest.skip(str(exc))


def test_rpr_verdict_agrees_with_a_direct_comparison() -> None:
    a, b = (t.half() for t in _inputs((1024, 16384), (16384, 1024)))
    flag = "cuda.matmul.allow_fp16_reduced_precision_reduction"

    def fn() -> torch.Tensor:
        return a @ b

    with override_flags({flag: False}):
        off = fn()
    with override_flags({flag: True}):
        on = fn()
    differs = not torch.equal(off.view(torch.int16), on.view(torch.int16))
    result = flag_effect(fn, flag, [False, True])
    if result.reproducible:
        assert result.has_effect == differs, str(result)


def test_cpu_flag_has_no_effect_on_a_cuda_matmul() -> None:
    a, b = _inputs((256, 256), (256, 256))
    result = flag_effect(lambda: a @ b, "mkldnn.matmul.fp32_precision", ["ieee", "bf16"])
    assert result.verdict == "no effect"
