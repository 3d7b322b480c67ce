"""Skip reasons for configs this machine cannot run, and the report header."""

from __future__ import annotations

import pytest
from matrix_helpers import AVX512, LEGACY_FLAGS, NEW_API_FLAGS, machine

from pytest_backends.matrix.availability import Availability, header_lines, probe
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import unavailable_reason

REG = builtin_registry()
CPU_ONLY = machine()
GPU = machine(
    torch_version="2.13.0+cu130",
    cuda_built="13.0",
    cuda=True,
    cuda_devices=("NVIDIA H100",),
    cudnn=True,
    cudnn_version=91000,
)


def reason(choices: dict[str, str], avail: Availability = CPU_ONLY) -> str | None:
    config = REG.make(choices, available_flags=avail.flags, cuda_available=avail.cuda)
    return unavailable_reason(config, REG, avail)


@pytest.mark.parametrize(
    ("choices", "expected"),
    [
        (
            {"cudnn": "on"},
            "cudnn-on needs CUDA: torch.cuda.is_available() is False "
            "(torch 2.13.0+cpu is a CPU-only build)",
        ),
        ({"tf32": "on"}, "tf32-on needs CUDA: "),
        ({"sdpa": "efficient"}, "sdpa-efficient needs CUDA: "),
        ({"device": "cuda", "mkldnn": "off"}, "device-cuda needs CUDA: "),
        ({"cudnn": "on", "sdpa": "math"}, "cudnn-on needs CUDA: "),
        (
            {"device": "mps"},
            "device-mps needs MPS: torch.backends.mps.is_available() is False "
            "(torch 2.13.0+cpu was built without MPS)",
        ),
    ],
)
def test_gpu_configs_on_a_cpu_machine_name_what_is_missing(
    choices: dict[str, str], expected: str
) -> None:
    got = reason(choices)
    assert got is not None and got.startswith(expected), got


@pytest.mark.parametrize(
    "choices",
    [
        {"cudnn": "off"},
        {"sdpa": "math"},
        {"sdpa": "flash"},
        {"mkldnn": "on"},
        {"nnpack": "on"},
        {"tf32": "off"},
        {"rpr": "off"},
        {"deterministic": "on"},
        {"device": "cpu"},
        {"mkldnn_precision": "bf16"},
        {"cpu_capability": "avx512"},
    ],
)
def test_cpu_configs_run_on_a_cpu_machine(choices: dict[str, str]) -> None:
    assert reason(choices) is None


def test_cuda_build_without_a_gpu_says_so() -> None:
    avail = machine(torch_version="2.13.0+cu130", cuda_built="13.0")
    assert "was built for CUDA 13.0 but sees no GPU" in (reason({"cudnn": "on"}, avail) or "")


def test_on_a_gpu_machine() -> None:
    assert reason({"cudnn": "on", "tf32": "on", "sdpa": "cudnn"}, GPU) is None
    assert reason({"sdpa": "cudnn"}, machine(**{**GPU.__dict__, "cudnn": False})) == (
        "sdpa-cudnn needs cuDNN: torch.backends.cudnn.is_available() is False"
    )
    # a CPU-only value on an explicit CUDA device
    assert reason({"mkldnn": "on", "device": "cuda"}, GPU) == (
        "mkldnn-on only acts on CPU kernels; this config runs on device-cuda"
    )
    assert reason({"mkldnn": "off", "device": "cuda"}, GPU) is None


def test_device_mismatch_and_value_requirements() -> None:
    assert reason({"sdpa": "efficient", "device": "cpu"}) == (
        "sdpa-efficient only acts on CUDA kernels; this config runs on device-cpu"
    )
    assert reason({"mkldnn": "off", "mkldnn_precision": "bf16"}) == (
        "mkldnn_precision-bf16 needs mkldnn-on; this config has mkldnn-off"
    )


def test_mkldnn_precision_needs_cpu_support() -> None:
    no_bf16 = machine(cpu_features=frozenset({"avx2", "fma"}))
    got = reason({"mkldnn_precision": "bf16"}, no_bf16) or ""
    assert got.startswith("mkldnn_precision-bf16 needs a CPU with bf16 support in oneDNN")
    assert reason({"mkldnn_precision": "bf16"}, machine(cpu_features=AVX512)) is None
    assert "AMX-FP16" in (reason({"mkldnn_precision": "tf32"}) or "")
    assert reason({"mkldnn_precision": "tf32"}, machine(cpu_features=AVX512 | {"amxfp16"})) is None
    arm = machine(arch="aarch64", cpu_features=frozenset({"bf16"}))
    assert reason({"mkldnn_precision": "bf16"}, arm) is None


def test_missing_flags_in_an_old_torch() -> None:
    old = machine(
        torch_version="2.1.0",
        flags=LEGACY_FLAGS,
        absent_flags={"mkldnn.matmul.fp32_precision": "needs torch >= 2.9"},
    )
    assert reason({"mkldnn_precision": "bf16"}, old) == (
        "mkldnn_precision-bf16 needs flag 'mkldnn.matmul.fp32_precision', which torch 2.1.0 "
        "lacks (needs torch >= 2.9)"
    )
    assert "needs flag 'sdp.cudnn'" in (
        reason({"sdpa": "cudnn"}, machine(**{**GPU.__dict__, "flags": LEGACY_FLAGS})) or ""
    )


def test_cpu_capability_levels() -> None:
    assert reason({"cpu_capability": "avx512"}) is None
    assert reason({"cpu_capability": "avx2"}) == (
        "cap-avx2 runs in a process of its own (ATEN_CPU_CAPABILITY=avx2 is read once, when "
        "torch is imported); this process runs torch's AVX512 kernels: add "
        "--backends-cpu-capability=avx2 to run it in an xdist worker of that level"
    )
    got = reason({"cpu_capability": "vsx"}) or ""
    assert got.startswith("cap-vsx cannot run on this machine: vsx is a CPU level of ppc64le")
    no_avx512 = machine(cpu_features=frozenset({"avx2", "fma"}), cpu_capability="AVX2")
    assert "lacks avx512f" in (reason({"cpu_capability": "avx512"}, no_avx512) or "")


def test_header_lines() -> None:
    lines = header_lines(GPU)
    assert lines[0].startswith("backends: torch 2.13.0+cu130; CUDA: yes (CUDA 13.0, NVIDIA H100)")
    assert "cuDNN: yes (91000)" in lines[0] and "cuSPARSELt: no" in lines[0]
    assert lines[1] == (
        "backends: CPU capability: AVX512 (x86_64); MKL: yes; MKL-DNN: yes; NNPACK: yes; "
        "OpenMP: yes; opt_einsum: no"
    )
    assert "CUDA: no (CPU-only build)" in header_lines(CPU_ONLY)[0]


def test_probe_reads_the_real_torch() -> None:
    import torch

    avail = probe()
    assert avail.torch_version == torch.__version__
    assert avail.cuda == torch.cuda.is_available()
    assert avail.mkldnn == torch.backends.mkldnn.is_available()
    assert avail.nnpack == torch.backends.nnpack.is_available()
    assert avail.cpu_capability == torch.backends.cpu.get_cpu_capability().replace(" ", "")
    assert "mkldnn.enabled" in avail.flags
    assert avail.flags <= NEW_API_FLAGS | avail.flags  # the registry's names, not ours
