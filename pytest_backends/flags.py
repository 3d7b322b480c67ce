"""The registry of torch's process-global backend state.

One declarative table (:func:`_catalogue`) has a row per piece of global
state: cuDNN, oneDNN, cuBLAS, the ``fp32_precision`` tree, SDPA, determinism,
defaults and threads.  Each row knows how to read the raw value cheaply, how
to turn it into a plain value, how to validate and write a new one, and
whether it exists in the running torch.  Everything else in the package goes
through this module to touch flags.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import struct
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Check = Callable[[object], object]

__all__ = [
    "Flag",
    "FlagRegistry",
    "diff_flags",
    "flag_names",
    "override_flags",
    "registry",
    "restore_flags",
    "snapshot_flags",
]


@dataclass(frozen=True)
class Flag:
    """One piece of global torch state.

    ``read`` returns the raw value (cheap, used for fingerprints); ``plain``
    converts it into a plain Python value; ``check`` validates and normalises
    a user value (raising ``ValueError`` with a message that lists the allowed
    values); ``write`` applies a normalised value.  ``in_snapshot`` is False
    for legacy aliases whose state is already captured by other rows.
    ``parent`` names the row this one inherits from (``fp32_precision`` tree).
    ``last`` rows are written after all others and outside the mutation
    allowance (the ``disable_global_flags`` switch itself).
    """

    name: str
    read: Callable[[], object]
    write: Callable[[Any], object]
    check: Check
    allowed: str
    doc: str
    plain: Callable[[Any], object] = lambda v: v
    order: int = 50
    in_snapshot: bool = True
    parent: str | None = None
    last: bool = False


class _Invalid(ValueError):
    """A value failed validation; the registry adds the flag name."""


def _bool(value: object) -> object:
    if isinstance(value, bool):
        return value
    raise _Invalid(f"expected True or False, got {value!r}")


def _choice(*choices: str) -> Check:
    def check(value: object) -> object:
        if isinstance(value, str) and value in choices:
            return value
        raise _Invalid(f"expected one of {', '.join(map(repr, choices))}, got {value!r}")

    return check


def _positive_int(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise _Invalid(f"expected a positive int, got {value!r}")


def _reduction_pair(value: object) -> object:
    """cuBLAS reduced-precision settings: a bool or (allow_reduced, allow_splitk)."""
    if isinstance(value, bool):
        return (value, True)
    if (
        isinstance(value, (tuple, list))
        and 1 <= len(value) <= 2
        and all(isinstance(v, bool) for v in value)
    ):
        return (value[0], value[1] if len(value) == 2 else True)
    raise _Invalid(f"expected a bool or a pair (allow_reduced, allow_splitk), got {value!r}")


def _unfrozen(torch: Any) -> contextlib.AbstractContextManager[object]:
    """Allow ContextProp writes even after ``disable_global_flags()``.

    The previous frozen state is put back on exit, so user code that froze
    the flags still sees them frozen.
    """
    allow = getattr(torch.backends, "__allow_nonbracketed_mutation", None)
    return allow() if allow is not None else contextlib.nullcontext()


# Precision strings accepted per fp32_precision backend (DESIGN A.2, item 5).
_CUDA_PRECISIONS = ("ieee", "tf32", "none")
_ALL_PRECISIONS = ("ieee", "tf32", "bf16", "none")
_FP32_ROWS: tuple[tuple[str, str, str, str | None], ...] = (
    # name, backend, op, parent
    ("fp32_precision", "generic", "all", None),
    ("cudnn.fp32_precision", "cuda", "all", "fp32_precision"),
    ("cuda.matmul.fp32_precision", "cuda", "matmul", "cudnn.fp32_precision"),
    ("cudnn.conv.fp32_precision", "cuda", "conv", "cudnn.fp32_precision"),
    ("cudnn.rnn.fp32_precision", "cuda", "rnn", "cudnn.fp32_precision"),
    ("mkldnn.fp32_precision", "mkldnn", "all", "fp32_precision"),
    ("mkldnn.matmul.fp32_precision", "mkldnn", "matmul", "mkldnn.fp32_precision"),
    ("mkldnn.conv.fp32_precision", "mkldnn", "conv", "mkldnn.fp32_precision"),
    ("mkldnn.rnn.fp32_precision", "mkldnn", "rnn", "mkldnn.fp32_precision"),
)


def _catalogue(torch: Any) -> tuple[list[Flag], dict[str, str]]:
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
        add(name, exists, read or _missing, write or _missing, _bool, "True, False", doc, **extra)

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
        getattr(C, "_get_cudnn_depthwise_kernel", _missing),
        getattr(C, "_set_cudnn_depthwise_kernel", _missing),
        _choice("auto", "cudnn", "native"),
        "'auto', 'cudnn', 'native'",
        "cuDNN depthwise convolution kernel choice",
    )
    add(
        "cudnn.benchmark_limit",
        (cudnn_available and has("_cuda_get_cudnn_benchmark_limit")) or "needs cuDNN",
        getattr(C, "_cuda_get_cudnn_benchmark_limit", _missing),
        getattr(C, "_cuda_set_cudnn_benchmark_limit", _missing),
        _positive_int,
        "a positive int",
        "cuDNN v8 API: how many algorithms benchmark tries",
    )
    # Like float32_matmul_precision below, the legacy cuDNN TF32 switch keeps
    # state of its own beside the fp32_precision strings, so it is snapshotted
    # and written before them.
    add(
        "cudnn.allow_tf32",
        (has("_get_cudnn_allow_tf32") and has("_set_cudnn_allow_tf32")) or "not in this torch",
        functools.partial(_read_or_mixed, getattr(C, "_get_cudnn_allow_tf32", _missing)),
        functools.partial(_write_unless_mixed, getattr(C, "_set_cudnn_allow_tf32", _missing)),
        _bool,
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
                    _pair_writer(getattr(C, setter), paired),
                    _reduction_pair if paired else _bool,
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
    for name, backend, op, parent in _FP32_ROWS:
        if not new_precision:
            absent[name] = "needs the fp32_precision API (torch >= 2.9)"
            continue
        choices = _CUDA_PRECISIONS if backend == "cuda" else _ALL_PRECISIONS
        rows.append(
            Flag(
                name,
                functools.partial(C._get_fp32_precision_getter, backend, op),
                functools.partial(C._set_fp32_precision_setter, backend, op),
                _choice(*choices),
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
        functools.partial(_read_or_mixed, getattr(C, "_get_float32_matmul_precision", _missing)),
        functools.partial(_write_unless_mixed, torch.set_float32_matmul_precision),
        _choice("highest", "high", "medium"),
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
        getattr(C, "_get_sdp_priority_order", _missing),
        getattr(C, "_set_sdp_priority_order", _missing),
        functools.partial(_priority_order, torch),
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
        C._get_linalg_preferred_backend if has("_get_linalg_preferred_backend") else _missing,
        cuda_mod.preferred_linalg_library if has("_get_linalg_preferred_backend") else _missing,
        _choice("default", "cusolver", "magma"),
        "'default', 'cusolver', 'magma'",
        "linear-algebra library for CUDA tensors",
        plain=_enum_name,
    )
    add(
        "cuda.preferred_blas_library",
        has("_get_blas_preferred_backend") or "not in this torch",
        C._get_blas_preferred_backend if has("_get_blas_preferred_backend") else _missing,
        cuda_mod.preferred_blas_library if has("_get_blas_preferred_backend") else _missing,
        _choice("cublas", "cublaslt", "ck"),
        "'cublas', 'cublaslt', 'ck'",
        "BLAS library for CUDA tensors",
        plain=_enum_name,
    )
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            cache = cuda_mod.cufft_plan_cache[index]
            rows.append(
                Flag(
                    f"cuda.cufft_plan_cache[{index}].max_size",
                    functools.partial(getattr, cache, "max_size"),
                    functools.partial(setattr, cache, "max_size"),
                    _non_negative_int,
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
        lambda: einsum.enabled,
        functools.partial(_set_attr, torch, einsum, "enabled"),
        _bool,
        "True, False",
        "contract einsum operands with opt_einsum"
        + ("" if einsum_ok else " (no effect without the opt_einsum package)"),
    )
    add(
        "opt_einsum.strategy",
        True,
        lambda: getattr(einsum, "strategy", None),
        functools.partial(_set_attr, torch, einsum, "strategy"),
        _choice("auto", "greedy", "optimal"),
        "'auto', 'greedy', 'optimal'",
        "opt_einsum path strategy",
    )
    mha = getattr(torch.backends, "mha", None)
    add(
        "mha.fastpath_enabled",
        (mha is not None) or "needs torch.backends.mha",
        getattr(mha, "get_fastpath_enabled", _missing),
        getattr(mha, "set_fastpath_enabled", _missing),
        _bool,
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
        _choice(*engines),
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
        _bool,
        "True, False",
        "torch.use_deterministic_algorithms(mode)",
    )
    add(
        "deterministic_algorithms.warn_only",
        has("_get_deterministic_algorithms_warn_only") or "not in this torch",
        getattr(C, "_get_deterministic_algorithms_warn_only", _missing),
        lambda v: torch.use_deterministic_algorithms(
            torch.are_deterministic_algorithms_enabled(), warn_only=v
        ),
        _bool,
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
        lambda v: torch.set_default_dtype(_dtype(torch, v)),
        functools.partial(_check_dtype, torch),
        "'float32', 'float64', 'float16', 'bfloat16'",
        "torch.get_default_dtype()",
        plain=_dtype_name,
    )
    device_read, device_plain = _default_device_reader(torch)
    add(
        "default_device",
        hasattr(torch, "get_default_device") or "needs torch >= 2.3",
        device_read,
        functools.partial(_set_default_device, torch),
        _any_str,
        "a device string",
        "torch.set_default_device()",
        plain=device_plain,
    )
    add(
        "num_threads",
        True,
        torch.get_num_threads,
        torch.set_num_threads,
        _positive_int,
        "a positive int",
        "intra-op CPU threads",
    )
    add(
        "autograd.grad_enabled",
        True,
        torch.is_grad_enabled,
        torch.set_grad_enabled,
        _bool,
        "True, False",
        "torch.is_grad_enabled()",
    )
    add(
        "autograd.anomaly_enabled",
        True,
        torch.is_anomaly_enabled,
        lambda v: torch.set_anomaly_enabled(v, torch.is_anomaly_check_nan_enabled()),
        _bool,
        "True, False",
        "autograd anomaly detection",
    )
    add(
        "autograd.anomaly_check_nan",
        hasattr(torch, "is_anomaly_check_nan_enabled") or "not in this torch",
        getattr(torch, "is_anomaly_check_nan_enabled", _missing),
        lambda v: torch.set_anomaly_enabled(torch.is_anomaly_enabled(), v),
        _bool,
        "True, False",
        "anomaly detection also checks for NaN",
        order=60,
    )
    add(
        "warn_always",
        True,
        torch.is_warn_always_enabled,
        torch.set_warn_always,
        _bool,
        "True, False",
        "torch.set_warn_always",
    )
    add(
        "flush_denormal",
        _flush_denormal_readable(torch) or "not readable on this CPU",
        _read_flush_denormal,
        torch.set_flush_denormal,
        _bool,
        "True, False",
        "torch.set_flush_denormal (calling thread's FTZ/DAZ mode)",
    )
    _autocast_rows(torch, add)
    _process_rows(torch, add, c_flag)
    _device_rows(torch, add)

    # The freeze switch of torch.backends.disable_global_flags(); written last,
    # after every ContextProp row was written under the mutation allowance.
    backends = torch.backends
    add(
        "flags_frozen",
        (hasattr(backends, "flags_frozen") and _FROZEN_ATTR in _backends_globals(torch))
        or "not in this torch",
        getattr(backends, "flags_frozen", _missing),
        functools.partial(_set_frozen, torch),
        _bool,
        "True, False",
        "torch.backends.disable_global_flags() was called",
        order=99,
        last=True,
    )
    return rows, absent


_FROZEN_ATTR = "__allow_nonbracketed_mutation_flag"


def _backends_globals(torch: Any) -> dict[str, Any]:
    # torch.backends may be a module wrapper; its functions see the real globals
    return getattr(torch.backends.flags_frozen, "__globals__", {})


def _set_frozen(torch: Any, value: bool) -> None:
    if value:
        torch.backends.disable_global_flags()
    else:
        _backends_globals(torch)[_FROZEN_ATTR] = True


# The smallest subnormal double; FTZ/DAZ (set_flush_denormal) turns a product
# with it into zero.  Module globals, so that nothing is folded at compile time.
_SUBNORMAL = struct.unpack("<d", struct.pack("<Q", 1))[0]
_ONE = 1.0


def _read_flush_denormal() -> object:
    return _SUBNORMAL * _ONE == 0.0


def _flush_denormal_readable(torch: Any) -> bool:
    """Whether set_flush_denormal works here and its state shows in float arithmetic."""
    setter = getattr(torch, "set_flush_denormal", None)
    if setter is None:
        return False
    before = bool(_read_flush_denormal())
    try:
        supported = bool(setter(True))
        readable = supported and _read_flush_denormal() is True
    finally:
        setter(before)
    return readable and _read_flush_denormal() is before


_AUTOCAST_DTYPES = ("float16", "bfloat16")


def _autocast_rows(torch: Any, add: Callable[..., None]) -> None:
    """Autocast state per device type (enabled, dtype) and the cast cache switch.

    torch >= 2.4 takes a device type; older releases have per-device functions
    for the CPU and CUDA only.
    """

    def check_dtype(value: object) -> object:
        name = _dtype_name(value) if isinstance(value, torch.dtype) else value
        if name in _AUTOCAST_DTYPES:
            return name
        raise _Invalid(f"expected one of {', '.join(map(repr, _AUTOCAST_DTYPES))}, got {value!r}")

    def dtype_writer(setter: Callable[..., object], *device: str) -> Callable[[Any], object]:
        return _clearing(torch, lambda v: setter(*device, _dtype(torch, v)))

    try:
        torch.is_autocast_enabled("cpu")
        by_device = True
    except TypeError:
        by_device = False
    devices = ["cpu", "cuda"]
    if by_device:
        devices += [d for d in ("xpu", "mps") if _device_available(torch, d)]
    legacy = {
        "cpu": (
            "is_autocast_cpu_enabled",
            "set_autocast_cpu_enabled",
            "get_autocast_cpu_dtype",
            "set_autocast_cpu_dtype",
        ),
        "cuda": (
            "is_autocast_enabled",
            "set_autocast_enabled",
            "get_autocast_gpu_dtype",
            "set_autocast_gpu_dtype",
        ),
    }
    for device in devices:
        name = f"autocast.{device}"
        if by_device and hasattr(torch, "get_autocast_dtype"):
            read_on = functools.partial(torch.is_autocast_enabled, device)
            write_on = functools.partial(torch.set_autocast_enabled, device)
            read_dtype = functools.partial(torch.get_autocast_dtype, device)
            write_dtype = dtype_writer(torch.set_autocast_dtype, device)
            exists: bool | str = True
        else:
            names = legacy.get(device)
            exists = names is not None and all(hasattr(torch, n) for n in names)
            if not exists or names is None:
                add(f"{name}.enabled", "not in this torch", _missing, _missing, _bool, "", "")
                continue
            read_on, write_on, read_dtype = (getattr(torch, n) for n in names[:3])
            write_dtype = dtype_writer(getattr(torch, names[3]))
        add(
            f"{name}.enabled",
            exists,
            read_on,
            _clearing(torch, write_on),
            _bool,
            "True, False",
            f"autocast enabled outside a context manager ({device})",
        )
        add(
            f"{name}.dtype",
            exists,
            read_dtype,
            write_dtype,
            check_dtype,
            ", ".join(map(repr, _AUTOCAST_DTYPES)),
            f"autocast dtype ({device})",
            plain=_dtype_name,
        )
    add(
        "autocast.cache_enabled",
        (
            hasattr(torch, "is_autocast_cache_enabled")
            and hasattr(torch, "set_autocast_cache_enabled")
        )
        or "not in this torch",
        getattr(torch, "is_autocast_cache_enabled", _missing),
        _clearing(torch, getattr(torch, "set_autocast_cache_enabled", _missing)),
        _bool,
        "True, False",
        "autocast weight-cast cache",
    )
    # torch.autocast.__enter__ increments a nesting count and __exit__ clears the
    # cast cache only when it drops back to 0: a test that enters autocast and
    # never exits would leave every later autocast region caching casts forever.
    add(
        "autocast.nesting",
        (
            hasattr(torch, "autocast_increment_nesting")
            and hasattr(torch, "autocast_decrement_nesting")
        )
        or "not in this torch",
        functools.partial(_read_nesting, torch),
        functools.partial(_write_nesting, torch),
        _non_negative_int,
        "a non-negative int",
        "autocast regions entered and not exited (the cast cache is cleared on restore)",
    )


def _clearing(torch: Any, write: Callable[[Any], object]) -> Callable[[Any], object]:
    """``write``, then clear autocast's cast cache (stale casts of changed weights)."""
    clear = getattr(torch, "clear_autocast_cache", None)

    def write_and_clear(value: Any) -> object:
        result = write(value)
        if clear is not None:
            clear()
        return result

    return write_and_clear


