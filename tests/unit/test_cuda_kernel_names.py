"""The CUDA kernel-name parser, against kernel names from public profiler traces.

The names below were copied from torch.profiler tables, Nsight Systems
listings and CUTLASS/cuBLAS/cuDNN/xFormers issue threads (A100, H100, V100,
RTX 30xx traces).  No GPU is needed: the parser only reads strings.
"""

from __future__ import annotations

import pytest

from pytest_backends.kernels import classify_cuda_kernel, cuda_kernel_summary

# (kernel name, library, role, precision)
KNOWN = [
    # cuBLAS, legacy SIMT and tensor-core GEMMs
    ("ampere_sgemm_128x64_nn", "cublas", "gemm", "f32"),
    ("volta_sgemm_128x64_nn", "cublas", "gemm", "f32"),
    (
        "ampere_fp16_s16816gemm_fp16_64x64_sliced1x2_ldg8_relu_f2f_stages_64x6_tn",
        "cublas",
        "gemm",
        "f16",
    ),
    ("ampere_bf16_s1688gemm_bf16_128x128_ldg8_f2f_stages_32x1_nn", "cublas", "gemm", "bf16"),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_nn", "cublas", "gemm", "bf16"),
    (
        "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_"
        "tensor16x8x8_kernel",
        "cublas",
        "gemm",
        "tf32",
    ),
    (
        "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
        "execute_segment_k_off_kernel__5x_cublas",
        "cublas",
        "gemm",
        "f16",
    ),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
        "execute_segment_k_off_kernel__5x_cublas",
        "cublas",
        "gemm",
        "bf16",
    ),
    (
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, "
        "false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float>, float, float)",
        "cublas",
        "gemm",
        "f32",
    ),
    (
        "void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensor<float const>, "
        "cublasGemvTensorStridedBatched<float> > >(cublasDotParams<cublasGemvTensor<float "
        "const>, cublasGemvTensorStridedBatched<float> >)",
        "cublas",
        "gemm",
        "f32",
    ),
    # cuBLASLt
    ("nvjet_tst_128x24_64x11_2x1_v_bz_TNT", "cublasLt", "gemm", None),
    ("nvjet_tst_64x24_64x16_4x1_v_bz_splitK_TNT", "cublasLt", "gemm", None),
    (
        "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
        "(cublasSplitKParams<float>, float const*, float const*, float*, float const*, "
        "float const*, float const*, float const*, float*, void*, long, float*, int*)",
        "cublasLt",
        "gemm",
        "f32",
    ),
    # CUTLASS kernels (called by cuBLAS or linked directly)
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
        "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
        "cutlass",
        "gemm",
        "tf32",
    ),
    ("cutlass_tensorop_s1688tf32gemm_256x128_16x3_nn_align4", "cutlass", "gemm", "tf32"),
    ("cutlass_tensorop_tf32_s1688gemm_tf32_256x128_16x3_nn_align4", "cutlass", "gemm", "tf32"),
    ("cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_nn_align1", "cutlass", "gemm", "bf16"),
    (
        "cutlass_80_tensorop_f16_s16816gemm_relu_f16_128x128_32x4_tn_align8",
        "cutlass",
        "gemm",
        "f16",
    ),
    (
        "cutlass3x_sm90_tensorop_h64x128x16gemm_f16_f16_f16_void_f16_128x128x64_1x1x1_0_nnn_align8",
        "cutlass",
        "gemm",
        "f16",
    ),
    # cuDNN convolutions and RNNs
    (
        "void cudnn::detail::implicit_convolve_sgemm<float, float, 512, 6, 8, 3, 3, 5, 1, "
        "true, false, true>(int, int, int, float const*, int, float*, float const*, "
        "kernel_conv_params, unsigned long long, int, float, float, int, float const*, "
        "float const*, bool, int, int)",
        "cudnn",
        "conv",
        "f32",
    ),
    ("volta_scudnn_128x128_stridedB_splitK_xregs_large_nn_v1", "cudnn", "conv", "f32"),
    (
        "void cudnn::detail::dgrad2d_alg1_1<float, 0, 6, 7, 5, 4, 5, false, true>(int, int, "
        "int, float const*, int, float const*, int, float*, kernel_grad_params, unsigned long "
        "long, int, unsigned long long, int, float, int, int)",
        "cudnn",
        "conv",
        "f32",
    ),
    (
        "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_"
        "stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
        "cudnn",
        "conv",
        "tf32",
    ),
    (
        "sm86_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize"
        "64x64x64_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel",
        "cudnn",
        "conv",
        "f16",
    ),
    (
        "sm80_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_"
        "stage4_warpsize2x2x1_g1_tensor16x8x16_kernel",
        "cudnn",
        "conv",
        "bf16",
    ),
    (
        "cudnn_infer_ampere_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1",
        "cudnn",
        "conv",
        "f32",
    ),
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
        "(cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, "
        "float const*, float*)",
        "cudnn",
        "conv",
        "f32",
    ),
    (
        "void RNN_blockPersist_fp_LSTM<float, float, float, 128, true>(int, int, int, int, "
        "float const*, float const*, float*, float*)",
        "cudnn",
        "rnn",
        "f32",
    ),
    (
        "void elemWiseRNNcell<float, float, float, (cudnnRNNMode_t)2, (cudnnRNNBiasMode_t)2>"
        "(int, int, int, int, int, bool, float const*, float const*, float const*, float "
        "const*, float const*, float const*, float const*, float*, float*, float*, float*, "
        "float*, cudnnRNNClipMode_t, cudnnNanPropagation_t, float, float)",
        "cudnn",
        "rnn",
        "f32",
    ),
    # SDPA kernels
    (
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, "
        "false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::half_t> >, "
        "false, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
        "flash",
        "sdpa",
        "f16",
    ),
    (
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_"
        "traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_"
        "traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, false, false, "
        "false>(pytorch_flash::Flash_bwd_params)",
        "flash",
        "sdpa",
        "bf16",
    ),
    (
        "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, "
        "true, false, false, false, true, true, false>(Flash_fwd_params)",
        "flash",
        "sdpa",
        "bf16",
    ),
    (
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
        "cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "mem_efficient",
        "sdpa",
        "f16",
    ),
    (
        "fmha_cutlassF_f32_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
        "float, cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)",
        "mem_efficient",
        "sdpa",
        "f32",
    ),
    (
        "fmha_cutlassB_f32_aligned_64x64_k32_sm80(PyTorchMemEffAttention::AttentionBackward"
        "Kernel<cutlass::arch::Sm80, float, true, false, false, 64, 64, 32, false>::Params)",
        "mem_efficient",
        "sdpa",
        "f32",
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x64_4x1x1_"
        "kernel0_0",
        "cudnn_attention",
        "sdpa",
        "f16",
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_bf16_knob_7_64x128x64_4x2x1_"
        "cga1x1x1_kernel0_0",
        "cudnn_attention",
        "sdpa",
        "bf16",
    ),
    # native and generated kernels
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        "aten",
        "other",
        "f32",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3>)",
        "aten",
        "other",
        "f32",
    ),
    ("triton_poi_fused_add_mul_0", "triton", "other", None),
    ("triton_red_fused__softmax_1", "triton", "other", None),
]


