"""The sentinel: torch's whole switch surface, and which part of it the catalogue manages.

Discovery enumerates, on the running torch, the getter/setter-like names of
``torch._C`` (and its ``_functorch``/``_autograd`` submodules), the public
``get_*``/``set_*`` functions of ``torch`` and ``torch.__future__``, and the
attributes and properties of the ``torch.backends`` modules.  Every name is
either managed by a catalogue row (:data:`MANAGED`, or a ``torch.backends``
attribute whose ``module.attr`` is a row) or on the explicit list of names
that are not global numeric state (:data:`NOT_STATE`, each with its reason).
Anything else is *unknown*: the drift test names it, ``pytest-backends
switches`` lists it, and where it is a readable getter/setter pair the runtime
net fingerprints it (:func:`unmanaged_rows`) so that a test changing it is
reported.
"""

# ruff: noqa: E501  (the name table keeps one torch name per line)

from __future__ import annotations

import fnmatch
import re
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_backends.flags.not_state import NOT_STATE
from pytest_backends.flags.row import Flag, missing_flag

__all__ = [
    "NOT_STATE",
    "Surface",
    "classify",
    "declared_row",
    "discover",
    "name_list",
    "unmanaged_rows",
]

#: The pybind names counted as switch surface (the same rule as the name lists).
SURFACE = re.compile(
    r"^_(get|set|is|enable|disable|jit_get|jit_set|jit_override|cuda_get|cuda_set|"
    r"accelerator_|mtia_|mps_get|mps_set)"
)