def _read_nesting(torch: Any) -> object:
    level = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return int(level) - 1


def _write_nesting(torch: Any, value: int) -> None:
    level = int(_read_nesting(torch))  # type: ignore[call-overload]
    while level < value:
        level = int(torch.autocast_increment_nesting())
    while level > value:
        level = int(torch.autocast_decrement_nesting())
    torch.clear_autocast_cache()


def _read_by_swap(swap: Callable[[bool], object]) -> object:
    """Read a TorchScript switch whose only API sets a value and returns the old one."""
    old = bool(swap(True))
    swap(old)
    return old


_PRINT_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("precision", "a non-negative int", "digits after the decimal point"),
    ("threshold", "a non-negative number", "elements before a tensor is summarized"),
    ("edgeitems", "a non-negative int", "elements shown at each edge when summarized"),
    ("linewidth", "a positive int", "characters per line"),
    ("sci_mode", "None, True, False", "scientific notation (None: automatic)"),
)


def _print_option_check(option: str) -> Check:
    def check(value: object) -> object:
        if option == "sci_mode":
            if value is None or isinstance(value, bool):
                return value
        elif option == "threshold":
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                return value
        elif option == "linewidth":
            return _positive_int(value)
        else:
            return _non_negative_int(value)
        raise _Invalid(f"expected {dict((o, a) for o, a, _ in _PRINT_OPTIONS)[option]}")

    return check


