"""CUDA kernel names on a real GPU: the parser, the TF32/cuDNN promises, kernel-following bounds.

Skipped without a GPU.  The parser's rules were built from public traces
(tests/unit/test_cuda_kernel_names.py); here the GPU's own kernel names are
read back through ``torch.profiler`` and must classify.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pytest_backends import override_flags, tolerance_for
from pytest_backends.kernels import CudaKernel, classify_cuda_kernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

IEEE = {"cuda.matmul.fp32_precision": "ieee", "cudnn.conv.fp32_precision": "ieee"}
TF32 = {"cuda.matmul.fp32_precision": "tf32", "cudnn.conv.fp32_precision": "tf32"}


def _kernels(fn: Callable[[], object]) -> list[CudaKernel]:
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm up: handles, autotuning
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if "CUDA" in str(e.device_type)}
    return [classify_cuda_kernel(name) for name in sorted(names)]


def _ampere_or_newer() -> bool:
    return torch.cuda.get_device_capability()[0] >= 8


def test_fp32_matmul_kernels_classify_and_tf32_shows() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 1024, generator=gen).cuda()
    with override_flags(IEEE):
        ieee = _kernels(lambda: a @ a)
    with override_flags(TF32):
        tf32 = _kernels(lambda: a @ a)
    for kernels in (ieee, tf32):
        gemms = [k for k in kernels if k.role == "gemm"]
        assert gemms, [k.name for k in kernels]
        assert all(k.library in ("cublas", "cublasLt", "cutlass") for k in gemms)
    assert not any(k.tf32 for k in ieee), [k.name for k in ieee]
    if _ampere_or_newer():
        # TF32 kernels say so, or (cuBLASLt nvjet) do not name a precision at all
        assert any(k.tf32 or k.precision is None for k in tf32 if k.role == "gemm"), [
            k.name for k in tf32
        ]


def test_conv_and_sdpa_kernels_classify() -> None:
    x = torch.randn(8, 16, 32, 32, device="cuda")
    w = torch.randn(16, 16, 3, 3, device="cuda")
    with override_flags({"cudnn.enabled": True, **IEEE}):
        conv = _kernels(lambda: F.conv2d(x, w))
    assert any(k.library == "cudnn" for k in conv), [k.name for k in conv]
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for backend, library in (
        (SDPBackend.FLASH_ATTENTION, "flash"),
        (SDPBackend.EFFICIENT_ATTENTION, "mem_efficient"),
    ):
        with sdpa_kernel(backend):
            try:
                kernels = _kernels(lambda: F.scaled_dot_product_attention(q, q, q))
            except RuntimeError as exc:  # no kernel for this GPU
                pytest.skip(f"{backend} unavailable: {exc}")
        assert any(k.library == library and k.role == "sdpa" for k in kernels), [
            k.name for k in kernels
        ]


def test_tf32_bound_follows_the_gpu() -> None:
    with override_flags(TF32):
        tol = tolerance_for(torch.float32, device="cuda", op="matmul", k=1024)
    assert tol.precision_source == "probe"
    reduced = any(line.startswith("inputs rounded") for line in tol.path)
    assert reduced == _ampere_or_newer(), tol.describe()


CUDA_TESTS = """
    import pytest
    import torch
    import torch.nn.functional as F

    @pytest.mark.backends(tf32=["on", "off"], device="cuda")
    def test_mm():
        a = torch.randn(1024, 1024, device="cuda")
        (a @ a).sum().item()

    @pytest.mark.backends(cudnn="on", device="cuda")
    def test_conv():
        x = torch.randn(8, 16, 32, 32, device="cuda")
        F.conv2d(x, torch.randn(16, 16, 3, 3, device="cuda")).sum().item()
"""


def test_verify_reads_cuda_kernel_names(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cuda=CUDA_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-matrix", "--backends-verify", "--backends-report=r.json"
    )
    data = json.loads((pytester.path / "r.json").read_text())
    verdicts = {
        t["nodeid"].split("::")[1]: (t["verify"], t["verify_detail"]) for t in data["tests"]
    }
    assert verdicts, result.stdout.str()
    off = [v for k, v in verdicts.items() if "tf32-off" in k]
    assert off and all(status == "ok" for status, _ in off), verdicts
    on = [v for k, v in verdicts.items() if "tf32-on" in k]
    if _ampere_or_newer():
        assert on and all(status == "ok" for status, _ in on), verdicts
    conv = [v for k, v in verdicts.items() if "cudnn-on" in k]
    assert conv and all(status == "ok" and "cudnn kernels" in detail for status, detail in conv), (
        verdicts
    )