#: torch._C names (and Python names) a catalogue row manages, with the row's name.
MANAGED: dict[str, str] = {
    "_cuda_getCublasLtWorkspaceSize": "cuda.cublaslt_workspace_size",
    "_cuda_getCublasWorkspaceSize": "cuda.cublas_workspace_size",
    "_cuda_get_cudnn_benchmark_limit": "cudnn.benchmark_limit",
    "_cuda_get_sync_debug_mode": "cuda.sync_debug_mode",
    "_cuda_setCublasLtWorkspaceSize": "cuda.cublaslt_workspace_size",
    "_cuda_setCublasWorkspaceSize": "cuda.cublas_workspace_size",
    "_cuda_set_cudnn_benchmark_limit": "cudnn.benchmark_limit",
    "_cuda_set_sync_debug_mode": "cuda.sync_debug_mode",
    "_disable_profiler": "profiler.enabled",
    "_disable_profiler_legacy": "profiler.enabled",
    "_enable_profiler": "profiler.enabled",
    "_enable_profiler_legacy": "profiler.enabled",
    "_get_autograd_fallback_mode": "autograd.fallback_mode",
    "_get_backcompat_broadcast_warn": "backcompat.broadcast_warn",
    "_get_backcompat_keepdim_warn": "backcompat.keepdim_warn",
    "_get_blas_preferred_backend": "cuda.preferred_blas_library",
    "_get_cpu_allow_fp16_reduced_precision_reduction": "cpu.allow_fp16_reduced_precision_reduction",
    "_get_cublas_allow_bf16_reduced_precision_reduction": "cuda.matmul.allow_bf16_reduced_precision_reduction",
    "_get_cublas_allow_fp16_accumulation": "cuda.matmul.allow_fp16_accumulation",
    "_get_cublas_allow_fp16_reduced_precision_reduction": "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "_get_cublas_allow_tf32": "cuda.matmul.allow_tf32",
    "_get_cublaslt_prefer_grouped_gemm": "cuda.matmul.prefer_cublaslt_grouped_gemm",
    "_get_cudnn_allow_tf32": "cudnn.allow_tf32",
    "_get_cudnn_benchmark": "cudnn.benchmark",
    "_get_cudnn_depthwise_kernel": "cudnn.depthwise_kernel",
    "_get_cudnn_deterministic": "cudnn.deterministic",
    "_get_cudnn_enabled": "cudnn.enabled",
    "_get_cudnn_sdp_enabled": "sdp.cudnn",
    "_get_default_device": "default_device",
    "_get_deterministic_algorithms": "deterministic_algorithms",
    "_get_deterministic_algorithms_warn_only": "deterministic_algorithms.warn_only",
    "_get_deterministic_fill_uninitialized_memory": "deterministic.fill_uninitialized_memory",
    "_get_fa3_sdp_enabled": "sdp.fa3",
    "_get_fa4_sdp_enabled": "sdp.fa4",
    "_get_flash_sdp_enabled": "sdp.flash",
    "_get_float32_matmul_precision": "float32_matmul_precision",
    "_get_fp32_precision_getter": "fp32_precision",
    "_get_graph_executor_optimize": "jit.graph_executor_optimize",
    "_get_linalg_preferred_backend": "cuda.preferred_linalg_library",
    "_get_math_sdp_allow_fp16_bf16_reduction": "sdp.allow_fp16_bf16_reduction_math",
    "_get_math_sdp_enabled": "sdp.math",
    "_get_mem_efficient_sdp_enabled": "sdp.mem_efficient",
    "_get_miopen_immediate": "miopen.immediate",
    "_get_mkldnn_deterministic": "mkldnn.deterministic",
    "_get_mkldnn_enabled": "mkldnn.enabled",
    "_get_native_aot_enabled": "native_aot.enabled",
    "_get_native_aot_unconditional_masked": "native_aot.unconditional_masked",
    "_get_nnpack_enabled": "nnpack.enabled",
    "_get_onednn_allow_tf32": "mkldnn.allow_tf32",
    "_get_overrideable_sdp_enabled": "sdp.overrideable",
    "_get_qengine": "quantized.engine",
    "_get_rocm_fa_preferred_backend": "cuda.preferred_rocm_fa_library",
    "_get_sdp_priority_order": "sdp.priority_order",
    "_get_sm_carveout_experimental": "sm_carveout",
    "_get_torch_function_state": "modes.torch_function_state",
    "_get_warnAlways": "warn_always",
    "_is_any_autocast_enabled": "autocast.cpu.enabled",
    "_is_fwd_grad_enabled": "autograd.fwd_grad_enabled",
    "_is_grad_layout_enforcement_enabled": "autograd.grad_layout_enforcement",
    "_is_multithreading_enabled": "autograd.multithreading_enabled",
    "_is_torch_function_all_disabled": "modes.torch_function_state",
    "_is_torch_function_enabled": "modes.torch_function_state",
    "_is_torch_function_mode_enabled": "modes.torch_function_stack",
    "_is_view_replay_enabled": "autograd.view_replay_enabled",
    "_is_vmap_fallback_enabled": "functorch.vmap_fallback_enabled",
    "_jit_get_emit_hooks": "jit.emit_hooks",
    "_jit_get_inline_everything_mode": "jit.inline_everything_mode",
    "_jit_get_logging_option": "jit.logging_option",
    "_jit_get_num_profiled_runs": "jit.num_profiled_runs",
    "_jit_get_te_cuda_pointwise_block_count": "jit.te_cuda_pointwise_block_count",
    "_jit_get_te_cuda_pointwise_block_size": "jit.te_cuda_pointwise_block_size",
    "_jit_get_te_cuda_pointwise_loop_levels": "jit.te_cuda_pointwise_loop_levels",
    "_jit_get_te_generate_block_code": "jit.te_generate_block_code",
    "_jit_get_te_must_use_llvm_cpu": "jit.te_must_use_llvm_cpu",
    "_jit_get_tracer_state_warn": "jit.tracer_state_warn",
    "_jit_override_can_fuse_on_cpu": "jit.can_fuse_on_cpu",
    "_jit_override_can_fuse_on_gpu": "jit.can_fuse_on_gpu",
    "_jit_set_emit_hooks": "jit.emit_hooks",
    "_jit_set_inline_everything_mode": "jit.inline_everything_mode",
    "_jit_set_llga_enabled": "jit.onednn_fusion",
    "_jit_set_logging_option": "jit.logging_option",
    "_jit_set_num_profiled_runs": "jit.num_profiled_runs",
    "_jit_set_profiling_executor": "jit.profiling_executor",
    "_jit_set_profiling_mode": "jit.profiling_mode",
    "_jit_set_te_cuda_pointwise_block_count": "jit.te_cuda_pointwise_block_count",
    "_jit_set_te_cuda_pointwise_block_size": "jit.te_cuda_pointwise_block_size",
    "_jit_set_te_cuda_pointwise_loop_levels": "jit.te_cuda_pointwise_loop_levels",
    "_jit_set_te_generate_block_code": "jit.te_generate_block_code",
    "_jit_set_te_must_use_llvm_cpu": "jit.te_must_use_llvm_cpu",
    "_jit_set_texpr_dynamic_shape_enabled": "jit.texpr_dynamic_shape",
    "_jit_set_texpr_fuser_enabled": "jit.texpr_fuser",
    "_jit_set_texpr_reductions_enabled": "jit.texpr_reductions",
    "_jit_set_tracer_state_warn": "jit.tracer_state_warn",
    "_set_autograd_fallback_mode": "autograd.fallback_mode",
    "_set_backcompat_broadcast_warn": "backcompat.broadcast_warn",
    "_set_backcompat_keepdim_warn": "backcompat.keepdim_warn",
    "_set_blas_preferred_backend": "cuda.preferred_blas_library",
    "_set_check_sparse_tensor_invariants": "sparse.check_invariants",
    "_set_cpu_allow_fp16_reduced_precision_reduction": "cpu.allow_fp16_reduced_precision_reduction",
    "_set_cublas_allow_bf16_reduced_precision_reduction": "cuda.matmul.allow_bf16_reduced_precision_reduction",
    "_set_cublas_allow_fp16_accumulation": "cuda.matmul.allow_fp16_accumulation",
    "_set_cublas_allow_fp16_reduced_precision_reduction": "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "_set_cublas_allow_tf32": "cuda.matmul.allow_tf32",
    "_set_cublaslt_prefer_grouped_gemm": "cuda.matmul.prefer_cublaslt_grouped_gemm",
    "_set_cudnn_allow_tf32": "cudnn.allow_tf32",
    "_set_cudnn_benchmark": "cudnn.benchmark",
    "_set_cudnn_depthwise_kernel": "cudnn.depthwise_kernel",
    "_set_cudnn_deterministic": "cudnn.deterministic",
    "_set_cudnn_enabled": "cudnn.enabled",
    "_set_default_dtype": "default_dtype",
    "_set_default_tensor_type": "default_dtype",
    "_set_deterministic_algorithms": "deterministic_algorithms",
    "_set_deterministic_fill_uninitialized_memory": "deterministic.fill_uninitialized_memory",
    "_set_float32_matmul_precision": "float32_matmul_precision",
    "_set_fp32_precision_setter": "fp32_precision",
    "_set_fwd_grad_enabled": "autograd.fwd_grad_enabled",
    "_set_grad_enabled": "autograd.grad_enabled",
    "_set_grad_layout_enforcement_enabled": "autograd.grad_layout_enforcement",
    "_set_graph_executor_optimize": "jit.graph_executor_optimize",
    "_set_linalg_preferred_backend": "cuda.preferred_linalg_library",
    "_set_math_sdp_allow_fp16_bf16_reduction": "sdp.allow_fp16_bf16_reduction_math",
    "_set_miopen_immediate": "miopen.immediate",
    "_set_mkldnn_deterministic": "mkldnn.deterministic",
    "_set_mkldnn_enabled": "mkldnn.enabled",
    "_set_multithreading_enabled": "autograd.multithreading_enabled",
    "_set_native_aot_enabled": "native_aot.enabled",
    "_set_native_aot_unconditional_masked": "native_aot.unconditional_masked",
    "_set_nnpack_enabled": "nnpack.enabled",
    "_set_onednn_allow_tf32": "mkldnn.allow_tf32",
    "_set_override_stale_capture_stream": "autograd.override_stale_capture_stream",
    "_set_qengine": "quantized.engine",
    "_set_rocm_fa_preferred_backend": "cuda.preferred_rocm_fa_library",
    "_set_sdp_priority_order": "sdp.priority_order",
    "_set_sdp_use_cudnn": "sdp.cudnn",
    "_set_sdp_use_fa3": "sdp.fa3",
    "_set_sdp_use_fa4": "sdp.fa4",
    "_set_sdp_use_flash": "sdp.flash",
    "_set_sdp_use_math": "sdp.math",
    "_set_sdp_use_mem_efficient": "sdp.mem_efficient",
    "_set_sdp_use_overrideable": "sdp.overrideable",
    "_set_sm_carveout_experimental": "sm_carveout",
    "_set_torch_function_state": "modes.torch_function_state",
    "_set_view_replay_enabled": "autograd.view_replay_enabled",
    "_set_vmap_fallback_enabled": "functorch.vmap_fallback_enabled",
    "_set_warnAlways": "warn_always",
    "_set_warn_on_accumulate_grad_stream_mismatch": "autograd.warn_on_accumulate_grad_stream_mismatch",
    "torch.__future__.set_overwrite_module_params_on_conversion": "future.overwrite_module_params_on_conversion",
    "torch.__future__.set_swap_module_params_on_conversion": "future.swap_module_params_on_conversion",
    "torch.set_anomaly_enabled": "autograd.anomaly_enabled",
    "torch.set_autocast_cache_enabled": "autocast.cache_enabled",
    "torch.set_autocast_cpu_dtype": "autocast.cpu.dtype",
    "torch.set_autocast_cpu_enabled": "autocast.cpu.enabled",
    "torch.set_autocast_dtype": "autocast.cpu.dtype",
    "torch.set_autocast_enabled": "autocast.cpu.enabled",
    "torch.set_autocast_gpu_dtype": "autocast.cuda.dtype",
    "torch.set_autocast_ipu_dtype": "autocast.ipu.dtype",
    "torch.set_autocast_ipu_enabled": "autocast.ipu.enabled",
    "torch.set_autocast_xla_dtype": "autocast.xla.dtype",
    "torch.set_autocast_xla_enabled": "autocast.xla.enabled",
    "torch.set_default_device": "default_device",
    "torch.set_default_dtype": "default_dtype",
    "torch.set_default_tensor_type": "default_dtype",
    "torch.set_deterministic_debug_mode": "deterministic_algorithms",
    "torch.set_float32_matmul_precision": "float32_matmul_precision",
    "torch.set_flush_denormal": "flush_denormal",
    "torch.set_grad_enabled": "autograd.grad_enabled",
    "torch.set_num_interop_threads": "num_interop_threads",
    "torch.set_num_threads": "num_threads",
    "torch.set_printoptions": "printoptions.precision",
    "torch.set_warn_always": "warn_always",
    "torch.utils.deterministic.fill_uninitialized_memory": "deterministic.fill_uninitialized_memory",
}