def _string_set_check(value: object) -> object:
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return sorted(value)
    raise _Invalid(f"expected a list of names, got {value!r}")


def _process_rows(torch: Any, add: Callable[..., None], c_flag: Callable[..., None]) -> None:
    """Printing, sparse checks, TorchScript, autograd modes and the newer switches."""
    C = torch._C
    options = getattr(getattr(torch, "_tensor_str", None), "PRINT_OPTS", None)
    for option, allowed, doc in _PRINT_OPTIONS:
        add(
            f"printoptions.{option}",
            hasattr(options, option) or "not in this torch",
            functools.partial(getattr, options, option),
            functools.partial(setattr, options, option),
            _print_option_check(option),
            allowed,
            f"torch.set_printoptions({option}=): {doc}",
        )
    c_flag(
        "sparse.check_invariants",
        "_check_sparse_tensor_invariants",
        "_set_check_sparse_tensor_invariants",
        "torch.sparse.check_sparse_tensor_invariants.enable(): check every sparse tensor built",
    )
    # TorchScript executor and fuser switches
    for name, swap, doc in (
        ("jit.profiling_executor", "_jit_set_profiling_executor", "the profiling executor"),
        ("jit.profiling_mode", "_jit_set_profiling_mode", "profiling mode (legacy switch)"),
    ):
        add(
            name,
            _has_attr(C, swap) or "not in this torch",
            functools.partial(_read_by_swap, getattr(C, swap, _missing)),
            getattr(C, swap, _missing),
            _bool,
            "True, False",
            f"TorchScript: {doc} (torch._C.{swap})",
        )
    for name, getter, setter, doc in (
        ("jit.texpr_fuser", "_jit_texpr_fuser_enabled", "_jit_set_texpr_fuser_enabled", "NNC"),
        ("jit.can_fuse_on_cpu", "_jit_can_fuse_on_cpu", "_jit_override_can_fuse_on_cpu", "CPU"),
        (
            "jit.graph_executor_optimize",
            "_get_graph_executor_optimize",
            "_set_graph_executor_optimize",
            "graph",
        ),
    ):
        c_flag(name, getter, setter, f"TorchScript: {doc} fusion/optimization (torch._C.{setter})")
    # the GPU fuser switch reads False whatever is set on a build without CUDA
    gpu_fuser = _has_attr(C, "_jit_can_fuse_on_gpu") and _has_attr(
        C, "_jit_override_can_fuse_on_gpu"
    )
    add(
        "jit.can_fuse_on_gpu",
        (gpu_fuser and bool(torch.backends.cuda.is_built())) or "needs a CUDA build",
        getattr(C, "_jit_can_fuse_on_gpu", _missing),
        getattr(C, "_jit_override_can_fuse_on_gpu", _missing),
        _bool,
        "True, False",
        "TorchScript: GPU fusion (torch._C._jit_override_can_fuse_on_gpu)",
    )
    # autograd modes (per thread, like grad mode: the thread that runs the tests)
    c_flag(
        "autograd.multithreading_enabled",
        "_is_multithreading_enabled",
        "_set_multithreading_enabled",
        "autograd runs backward on device threads (torch.autograd.set_multithreading_enabled)",
    )
    c_flag(
        "autograd.fwd_grad_enabled",
        "_is_fwd_grad_enabled",
        "_set_fwd_grad_enabled",
        "forward-mode AD enabled (torch._C._set_fwd_grad_enabled)",
    )
    c_flag(
        "autograd.view_replay_enabled",
        "_is_view_replay_enabled",
        "_set_view_replay_enabled",
        "autograd replays views (torch.autograd.graph.set_view_replay_enabled / functorch)",
    )
    # ROCm and newer CUDA switches: CPU builds have them too, and a test can set them
    c_flag(
        "miopen.immediate",
        "_get_miopen_immediate",
        "_set_miopen_immediate",
        "MIOpen immediate mode (torch.backends.miopen.immediate)",
    )
    rocm_fa = _has_attr(C, "_get_rocm_fa_preferred_backend") and hasattr(
        torch.backends.cuda, "preferred_rocm_fa_library"
    )
    add(
        "cuda.preferred_rocm_fa_library",
        rocm_fa or "not in this torch",
        getattr(C, "_get_rocm_fa_preferred_backend", _missing),
        getattr(torch.backends.cuda, "preferred_rocm_fa_library", _missing),
        _choice("default", "aotriton", "ck"),
        "'default', 'aotriton', 'ck'",
        "Flash Attention library on ROCm",
        plain=_enum_name,
    )
    add(
        "cuda.matmul.prefer_cublaslt_grouped_gemm",
        (
            _has_attr(C, "_get_cublaslt_prefer_grouped_gemm")
            and _has_attr(C, "_set_cublaslt_prefer_grouped_gemm")
        )
        or "needs torch >= 2.14",
        getattr(C, "_get_cublaslt_prefer_grouped_gemm", _missing),
        getattr(C, "_set_cublaslt_prefer_grouped_gemm", _missing),
        _bool,
        "True, False",
        "grouped GEMMs through cuBLASLt",
    )
    _python_native_rows(torch, add)