@pytest.mark.parametrize(
    ("name", "library", "role", "precision"), KNOWN, ids=[k[0][:48] for k in KNOWN]
)
def test_known_kernel_names(name: str, library: str, role: str, precision: str | None) -> None:
    kernel = classify_cuda_kernel(name)
    assert (kernel.library, kernel.role, kernel.precision) == (library, role, precision)
    assert kernel.tf32 == (precision == "tf32")
    assert kernel.name == name


def test_tf32_is_told_apart_from_ieee_fp32() -> None:
    ieee = classify_cuda_kernel("ampere_sgemm_128x64_nn")
    tf32 = classify_cuda_kernel(
        "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_"
        "tensor16x8x8_kernel"
    )
    assert (ieee.precision, tf32.precision) == ("f32", "tf32")
    assert not ieee.tf32 and tf32.tf32


def test_unknown_names_are_not_guessed() -> None:
    kernel = classify_cuda_kernel("my_custom_kernel")
    assert (kernel.library, kernel.role, kernel.precision) == ("other", "other", None)
    assert classify_cuda_kernel("").library == "other"


def test_summary_groups_by_library() -> None:
    groups = cuda_kernel_summary([k[0] for k in KNOWN])
    assert set(groups) == {k[1] for k in KNOWN}
    assert sum(len(v) for v in groups.values()) == len(KNOWN)
    assert all(k.role == "sdpa" for k in groups["flash"] + groups["mem_efficient"])