#: A torch attribute under ``prefix`` is managed by the row of the same name under ``rows``.
_CANDIDATES = (
    ("torch.backends.", ""),
    ("torch.utils.serialization.config.", "serialization."),
)

_EXPLICIT = {p: reason for patterns, reason in NOT_STATE for p in patterns if "*" not in p}
_GLOBS = tuple((p, reason) for patterns, reason in NOT_STATE for p in patterns if "*" in p)


def not_state_reason(name: str) -> str | None:
    """Why ``name`` is not global numeric state, or None if it is not on the list."""
    reason = _EXPLICIT.get(name)
    if reason is not None:
        return reason
    for pattern, why in _GLOBS:
        if fnmatch.fnmatchcase(name, pattern):
            return why
    return None


@dataclass
class Surface:
    """Discovered names split into managed, known-not-state and unknown."""

    managed: dict[str, str] = field(default_factory=dict)
    not_state: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)


def _c_modules(torch: Any) -> list[Any]:
    C = torch._C
    return [C] + [getattr(C, n) for n in ("_functorch", "_autograd") if hasattr(C, n)]


def discover(torch: Any) -> list[str]:
    """The switch surface of the running ``torch``: pybind names and Python names."""
    names: set[str] = set()
    for module in _c_modules(torch):
        names.update(n for n in dir(module) if SURFACE.match(n) and callable(getattr(module, n)))
    for prefix, module in (
        ("torch", torch),
        ("torch.__future__", getattr(torch, "__future__", None)),
    ):
        if module is None:
            continue
        for n in dir(module):
            if n.startswith("set_") and callable(getattr(module, n, None)):
                names.add(f"{prefix}.{n}")
    deterministic = getattr(getattr(torch, "utils", None), "deterministic", None)
    if deterministic is not None and hasattr(deterministic, "fill_uninitialized_memory"):
        names.add("torch.utils.deterministic.fill_uninitialized_memory")
    backends = torch.backends
    for mod_name, module in sorted(vars(backends).items()):
        if mod_name.startswith("_") or not isinstance(module, types.ModuleType):
            continue
        attrs = set(vars(module)) | {
            n for n, v in vars(type(module)).items() if hasattr(v, "__get__") and not callable(v)
        }
        for attr in attrs:
            if attr.startswith("_"):
                continue
            try:
                value = getattr(module, attr)
            except Exception:
                continue
            if callable(value) or isinstance(value, types.ModuleType):
                continue
            names.add(f"torch.backends.{mod_name}.{attr}")
    from pytest_backends.flags.python_surface import python_surface

    names.update(python_surface(torch))
    return sorted(names)


