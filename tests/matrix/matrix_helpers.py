"""Fake machines and flag sets for the matrix tests."""

from __future__ import annotations

from typing import Any

from pytest_backends.matrix.availability import Availability

#: Every flag a torch >= 2.9 build has that the built-in axes can set.
NEW_API_FLAGS = frozenset(
    {
        "cudnn.enabled",
        "cudnn.benchmark",
        "cudnn.deterministic",
        "cudnn.allow_tf32",
        "cudnn.fp32_precision",
        "cudnn.conv.fp32_precision",
        "cudnn.rnn.fp32_precision",
        "mkldnn.enabled",
        "mkldnn.deterministic",
        "mkldnn.fp32_precision",
        "mkldnn.matmul.fp32_precision",
        "mkldnn.conv.fp32_precision",
        "mkldnn.rnn.fp32_precision",
        "cuda.matmul.allow_tf32",
        "cuda.matmul.fp32_precision",
        "cuda.matmul.allow_fp16_reduced_precision_reduction",
        "cuda.matmul.allow_bf16_reduced_precision_reduction",
        "sdp.flash",
        "sdp.mem_efficient",
        "sdp.math",
        "sdp.cudnn",
        "nnpack.enabled",
        "deterministic_algorithms",
        "deterministic_algorithms.warn_only",
    }
)
#: A torch 2.1-like build: legacy TF32 switches, no fp32_precision, no cuDNN SDPA.
LEGACY_FLAGS = frozenset(n for n in NEW_API_FLAGS if "fp32_precision" not in n and n != "sdp.cudnn")
AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"})


def machine(**overrides: Any) -> Availability:
    """A fake machine: CPU-only x86 AVX512 torch 2.13 unless overridden."""
    fields: dict[str, Any] = {
        "torch_version": "2.13.0+cpu",
        "mkldnn": True,
        "nnpack": True,
        "mkl": True,
        "openmp": True,
        "cpu_capability": "AVX512",
        "arch": "x86_64",
        "cpu_features": AVX512,
        "flags": NEW_API_FLAGS,
    }
    fields.update(overrides)
    return Availability(**fields)