def _has_attr(obj: object, name: str) -> bool:
    """``hasattr`` that never raises (module wrappers with a strict ``__getattr__``)."""
    try:
        return hasattr(obj, name)
    except Exception:
        return False


_PYTHON_NATIVE_DSLS = ("triton", "cutedsl", "helion")


def _python_native_rows(torch: Any, add: Callable[..., None]) -> None:
    """torch.backends.python_native: DSL overrides switched off per DSL, op or dispatch key."""
    native = getattr(torch.backends, "python_native", None)
    state = None
    dsls: list[str] = []
    if native is not None:
        with contextlib.suppress(Exception):  # an unusual build: no rows, listed as absent
            from torch._native import registry as native_registry

            state = native_registry._filter_state
            dsls = [str(d) for d in native.all_dsls]
    reason = "needs torch.backends.python_native (torch >= 2.13)"
    for dsl in sorted(set(_PYTHON_NATIVE_DSLS) | set(dsls)):
        exists: bool | str = (state is not None and dsl in dsls) or (
            "not in this torch" if state is not None else reason
        )
        add(
            f"python_native.{dsl}.enabled",
            exists,
            functools.partial(_not_in, state, "_dsl_names", dsl),
            functools.partial(_native_dsl_write, native, dsl),
            _bool,
            "True, False",
            f"DSL operation overrides from {dsl} (torch.backends.python_native.{dsl}.enabled)",
        )
    for kind, attr, what in (
        ("operations", "_op_symbols", "operations"),
        ("dispatch_keys", "_dispatch_keys", "dispatch keys"),
    ):
        add(
            f"python_native.disabled_{kind}",
            (state is not None) or reason,
            functools.partial(_frozen_copy, state, attr),
            functools.partial(_native_set_write, native, state, attr, kind),
            _string_set_check,
            "a list of names",
            f"{what} switched off with torch.backends.python_native.disable_{kind}()",
            plain=sorted,
        )


