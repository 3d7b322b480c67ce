"""The declarative table: one row per piece of torch's process-global state.

Rows are probed feature by feature (never by version number).  The groups of
rows that need helpers of their own live in :mod:`.rows`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pytest_backends.flags.module_attributes import ROW as MODULE_ATTRIBUTES
from pytest_backends.flags.module_attributes import module_attribute_row
from pytest_backends.flags.row import (
    ALL_PRECISIONS,
    CUDA_PRECISIONS,
    FP32_ROWS,
    Check,
    Flag,
    any_str,
    attribute_reader,
    check_bool,
    default_device_reader,
    dtype_check,
    dtype_name,
    dtype_of,
    enum_name,
    missing_flag,
    non_negative_int,
    one_of,
    outside_modes,
    pair_writer,
    positive_int,
    priority_order,
    read_or_mixed,
    reduction_pair,
    set_attr,
    write_default_device,
    write_unless_mixed,
)
from pytest_backends.flags.rows import (
    FROZEN_ATTR,
    autocast_rows,
    backends_globals,
    device_rows,
    flush_denormal_readable,
    process_rows,
    read_flush_denormal,
    set_frozen,
)
from pytest_backends.flags.surface import unmanaged_rows
from pytest_backends.flags.switches import switch_rows

_BLAS_ALIASES = {"hipblas": "cublas", "hipblaslt": "cublaslt"}


def _blas_library(torch: Any, value: object) -> object:
    """torch's BLAS library names: ``"default"`` resolves to the build's default, and the
    ROCm names are aliases of the CUDA ones."""
    value = one_of("default", "cublas", "cublaslt", "hipblas", "hipblaslt", "ck")(value)
    if value == "default":
        default = getattr(torch._C, "_get_blas_default_backend", None)
        return enum_name(default()) if default is not None else "cublas"
    return _BLAS_ALIASES.get(str(value), value)


def build_catalogue(torch: Any) -> tuple[list[Flag], dict[str, str]]:
    """Build every row that exists in ``torch`` and the reasons for the rest.

    Rows are probed feature by feature (never by version number) so that
    torch 2.1 through the newest releases, and builds without CUDA, all get
    exactly the flags they have.
    """
    C = torch._C
    rows: list[Flag] = []
    absent: dict[str, str] = {}
    has = functools.partial(hasattr, C)

    def add(
        name: str,
        exists: bool | str,
        read: Callable[[], object],
        write: Callable[[Any], object],
        check: Check,
        allowed: str,
        doc: str,
        **extra: Any,
    ) -> None:
        if exists is True:
            rows.append(Flag(name, read, write, check, allowed, doc, **extra))
        else:
            absent[name] = exists if isinstance(exists, str) else "not in this torch"

    def c_flag(name: str, getter: str, setter: str, doc: str, **extra: Any) -> None:
        exists = has(getter) and has(setter)
        read = getattr(C, getter, None)
        write = getattr(C, setter, None)
        add(
            name,
            exists,
            read or missing_flag,
            write or missing_flag,
            check_bool,
            "True, False",
            doc,
            **extra,
        )

    new_precision = has("_get_fp32_precision_getter") and has("_set_fp32_precision_setter")
    cudnn_available = bool(torch.backends.cudnn.is_available())

    # cuDNN
    c_flag("cudnn.enabled", "_get_cudnn_enabled", "_set_cudnn_enabled", "use cuDNN kernels")
    c_flag(
        "cudnn.benchmark",
        "_get_cudnn_benchmark",
        "_set_cudnn_benchmark",
        "autotune cuDNN convolution algorithms",
    )
    c_flag(
        "cudnn.deterministic",
        "_get_cudnn_deterministic",
        "_set_cudnn_deterministic",
        "only deterministic cuDNN convolution algorithms",
    )
    add(
        "cudnn.depthwise_kernel",
        has("_get_cudnn_depthwise_kernel") or "needs torch >= 2.13",
        getattr(C, "_get_cudnn_depthwise_kernel", missing_flag),
        getattr(C, "_set_cudnn_depthwise_kernel", missing_flag),
        one_of("auto", "cudnn", "native"),
        "'auto', 'cudnn', 'native'",
        "cuDNN depthwise convolution kernel choice",
    )
    add(
        "cudnn.benchmark_limit",
        (cudnn_available and has("_cuda_get_cudnn_benchmark_limit")) or "needs cuDNN",
        getattr(C, "_cuda_get_cudnn_benchmark_limit", missing_flag),
        getattr(C, "_cuda_set_cudnn_benchmark_limit", missing_flag),
        positive_int,
        "a positive int",
        "cuDNN v8 API: how many algorithms benchmark tries",
    )
    # Like float32_matmul_precision below, the legacy cuDNN TF32 switch keeps
    # state of its own beside the fp32_precision strings, so it is snapshotted
    # and written before them.
    add(
        "cudnn.allow_tf32",
        (has("_get_cudnn_allow_tf32") and has("_set_cudnn_allow_tf32")) or "not in this torch",
        functools.partial(read_or_mixed, getattr(C, "_get_cudnn_allow_tf32", missing_flag)),
        functools.partial(write_unless_mixed, getattr(C, "_set_cudnn_allow_tf32", missing_flag)),
        check_bool,
        "True, False",
        "TF32 in cuDNN convolutions (legacy API)",
        order=5,
    )

    # oneDNN
    c_flag(
        "mkldnn.enabled",
        "_get_mkldnn_enabled",
        "_set_mkldnn_enabled",
        "use oneDNN (MKL-DNN) CPU kernels",
    )
    c_flag(
        "mkldnn.deterministic",
        "_get_mkldnn_deterministic",
        "_set_mkldnn_deterministic",
        "only deterministic oneDNN kernels",
    )
    c_flag(
        "mkldnn.allow_tf32",
        "_get_onednn_allow_tf32",
        "_set_onednn_allow_tf32",
        "legacy: TF32 in oneDNN",
        in_snapshot=False,
        order=40,
    )

    # cuBLAS matmul
    c_flag(
        "cuda.matmul.allow_tf32",
        "_get_cublas_allow_tf32",
        "_set_cublas_allow_tf32",
        "legacy: TF32 in cuBLAS matmul",
        in_snapshot=not new_precision,
        order=40,
    )
    for dtype in ("fp16", "bf16"):
        getter = f"_get_cublas_allow_{dtype}_reduced_precision_reduction"
        setter = f"_set_cublas_allow_{dtype}_reduced_precision_reduction"
        name = f"cuda.matmul.allow_{dtype}_reduced_precision_reduction"
        if has(getter) and has(setter):
            paired = isinstance(getattr(C, getter)(), tuple)
            rows.append(
                Flag(
                    name,
                    getattr(C, getter),
                    pair_writer(getattr(C, setter), paired),
                    reduction_pair if paired else check_bool,
                    "a bool or (allow_reduced, allow_splitk)" if paired else "True, False",
                    f"reduced-precision reductions in {dtype} cuBLAS GEMMs",
                )
            )
        else:
            absent[name] = "not in this torch"
    c_flag(
        "cuda.matmul.allow_fp16_accumulation",
        "_get_cublas_allow_fp16_accumulation",
        "_set_cublas_allow_fp16_accumulation",
        "fp16 accumulation in fp16 cuBLAS GEMMs",
    )
    c_flag(
        "cpu.allow_fp16_reduced_precision_reduction",
        "_get_cpu_allow_fp16_reduced_precision_reduction",
        "_set_cpu_allow_fp16_reduced_precision_reduction",
        "reduced-precision reductions in fp16 CPU GEMMs",
    )

    # The fp32_precision tree (torch >= 2.9).
    for name, backend, op, parent in FP32_ROWS:
        if not new_precision:
            absent[name] = "needs the fp32_precision API (torch >= 2.9)"
            continue
        choices = CUDA_PRECISIONS if backend == "cuda" else ALL_PRECISIONS
        rows.append(
            Flag(
                name,
                functools.partial(C._get_fp32_precision_getter, backend, op),
                functools.partial(C._set_fp32_precision_setter, backend, op),
                one_of(*choices),
                ", ".join(choices),
                f"fp32 precision of {backend}/{op} ('none' inherits from its parent)",
                order={"generic": 10}.get(backend, 20 if op == "all" else 30),
                parent=parent,
            )
        )
    # torch.set_float32_matmul_precision keeps a legacy value of its own next
    # to the fp32_precision strings; when the two disagree, the legacy getters
    # (and code such as inductor that calls them) raise.  So it is snapshotted
    # too, and written before the strings, which then win.
    add(
        "float32_matmul_precision",
        has("_get_float32_matmul_precision") or "not in this torch",
        functools.partial(read_or_mixed, getattr(C, "_get_float32_matmul_precision", missing_flag)),
        functools.partial(write_unless_mixed, torch.set_float32_matmul_precision),
        one_of("highest", "high", "medium"),
        "'highest', 'high', 'medium'",
        "torch.set_float32_matmul_precision (legacy API)",
        order=5,
    )
    # SDPA
    for short, getter, setter in (
        ("flash", "_get_flash_sdp_enabled", "_set_sdp_use_flash"),
        ("mem_efficient", "_get_mem_efficient_sdp_enabled", "_set_sdp_use_mem_efficient"),
        ("math", "_get_math_sdp_enabled", "_set_sdp_use_math"),
        ("cudnn", "_get_cudnn_sdp_enabled", "_set_sdp_use_cudnn"),
        ("fa3", "_get_fa3_sdp_enabled", "_set_sdp_use_fa3"),
        ("overrideable", "_get_overrideable_sdp_enabled", "_set_sdp_use_overrideable"),
    ):
        c_flag(f"sdp.{short}", getter, setter, f"allow the {short} SDPA kernel")
    add(
        "sdp.priority_order",
        (has("_get_sdp_priority_order") and has("_set_sdp_priority_order")) or "not in this torch",
        getattr(C, "_get_sdp_priority_order", missing_flag),
        getattr(C, "_set_sdp_priority_order", missing_flag),
        functools.partial(priority_order, torch),
        "a permutation of the SDPBackend values",
        "the order in which SDPA kernels are tried",
        plain=list,
    )
    c_flag(
        "sdp.allow_fp16_bf16_reduction_math",
        "_get_math_sdp_allow_fp16_bf16_reduction",
        "_set_math_sdp_allow_fp16_bf16_reduction",
        "reduced-precision reductions in the math SDPA kernel",
    )

    # CUDA libraries
    cuda_mod = torch.backends.cuda
    add(
        "cuda.preferred_linalg_library",
        has("_get_linalg_preferred_backend") or "not in this torch",
        C._get_linalg_preferred_backend if has("_get_linalg_preferred_backend") else missing_flag,
        cuda_mod.preferred_linalg_library if has("_get_linalg_preferred_backend") else missing_flag,
        one_of("default", "cusolver", "magma"),
        "'default', 'cusolver', 'magma'",
        "linear-algebra library for CUDA tensors",
        plain=enum_name,
    )
    add(
        "cuda.preferred_blas_library",
        has("_get_blas_preferred_backend") or "not in this torch",
        C._get_blas_preferred_backend if has("_get_blas_preferred_backend") else missing_flag,
        cuda_mod.preferred_blas_library if has("_get_blas_preferred_backend") else missing_flag,
        functools.partial(_blas_library, torch),
        "'default', 'cublas', 'cublaslt', 'hipblas', 'hipblaslt', 'ck'",
        "BLAS library for CUDA tensors",
        plain=enum_name,
    )
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            cache = cuda_mod.cufft_plan_cache[index]
            rows.append(
                Flag(
                    f"cuda.cufft_plan_cache[{index}].max_size",
                    functools.partial(outside_modes, torch, getattr, cache, "max_size"),
                    functools.partial(outside_modes, torch, setattr, cache, "max_size"),
                    non_negative_int,
                    "a non-negative int",
                    f"cuFFT plan cache size, cuda:{index}",
                )
            )
    else:
        absent["cuda.cufft_plan_cache[0].max_size"] = "needs CUDA"

    # Other backends
    c_flag(
        "nnpack.enabled", "_get_nnpack_enabled", "_set_nnpack_enabled", "use NNPACK convolutions"
    )
    # Torch lets these be set (as plain attributes) even without the
    # opt_einsum package, so they are state to restore whether or not it is installed.
    einsum = torch.backends.opt_einsum
    einsum_ok = bool(getattr(einsum, "is_available", lambda: False)())
    add(
        "opt_einsum.enabled",
        True,
        attribute_reader(einsum, "enabled"),
        functools.partial(set_attr, torch, einsum, "enabled"),
        check_bool,
        "True, False",
        "contract einsum operands with opt_einsum"
        + ("" if einsum_ok else " (no effect without the opt_einsum package)"),
    )
    add(
        "opt_einsum.strategy",
        True,
        attribute_reader(einsum, "strategy"),
        functools.partial(set_attr, torch, einsum, "strategy"),
        one_of("auto", "greedy", "optimal"),
        "'auto', 'greedy', 'optimal'",
        "opt_einsum path strategy",
    )
    mha = getattr(torch.backends, "mha", None)
    add(
        "mha.fastpath_enabled",
        (mha is not None) or "needs torch.backends.mha",
        getattr(mha, "get_fastpath_enabled", missing_flag),
        getattr(mha, "set_fastpath_enabled", missing_flag),
        check_bool,
        "True, False",
        "nn.MultiheadAttention fast path",
    )
    quantized = torch.backends.quantized
    engines = tuple(str(e) for e in quantized.supported_engines)
    add(
        "quantized.engine",
        True,
        C._get_qengine,
        functools.partial(setattr, quantized, "engine"),
        one_of(*engines),
        ", ".join(map(repr, engines)),
        "quantized kernel engine",
        plain=lambda _raw: str(quantized.engine),
    )

    # Determinism
    add(
        "deterministic_algorithms",
        True,
        C._get_deterministic_algorithms,
        lambda v: torch.use_deterministic_algorithms(
            v, warn_only=torch.is_deterministic_algorithms_warn_only_enabled()
        ),
        check_bool,
        "True, False",
        "torch.use_deterministic_algorithms(mode)",
    )
    add(
        "deterministic_algorithms.warn_only",
        has("_get_deterministic_algorithms_warn_only") or "not in this torch",
        getattr(C, "_get_deterministic_algorithms_warn_only", missing_flag),
        lambda v: torch.use_deterministic_algorithms(
            torch.are_deterministic_algorithms_enabled(), warn_only=v
        ),
        check_bool,
        "True, False",
        "warn instead of raising for nondeterministic ops",
        order=60,
    )
    c_flag(
        "deterministic.fill_uninitialized_memory",
        "_get_deterministic_fill_uninitialized_memory",
        "_set_deterministic_fill_uninitialized_memory",
        "fill uninitialized memory (torch.empty*) in deterministic mode",
    )

    # Defaults, threads and autograd switches
    add(
        "default_dtype",
        True,
        torch.get_default_dtype,
        lambda v: torch.set_default_dtype(dtype_of(torch, v)),
        functools.partial(dtype_check, torch),
        "'float32', 'float64', 'float16', 'bfloat16'",
        "torch.get_default_dtype()",
        plain=dtype_name,
    )
    device_read, device_plain = default_device_reader(torch)
    add(
        "default_device",
        hasattr(torch, "get_default_device") or "needs torch >= 2.3",
        device_read,
        functools.partial(write_default_device, torch),
        any_str,
        "a device string",
        "torch.set_default_device()",
        plain=device_plain,
    )
    add(
        "num_threads",
        True,
        torch.get_num_threads,
        torch.set_num_threads,
        positive_int,
        "a positive int",
        "intra-op CPU threads",
    )
    add(
        "autograd.grad_enabled",
        True,
        torch.is_grad_enabled,
        torch.set_grad_enabled,
        check_bool,
        "True, False",
        "torch.is_grad_enabled()",
    )
    add(
        "autograd.anomaly_enabled",
        True,
        torch.is_anomaly_enabled,
        lambda v: torch.set_anomaly_enabled(v, torch.is_anomaly_check_nan_enabled()),
        check_bool,
        "True, False",
        "autograd anomaly detection",
    )
    add(
        "autograd.anomaly_check_nan",
        hasattr(torch, "is_anomaly_check_nan_enabled") or "not in this torch",
        getattr(torch, "is_anomaly_check_nan_enabled", missing_flag),
        lambda v: torch.set_anomaly_enabled(torch.is_anomaly_enabled(), v),
        check_bool,
        "True, False",
        "anomaly detection also checks for NaN",
        order=60,
    )
    add(
        "warn_always",
        True,
        getattr(C, "_get_warnAlways", torch.is_warn_always_enabled),
        torch.set_warn_always,
        check_bool,
        "True, False",
        "torch.set_warn_always",
    )
    add(
        "flush_denormal",
        flush_denormal_readable(torch) or "not readable on this CPU",
        read_flush_denormal,
        torch.set_flush_denormal,
        check_bool,
        "True, False",
        "torch.set_flush_denormal (calling thread's FTZ/DAZ mode)",
    )
    autocast_rows(torch, add)
    process_rows(torch, add, c_flag)
    device_rows(torch, add)
    switch_rows(torch, add, c_flag)
    attr_read, attr_write, (attr_plain, attr_check) = module_attribute_row(
        torch, [(einsum, "enabled"), (einsum, "strategy")]
    )
    add(
        MODULE_ATTRIBUTES,
        True,
        attr_read,
        attr_write,
        attr_check,
        "[] (torch's own attributes; restored by the guard only)",
        "attributes set on the torch.backends modules (torch.backends.nnpack.enabled = ...)",
        plain=attr_plain,
        order=95,
    )
    unmanaged_rows(torch, rows, absent)

    # The freeze switch of torch.backends.disable_global_flags(); written last,
    # after every ContextProp row was written under the mutation allowance.
    backends = torch.backends
    add(
        "flags_frozen",
        (hasattr(backends, "flags_frozen") and FROZEN_ATTR in backends_globals(torch))
        or "not in this torch",
        getattr(backends, "flags_frozen", missing_flag),
        functools.partial(set_frozen, torch),
        check_bool,
        "True, False",
        "torch.backends.disable_global_flags() was called",
        order=99,
        last=True,
    )
    return rows, absent
