"""CUDA kernel names: which library and precision ran (:func:`classify_cuda_kernel`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# ------------------------------------------------------------------- CUDA


@dataclass(frozen=True)
class CudaKernel:
    """What a CUDA kernel name says about the library and precision that ran.

    ``library``: ``cublas``, ``cublasLt``, ``cudnn``, ``cutlass``, ``flash``
    (FlashAttention), ``mem_efficient`` (xFormers/CUTLASS memory-efficient
    attention), ``cudnn_attention``, ``triton``, ``aten`` (a native
    ``at::native`` kernel) or ``other``.  ``role``: ``gemm``, ``conv``,
    ``sdpa``, ``rnn`` or ``other``.  ``precision``: ``tf32``, ``f32``,
    ``f16``, ``bf16``, ``f8``, ``f64``, ``int8`` or ``None`` where the name
    does not tell.
    """

    name: str
    library: str
    role: str
    precision: str | None

    @property
    def tf32(self) -> bool:
        """True when the kernel computes fp32 data with TF32 tensor cores."""
        return self.precision == "tf32"


# Ordered rules: the first match decides.  Built from kernel names in public
# profiler traces (torch.profiler tables, Nsight Systems, cuBLAS/CUTLASS/cuDNN
# issue threads): see tests/unit/test_cuda_kernel_names.py for the list.
_LIBRARY_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("cudnn_attention", "sdpa", re.compile(r"cudnn.*(sdpa|fmha|flash_[fb]prop)", re.I)),
    ("flash", "sdpa", re.compile(r"pytorch_flash::|flash_fwd|flash_bwd|flash_attn", re.I)),
    (
        "mem_efficient",
        "sdpa",
        re.compile(
            r"fmha_cutlass[FB]|PyTorchMemEffAttention|AttentionKernel<|AttentionBackwardKernel<|"
            r"mem_efficient|efficient_attention",
            re.I,
        ),
    ),
    ("triton", "other", re.compile(r"^triton_|triton", re.I)),
    (
        "cudnn",
        "rnn",
        re.compile(r"RNN_|rnn::|elemWiseRNNcell|LSTM_|GRU_|persist.*(lstm|gru)", re.I),
    ),
    (
        "cudnn",
        "conv",
        re.compile(
            r"cudnn|_xmma_(fprop|dgrad|wgrad)|implicit_convolve|implicit_gemm|winograd|"
            r"precomputed_convolve|fft2d|conv2d_grouped|convolve_",
            re.I,
        ),
    ),
    ("cublasLt", "gemm", re.compile(r"^nvjet|cublasLt|splitKreduce|_cublaslt", re.I)),
    ("cutlass", "gemm", re.compile(r"cutlass.*gemm|cutlass3x_|cutlass_\d+_(tensorop|simt)", re.I)),
    (
        "cublas",
        "gemm",
        re.compile(
            r"xmma_gemm|_cublas$|[a-z]gemm|gemm[A-Z_]|gemv|gemmk1|gemmSN|dot_kernel|"
            r"(volta|turing|ampere|ada|hopper|maxwell|sm\d+)_.*gemm",
            re.I,
        ),
    ),
)
_PRECISION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("tf32", re.compile(r"tf32|tensorop_s1688gemm_\d|tensorop_s1688gemm_(nn|nt|tn|tt)", re.I)),
    ("bf16", re.compile(r"bf16|bfloat16", re.I)),
    ("f16", re.compile(r"fp16|f16|half|h884|h1688|h16816|hgemm|_hsh_", re.I)),
    ("f8", re.compile(r"e4m3|e5m2|fp8|f8f8", re.I)),
    ("int8", re.compile(r"int8|i8816|i8832|imma|_s8_|s8s8", re.I)),
    ("f64", re.compile(r"dgemm|double|f64|d884|dmma|dgrad2d_alg\d_\d<double", re.I)),
    (
        "f32",
        re.compile(
            r"sgemm|scudnn|<float|float,|f32f32_f32|simt_s|_f32_|gemv2T_kernel_val"
            r"<int, int, float",
            re.I,
        ),
    ),
)


def classify_cuda_kernel(name: str) -> CudaKernel:
    """Read a CUDA kernel name from a profiler trace (``torch.profiler``, nsys).

    Examples from public traces::

        ampere_sgemm_128x64_nn                                  cublas   gemm f32
        sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize...       cublas   gemm tf32
        cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4    cutlass  gemm tf32
        nvjet_tst_128x24_64x11_2x1_v_bz_TNT                     cublasLt gemm
        sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_...   cudnn    conv tf32
        void pytorch_flash::flash_fwd_kernel<...>               flash    sdpa
        fmha_cutlassF_f16_aligned_64x64_rf_sm80(...)            mem_efficient sdpa f16

    A kernel the rules do not know is ``aten``/``other``; its precision is
    ``None`` where the name does not tell (cuBLASLt's ``nvjet`` names).
    """
    library, role = "aten", "other"
    for lib, kind, pattern in _LIBRARY_RULES:
        if pattern.search(name):
            library, role = lib, kind
            break
    if library == "aten" and re.search(r"\bat::native::|at::native::", name) is None:
        library = "other"
    precision = None
    for mode, pattern in _PRECISION_RULES:
        if pattern.search(name):
            precision = mode
            break
    return CudaKernel(name, library, role, precision)


def cuda_kernel_summary(names: Iterable[str]) -> dict[str, list[CudaKernel]]:
    """Group kernel names by library (``cublas``, ``cudnn``, ``flash``, ...)."""
    groups: dict[str, list[CudaKernel]] = {}
    for name in names:
        kernel = classify_cuda_kernel(name)
        groups.setdefault(kernel.library, []).append(kernel)
    return groups