def _not_in(state: Any, attr: str, name: str) -> object:
    return name not in getattr(state, attr)


def _frozen_copy(state: Any, attr: str) -> object:
    return frozenset(getattr(state, attr))


def _native_dsl_write(native: Any, dsl: str, value: bool) -> None:
    import warnings

    with warnings.catch_warnings():
        # re-registering a DSL's kernels warns that it overrides the fallback kernel
        warnings.simplefilter("ignore")
        controller = getattr(native, dsl)
        if value:
            controller.enable()
        else:
            controller.disable()


def _native_set_write(native: Any, state: Any, attr: str, kind: str, value: list[str]) -> None:
    import warnings

    current = set(getattr(state, attr))
    wanted = set(value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if current - wanted:
            getattr(native, f"enable_{kind}")(*sorted(current - wanted))
        if wanted - current:
            getattr(native, f"disable_{kind}")(*sorted(wanted - current))


def _device_rows(torch: Any, add: Callable[..., None]) -> None:
    """State that can only be read with a CUDA device: probed only where one exists."""
    cuda = getattr(torch, "cuda", None)
    available = _device_available(torch, "cuda")
    need = "needs a CUDA device (probed only where one exists)"
    C = torch._C
    add(
        "cuda.sync_debug_mode",
        (available and hasattr(cuda, "get_sync_debug_mode")) or need,
        getattr(cuda, "get_sync_debug_mode", _missing),
        getattr(cuda, "set_sync_debug_mode", _missing),
        _choice_int(0, 1, 2),
        "0 (default), 1 (warn), 2 (error)",
        "torch.cuda.set_sync_debug_mode: report synchronizing CUDA calls",
    )
    for name, getter, setter in (
        (
            "cuda.cublas_workspace_size",
            "_cuda_getCublasWorkspaceSize",
            "_cuda_setCublasWorkspaceSize",
        ),
        (
            "cuda.cublaslt_workspace_size",
            "_cuda_getCublasLtWorkspaceSize",
            "_cuda_setCublasLtWorkspaceSize",
        ),
    ):
        exists: bool | str = need
        if available and _has_attr(C, getter) and _has_attr(C, setter):
            try:
                getattr(C, getter)()
                exists = True
            except Exception as exc:  # the probe failed: not snapshotted, and said why
                exists = f"could not be read here ({type(exc).__name__})"
        elif available:
            exists = "needs torch >= 2.14"
        add(
            name,
            exists,
            getattr(C, getter, _missing),
            getattr(C, setter, _missing),
            _non_negative_int,
            "a non-negative int (bytes)",
            f"cuBLAS{'Lt' if 'Lt' in getter else ''} workspace size of the current device",
        )


def _choice_int(*choices: int) -> Check:
    def check(value: object) -> object:
        names = {"default": 0, "warn": 1, "error": 2}
        value = names.get(value, value) if isinstance(value, str) else value
        if isinstance(value, int) and not isinstance(value, bool) and value in choices:
            return value
        raise _Invalid(f"expected one of {', '.join(map(str, choices))}, got {value!r}")

    return check


def _device_available(torch: Any, device: str) -> bool:
    try:
        if device == "mps":
            return bool(torch.backends.mps.is_available())
        module = getattr(torch, device, None)
        return bool(module is not None and module.is_available())
    except Exception:  # an unusual build: the device type is simply not offered
        return False


#: Plain value of ``float32_matmul_precision`` when its legacy getter raises
#: because the legacy and ``fp32_precision`` APIs were mixed.
MIXED = "<mixed: legacy and fp32_precision APIs disagree>"


def _read_or_mixed(read: Callable[[], object]) -> object:
    try:
        return read()
    except RuntimeError:
        return MIXED


def _write_unless_mixed(write: Callable[[Any], object], value: object) -> None:
    # A mixed legacy state cannot be recreated through public API; the
    # fp32_precision strings written after this still restore what matters.
    if value != MIXED:
        write(value)


def _missing(*_args: object) -> object:
    raise RuntimeError("this flag does not exist in the running torch")


def _any_str(value: object) -> object:
    if isinstance(value, str) and value:
        return value
    raise _Invalid(f"expected a non-empty string, got {value!r}")


def _non_negative_int(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise _Invalid(f"expected a non-negative int, got {value!r}")


def _enum_name(value: object) -> object:
    return str(getattr(value, "name", value)).lower()


def _dtype_name(value: object) -> object:
    return str(value).removeprefix("torch.")


_DEFAULT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def _dtype(torch: Any, value: object) -> Any:
    return getattr(torch, value) if isinstance(value, str) else value


def _check_dtype(torch: Any, value: object) -> object:
    name = _dtype_name(value) if isinstance(value, torch.dtype) else value
    if name in _DEFAULT_DTYPES:
        return name
    raise _Invalid(f"expected one of {', '.join(map(repr, _DEFAULT_DTYPES))}, got {value!r}")


def _priority_order(torch: Any, value: object) -> object:
    members = {int(m): m for name, m in torch._C._SDPBackend.__members__.items() if name != "ERROR"}
    names = {name.lower(): int(m) for name, m in torch._C._SDPBackend.__members__.items()}
    if isinstance(value, (list, tuple)):
        order = [names.get(v.lower(), -1) if isinstance(v, str) else v for v in value]
        if sorted(o for o in order if isinstance(o, int)) == sorted(members) and len(order) == len(
            members
        ):
            return [int(o) for o in order]
    raise _Invalid(
        f"expected a permutation of {sorted(members)} (SDPBackend values), got {value!r}"
    )


def _default_device_reader(torch: Any) -> tuple[Callable[[], object], Callable[[Any], object]]:
    """A cheap raw read of the global default device, and its plain form.

    ``torch.get_default_device()`` walks the mode stack (about 3 us); the
    global setting itself is one thread-local attribute, which is what
    ``set_default_device`` writes.
    """
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if holder is None:
        return getattr(torch, "get_default_device", _missing), str

    def read() -> object:
        return getattr(holder, "device_context", None)

    def plain(context: Any) -> object:
        return "cpu" if context is None else str(context.device)

    return read, plain


def _set_default_device(torch: Any, value: str) -> None:
    # "cpu" is torch's own default: clearing the override avoids leaving a
    # device-context mode installed that every factory call would pay for.
    torch.set_default_device(None if value == "cpu" else value)


def _pair_writer(setter: Callable[..., None], paired: bool) -> Callable[[Any], None]:
    if paired:
        return lambda v: setter(*v)
    return setter


def _set_attr(torch: Any, obj: object, attr: str, value: object) -> None:
    with _unfrozen(torch):
        setattr(obj, attr, value)


class FlagRegistry:
    """Snapshot, validate, apply and restore the flags that exist in a torch."""

    def __init__(self, torch: Any, rows: list[Flag], absent: Mapping[str, str]) -> None:
        self._torch = torch
        self.rows: tuple[Flag, ...] = tuple(sorted(rows, key=lambda r: r.order))
        self.by_name: dict[str, Flag] = {r.name: r for r in self.rows}
        self.absent: dict[str, str] = dict(absent)
        self.snapshot_rows: tuple[Flag, ...] = tuple(r for r in self.rows if r.in_snapshot)
        self._readers = tuple(r.read for r in self.snapshot_rows)

    def names(self) -> list[str]:
        """Every flag name that can be set in this torch (snapshot rows and aliases)."""
        return [r.name for r in self.rows]

    def fingerprint(self) -> tuple[object, ...]:
        """Raw values of every snapshot row: cheap to take and to compare."""
        return tuple([read() for read in self._readers])

    def to_plain(self, fingerprint: tuple[object, ...]) -> dict[str, object]:
        """Turn a :meth:`fingerprint` into a ``{name: plain value}`` snapshot."""
        return {r.name: r.plain(v) for r, v in zip(self.snapshot_rows, fingerprint)}

    def snapshot(self) -> dict[str, object]:
        """Every snapshot row as a plain value."""
        return self.to_plain(self.fingerprint())

    def validate(self, mapping: Mapping[str, object]) -> dict[str, object]:
        """Check names and values; return normalised values or raise ``ValueError``."""
        if not isinstance(mapping, Mapping):
            raise ValueError(f"expected a mapping of flag name to value, got {mapping!r}")
        normalised: dict[str, object] = {}
        for name, value in mapping.items():
            row = self.by_name.get(name) if isinstance(name, str) else None
            if row is None:
                raise ValueError(self._unknown_message(name))
            try:
                normalised[name] = row.check(value)
            except _Invalid as exc:
                raise ValueError(f"invalid value for flag {name!r}: {exc}") from None
        return normalised

    def _unknown_message(self, name: object) -> str:
        if isinstance(name, str) and name in self.absent:
            version = getattr(self._torch, "__version__", "?")
            return f"flag {name!r} does not exist in this torch ({version}): {self.absent[name]}"
        known = self.names()
        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        return f"unknown backend flag {name!r}.{hint} Known flags: {', '.join(known)}"

    def apply(self, normalised: Mapping[str, object]) -> None:
        """Write already-validated values, parents before children.

        A value this build or machine refuses raises ``ValueError``; callers
        restore their snapshot (as :func:`override_flags` does).
        """
        ordered = sorted(normalised.items(), key=lambda kv: self.by_name[kv[0]].order)
        with _unfrozen(self._torch):
            for name, value in ordered:
                if not self.by_name[name].last:
                    self._write(name, value)
        for name, value in ordered:
            if self.by_name[name].last:
                self._write(name, value)

    def _write(self, name: str, value: object) -> None:
        try:
            self.by_name[name].write(value)
        except (RuntimeError, TypeError, ValueError) as exc:
            # e.g. MAGMA on a CPU build, fp16 reductions on a CPU without fp16,
            # opt_einsum enabled without the package
            raise ValueError(
                f"flag {name!r} cannot be set to {value!r} with this torch and machine: {exc}"
            ) from exc

    def restore(self, snapshot: Mapping[str, object]) -> None:
        """Put every flag in ``snapshot`` back; all rows are tried before failing."""
        unknown = [n for n in snapshot if n not in self.by_name]
        if unknown:
            raise ValueError(self._unknown_message(unknown[0]))
        current = self.snapshot()
        errors: list[str] = []
        rows = [r for r in self.rows if r.name in snapshot]
        with _unfrozen(self._torch):
            for row in rows:
                if not row.last:
                    self._restore_row(row, snapshot[row.name], current, errors)
        for row in rows:
            if row.last:
                self._restore_row(row, snapshot[row.name], current, errors)
        if errors:
            raise RuntimeError("could not restore torch backend flags: " + "; ".join(errors))

    def _restore_row(
        self, row: Flag, want: object, current: Mapping[str, object], errors: list[str]
    ) -> None:
        if row.parent is None and current.get(row.name) == want:
            return
        try:
            row.write(self._precision_value(row, want) if row.parent else want)
        except Exception as exc:  # keep going: one bad row must not block the rest
            errors.append(f"{row.name}={want!r}: {type(exc).__name__}: {exc}")

    def _precision_value(self, row: Flag, want: object) -> object:
        """The string to write so that a precision row reads ``want`` again.

        The getters report *effective* values (a leaf set to "none" reads what
        it inherits), so a leaf whose wanted value equals its parent's is
        written as "none" to keep it inheriting, as torch's defaults do.
        """
        assert row.parent is not None
        parent_value = self.by_name[row.parent].read()
        return "none" if want == parent_value else want

    @staticmethod
    def diff(
        before: Mapping[str, object], after: Mapping[str, object]
    ) -> dict[str, tuple[object, object]]:
        """``{name: (before, after)}`` for every flag whose value differs."""
        names = list(before) + [n for n in after if n not in before]
        return {n: (before.get(n), after.get(n)) for n in names if before.get(n) != after.get(n)}


@functools.cache
def registry() -> FlagRegistry:
    """The registry for the running torch (built once, on first use)."""
    import torch
    import torch.backends.opt_einsum

    rows, absent = _catalogue(torch)
    return FlagRegistry(torch, rows, absent)


def flag_names() -> list[str]:
    """Every flag name that can be set with :func:`override_flags` in this torch."""
    return registry().names()


def snapshot_flags() -> dict[str, object]:
    """Every flag that exists in this torch, as plain values."""
    return registry().snapshot()


def restore_flags(snapshot: Mapping[str, object]) -> None:
    """Restore the flags captured by :func:`snapshot_flags`."""
    registry().restore(snapshot)


def diff_flags(
    before: Mapping[str, object], after: Mapping[str, object]
) -> dict[str, tuple[object, object]]:
    """``{name: (before, after)}`` for every flag that differs between two snapshots."""
    return FlagRegistry.diff(before, after)


def format_diff(diff: Mapping[str, tuple[object, object]]) -> str:
    """One ``name: before -> after`` line per changed flag."""
    return "\n".join(f"  {name}: {b!r} -> {a!r}" for name, (b, a) in diff.items())


@contextlib.contextmanager
def override_flags(mapping: Mapping[str, object]) -> Iterator[dict[str, object]]:
    """Set the given flags, and restore **every** flag on exit, also on exceptions.

    Names and values are validated before anything changes: an unknown name or
    an invalid value raises ``ValueError`` naming the flag and the allowed
    values.  The context value is the snapshot taken on entry.
    """
    reg = registry()
    normalised = reg.validate(mapping)
    before = reg.snapshot()
    try:
        reg.apply(normalised)
        yield before
    finally:
        reg.restore(before)


def torch_imported() -> bool:
    """Whether something in this process has imported torch already (never imports it)."""
    return "torch" in sys.modules