def declared_row(name: str) -> str | None:
    """The catalogue row that declares it manages the torch name ``name``, if one does."""
    row = MANAGED.get(name)
    if row is not None or SURFACE.match(name):
        return row
    # a Python-level name: its table is loaded by discovery, not by the registry
    from pytest_backends.flags.python_surface import PY_MANAGED

    return PY_MANAGED.get(name)


def classify(names: Iterable[str], rows: Iterable[str]) -> Surface:
    """Split ``names`` by the catalogue's row names ``rows`` (rows and absent rows)."""
    known_rows = set(rows)
    surface = Surface()
    for name in sorted(set(names)):
        row = declared_row(name)
        for prefix, rows_prefix in _CANDIDATES:
            if row is None and name.startswith(prefix):
                candidate = rows_prefix + name.removeprefix(prefix)
                row = candidate if candidate in known_rows else None
        if row is not None:
            # a name a row manages is never excused by the not-state list
            if row in known_rows:
                surface.managed[name] = row
            else:
                surface.unknown.append(f"{name} (row {row!r} is missing)")
            continue
        reason = not_state_reason(name)
        if reason is not None:
            surface.not_state[name] = reason
        else:
            surface.unknown.append(name)
    return surface


def name_list(path: Path) -> list[str]:
    """The names of a ``*.names`` file, one a line (blank lines and ``#`` comments skipped)."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def unmanaged_rows(torch: Any, rows: list[Flag], absent: dict[str, str]) -> None:
    """The runtime net: unknown ``torch._C`` getter/setter pairs, fingerprinted, never restored.

    Only pairs whose getter takes no argument are read (one call per fingerprint).
    """
    known = {r.name for r in rows} | set(absent)
    surface = classify((n for n in dir(torch._C) if SURFACE.match(n)), known)
    for name in surface.unknown:
        if " " in name or not name.startswith(("_get_", "_is_")):
            continue
        stem = name.removeprefix("_get_").removeprefix("_is_")
        if not any(hasattr(torch._C, f"_set_{s}") for s in (stem, stem.removesuffix("_enabled"))):
            continue
        getter = getattr(torch._C, name)
        try:
            getter()
        except Exception:  # needs arguments or a device: not cheaply readable
            continue
        rows.append(
            Flag(
                f"torch._C.{name}",
                getter,
                missing_flag,
                lambda v: v,
                "unknown to the plugin",
                f"unmanaged switch found by discovery (torch._C.{name})",
                unmanaged=True,
                order=90,
            )
        )
