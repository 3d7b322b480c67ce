"""Batch invariance of cuBLAS GEMMs and SDPA kernels (skipped without a GPU).

cuBLAS picks split-K (a reduction over K split across thread blocks) for
small M, N and large K, so row 0 of a one-row product and of a many-row
product are summed in another order. Each test measures the difference
itself first and skips, with the figure, where this GPU's kernels happen to
be invariant at the size.
"""

from __future__ import annotations

import pytest
import torch

from pytest_backends import BatchInvarianceError, assert_batch_invariant

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(("rows", "k", "n"), [(64, 32768, 64), (256, 16384, 128)])
def test_cublas_mm_at_split_k_sizes_is_batch_variant(rows: int, k: int, n: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(rows, k, device="cuda", generator=gen)
    b = torch.randn(k, n, device="cuda", generator=gen)
    measured = float((torch.mm(a[:1], b) - torch.mm(a, b)[:1]).abs().max())
    if measured == 0.0:
        pytest.skip(f"cuBLAS mm is batch-invariant here at {rows}x{k} @ {k}x{n} (measured 0)")
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(torch.mm, a, b, dim=(0, None), sizes=(1, 2), permute=False)
    finding = info.value.finding
    assert finding is not None and finding.op == "aten::mm" and finding.device == "cuda"
    assert info.value.case.max_abs >= measured


def test_cublas_mm_tolerance_mode_reports_the_figure() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(64, 32768, device="cuda", generator=gen)
    b = torch.randn(32768, 64, device="cuda", generator=gen)
    result = assert_batch_invariant(torch.mm, a, b, dim=(0, None), tolerance="report")
    assert result.invariant == (result.max_abs == 0.0)
    assert len(result.cases) > 0
    # Split-K reorders an fp32 sum of 32768 products: far below 1e-2 of a ~180-sized value.
    assert result.max_abs < 1e-1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_batch_invariance_is_checked_forward_and_backward(dtype: torch.dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(16, 8, 256, 64, device="cuda", dtype=dtype, generator=gen).requires_grad_()
        for _ in range(3)
    )
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.no_grad():
        measured = float((sdpa(q[:1], k[:1], v[:1]) - sdpa(q, k, v)[:1]).abs().max())
    try:
        result = assert_batch_invariant(sdpa, q, k, v)
    except BatchInvarianceError as error:
        assert error.case.max_abs > 0
        finding = error.finding
        assert finding is not None
        if finding.kind == "op":
            assert finding.op is not None and "attention" in finding.op
        return
    if measured != 0.0:
        raise AssertionError(f"row 0 differs by {measured} but the check passed")
    assert result.invariant
    assert result.backward.startswith("input gradients compared")
