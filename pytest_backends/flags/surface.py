"""The sentinel: torch's whole switch surface, and which part of it the catalogue manages.

Discovery enumerates, on the running torch, the getter/setter-like names of
``torch._C`` (and its ``_functorch``/``_autograd`` submodules), the public
``get_*``/``set_*`` functions of ``torch`` and ``torch.__future__``, and the
attributes and properties of the ``torch.backends`` modules.  Every name is
either managed by a catalogue row (:data:`_MANAGED`, or a ``torch.backends``
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

from pytest_backends.flags.row import Flag, _missing

__all__ = ["NOT_STATE", "Surface", "classify", "discover", "name_list", "unmanaged_rows"]

#: The pybind names counted as switch surface (the same rule as the name lists).
SURFACE = re.compile(
    r"^_(get|set|is|enable|disable|jit_get|jit_set|jit_override|cuda_get|cuda_set|"
    r"accelerator_|mtia_|mps_get|mps_set)"
)

#: torch._C names (and Python names) a catalogue row manages, with the row's name.
_MANAGED: dict[str, str] = {
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

_DEVICE = "device runtime: current device or stream, allocator, memory stats and events"
_DIST = "distributed, RPC, DDP or worker state of a process group: not single-process numerics"
_OBJECT = "a query or setter of one object (tensor, storage, module, graph): not global state"
_CAPABILITY = "a build or hardware capability, fixed for the process"
_INSPECT = "TorchScript, mobile or upgrader introspection: a function of its argument"
_PROFILE = "profiling, tracing or logging diagnostics: no effect on results"
_SCOPED = "thread-local state set and reset by torch's own context managers"
_LAZY = "lazy-tensor (LTC) backend configuration: only lazy tensors read it"
_SETTER_ONLY = (
    "setter only, cannot be read back: a legacy knob; a test that sets it must re-apply "
    "torch's default itself"
)
_MODES = "internals of the mode stacks, managed as modes.torch_function_stack/dispatch_stack"

#: Surface names that are not global numeric state: ``(fnmatch patterns, reason)``.
NOT_STATE: tuple[tuple[tuple[str, ...], str], ...] = (
    (("_accelerator_*", "_mtia_*", "_mps_*", "_cuda_get*", "_cuda_set*"), _DEVICE),
    (
        (
            "_get_backend*",
            "_set_default_backend",
            "_get_device_map",
            "_set_device_map",
            "_set_group_*",
            "_get_sequence_number*",
            "_set_sequence_number_for_group",
            "_set_process_group",
            "_is_process_group_registered",
            "_get_work_registry_size",
            "_set_rpc_timeout",
            "_set_and_start_rpc_agent",
            "_get_current_rpc_agent",
            "_is_current_rpc_agent_set",
            "_set_default_timeout",
            "_set_global_rank",
            "_get_comm_profiling_name",
            "_set_comm_profiling_name",
            "_set_comm_hook_name",
            "_get_ddp_logging_data",
            "_set_ddp_runtime_logging_sample_rate",
            "_set_static_graph",
            "_set_uneven_input_join",
            "_set_forward_pass_work_handle",
            "_get_local_used_map",
            "_get_zeros_like_grad_buckets",
            "_set_optimizer_in_backward",
            "_set_mixed_precision_param_dtype",
            "_set_sparse_metadata",
            "_set_manual_finalization_required",
            "_get_intra_node_comm_usage_counter",
            "_enable_collectives_timing",
            "_set_allow_inflight_collective_as_graph_input",
            "_get_DTensor_*",
            "_set_enable_nan_check",
            "_set_thread_isolation_mode",
            "_get_future",
            "_get_profiling_future",
            "_set_profiling_future",
            "_enable_jit_rref_pickle",
            "_disable_jit_rref_pickle",
            "_enable_server_process_global_profiler",
            "_disable_server_process_global_profiler",
            "_set_worker_pids",
            "_set_worker_signal_handlers",
            "_get_shared_fd",
        ),
        _DIST,
    ),
    (
        (
            "_is_view",
            "_is_view_op",
            "_is_alias_of",
            "_is_cow_tensor",
            "_is_zerotensor",
            "_is_fake_tensor",
            "_is_functional_tensor*",
            "_is_cached_tensor",
            "_is_pure_view",
            "_get_tensor_*",
            "_set_tensor_metadata",
            "_get_data_attr",
            "_set_cdata",
            "_set_conj",
            "_set_neg",
            "_get_creation_meta",
            "_set_creation_meta",
            "_get_nested_int",
            "_get_fake_constant",
            "_set_fake_constant",
            "_set_throw_on_mutable_data_ptr",
            "_set_warn_deprecated_on_mutable_data_ptr",
            "_set_storage_*",
            "_get_tensors_*",
            "_get_constant_bool_symnode",
            "_is_all_true",
            "_is_any_true",
            "_get_forward_hooks",
            "_get_forward_pre_hooks",
            "_set_generator_metaclass",
            "_is_pybind11_type",
            "_is_opaque_type_registered",
            "_is_exception",
            "_is_valid_context",
            "_get_type",
            "_get_op_type",
            "_get_sequence_nr",
            "_set_sequence_nr",
            "_get_compiled_autograd_symints",
            "_get_current_graph_task_keep_graph",
            "_get_graph_hash",
            "_get_latest_computation_graph",
            "_get_max_id",
        ),
        _OBJECT,
    ),
    (
        (
            "_get_accelerator",
            "_get_all_dtypes",
            "_get_cpu_capability",
            "_is_autocast_available",
            "_is_ck_sdpa_available",
            "_is_flash_attention_available",
            "_is_nvshmem_available",
            "_is_xnnpack_enabled",
            "_is_initialized",
            "_get_privateuse1_backend_name",
            "_get_default_device_type",
            "_get_cudnn_batch_norm_reserve_space_size",
            "_get_blas_default_backend",
            "_is_cudnn_attention_decode_disabled",
            "_get_device_properties",
            "torch.backends.quantized.supported_engines",
        ),
        _CAPABILITY,
    ),
    (
        (
            "_get_model_*",
            "_get_mobile_*",
            "_get_module_info_from_flatbuffer",
            "_get_upgrader*",
            "_get_operator_version_map",
            "_get_max_operator_version",
            "_get_version_calculator_flag",
            "_jit_get_all_schemas",
            "_jit_get_custom_class_schemas",
            "_jit_get_schemas_for_operator",
            "_jit_get_operation",
            "_get_schema",
            "_get_operation_overload",
            "_get_overloads",
            "_get_method",
            "_get_python_class",
            "_get_script_class",
            "_get_custom_class_python_wrapper",
            "_get_named_tuple_properties",
            "_get_caught_jit_exception_*",
            "_is_default_mobile_cpu_allocator_set",
            "_set_default_mobile_cpu_allocator",
            "_enable_mobile_interface_call_export",
            "_set_should_use_format_with_string_table",
            "_get_file_format",
            "_set_from_file",
        ),
        _INSPECT,
    ),
    (
        (
            "_enable_record_function",
            "_enable_execution_trace_observer",
            "_disable_execution_trace_observer",
            "_is_kineto_stopped",
            "_set_profiler_node_id",
            "_get_approximate_time",
            "_get_duration",
            "_get_handler*",
            "_get_thread_name",
            "_set_thread_name",
            "_get_cpp_backtrace",
            "_get_frame_value_stack_with_depth",
            "_get_cache_entries_for_region",
            "_get_total_cache_entry_count",
            "_jit_set_onnx_log_*",
            "_jit_set_logging_stream",
            "_jit_set_utf8_decoding_ignore",
            "_set_empty_test_observer",
            "_set_record_concrete_inputs_enabled_val",
            "_set_fwd_bwd_enabled_val",
            "_set_cuda_sync_enabled_val",
            "_get_tracing_state",
            "_set_tracing_state",
            "_is_tracing",
            "_get_value_trace",
            "_set_value_trace",
            "_set_print_stack_traces_on_fatal_signal",
        ),
        _PROFILE,
    ),
    (
        (
            "_get_dtensor_allow_implicit_replication",
            "_set_dtensor_allow_implicit_replication",
            "_set_only_lift_cpu_tensors",
            "_get_graph_exec_group",
            "_set_graph_exec_group",
            "_set_ignore_amp",
            "_get_symbolic_shape_mode",
            "_set_symbolic_shape_mode",
            "_get_symbolize_mode",
            "_jit_set_symbolic_shapes_test_mode",
            "_enable_functionalization",
            "_disable_functionalization",
            "_is_key_in_tls",
            "_get_obj_in_tls",
            "_set_meta_in_tls_dispatch_include",
            "_set_dynamic_layer_keys_included",
            "_set_unwrap_func",
        ),
        _SCOPED,
    ),
    (
        (
            "_get_dispatch",
            "_get_dispatch_mode",
            "_set_dispatch_mode",
            "_get_dispatch_stack_at",
            "_get_function_stack_at",
            "_disabled_torch_dispatch_impl",
            "_disabled_torch_function_impl",
            "_set_skip_next_torch_function",
        ),
        _MODES,
    ),
    (
        (
            "_set_force_fallback",
            "_get_force_fallback",
            "_set_reuse_ir",
            "_set_lru_cache",
            "_set_optimized",
        ),
        _LAZY,
    ),
    (
        (
            "_jit_set_bailout_depth",
            "_jit_set_fusion_strategy",
            "_jit_set_autocast_mode",
            "_set_vmap_fallback_warning_enabled",
            "_set_cached_tensors_enabled",
        ),
        _SETTER_ONLY,
    ),
    (
        ("_jit_set_nvfuser_*", "_jit_override_can_fuse_on_cpu_legacy"),
        "a removed TorchScript fuser: the setter does nothing torch still reads",
    ),
    (
        (
            "torch.set_rng_state",
            "torch.get_rng_state",
        ),
        "the RNG state: seeded per test by the determinism harness, not a switch",
    ),
    (("torch.backends.*.is_available", "torch.backends.*.VERBOSE_*"), _CAPABILITY),
    (
        ("torch.backends.mkl.verbose", "torch.backends.mkldnn.verbose"),
        _SETTER_ONLY,
    ),
    (
        (
            "torch.backends.mps.TYPE_CHECKING",
            "torch.backends.python_native.all_dsls",
            "torch.backends.python_native.available_dsls",
            "torch.backends.cuda.matmul",
            "torch.backends.cuda.cufft_plan_cache",
            "torch.backends.python_native.*",
        ),
        "a namespace whose switches are rows of their own (python_native.*, cuda.matmul.*)",
    ),
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
    return sorted(names)


def classify(names: Iterable[str], rows: Iterable[str]) -> Surface:
    """Split ``names`` by the catalogue's row names ``rows`` (rows and absent rows)."""
    known_rows = set(rows)
    surface = Surface()
    for name in sorted(set(names)):
        row = _MANAGED.get(name)
        if row is None and name.startswith("torch.backends."):
            candidate = name.removeprefix("torch.backends.")
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
    """The names of a ``*.names`` file, one a line."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


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
                _missing,
                lambda v: v,
                "unknown to the plugin",
                f"unmanaged switch found by discovery (torch._C.{name})",
                unmanaged=True,
                order=90,
            )
        )
