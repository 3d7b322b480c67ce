"""Groups of rows with helpers of their own: the frozen-flags switch, denormals, autocast,
process state, Python-native DSL overrides and devices."""

from __future__ import annotations

import contextlib
import functools
import struct
from collections.abc import Callable
from typing import Any

from pytest_backends.flags.row import (
    Check,
    Invalid,
    check_bool,
    choice_int,
    device_available,
    dtype_name,
    dtype_of,
    enum_name,
    missing_flag,
    non_negative_int,
    one_of,
    positive_int,
)

FROZEN_ATTR = "__allow_nonbracketed_mutation_flag"


def backends_globals(torch: Any) -> dict[str, Any]:
    """The real module globals of ``torch.backends``."""
    # torch.backends may be a module wrapper; its functions see the real globals
    return getattr(torch.backends.flags_frozen, "__globals__", {})


def set_frozen(torch: Any, value: bool) -> None:
    """Freeze or unfreeze torch's global backend flags."""
    if value:
        torch.backends.disable_global_flags()
    else:
        backends_globals(torch)[FROZEN_ATTR] = True


# The smallest subnormal double; FTZ/DAZ (set_flush_denormal) turns a product
# with it into zero.  Module globals, so that nothing is folded at compile time.
_SUBNORMAL = struct.unpack("<d", struct.pack("<Q", 1))[0]
_ONE = 1.0


def read_flush_denormal() -> object:
    """Whether the CPU flushes subnormal floats to zero (read by computing one)."""
    return _SUBNORMAL * _ONE == 0.0


def flush_denormal_readable(torch: Any) -> bool:
    """Whether set_flush_denormal works here and its state shows in float arithmetic."""
    setter = getattr(torch, "set_flush_denormal", None)
    if setter is None:
        return False
    before = bool(read_flush_denormal())
    try:
        supported = bool(setter(True))
        readable = supported and read_flush_denormal() is True
    finally:
        setter(before)
    return readable and read_flush_denormal() is before


_AUTOCAST_DTYPES = ("float16", "bfloat16")
# Every device type torch's autocast knows; each is read only where torch accepts it.
_OTHER_AUTOCAST_DEVICES = ("xpu", "mps", "xla", "ipu", "hpu", "mtia", "maia", "privateuseone")


def _autocast_readable(torch: Any, device: str) -> bool:
    try:
        torch.is_autocast_enabled(device)
        torch.get_autocast_dtype(device)
    except Exception:  # a device type this torch does not know
        return False
    return True


def autocast_rows(torch: Any, add: Callable[..., None]) -> None:
    """Autocast state per device type (enabled, dtype) and the cast cache switch.

    torch >= 2.4 takes a device type; older releases have per-device functions
    for the CPU and CUDA only.
    """

    def check_dtype(value: object) -> object:
        name = dtype_name(value) if isinstance(value, torch.dtype) else value
        if name in _AUTOCAST_DTYPES:
            return name
        raise Invalid(f"expected one of {', '.join(map(repr, _AUTOCAST_DTYPES))}, got {value!r}")

    def dtype_writer(setter: Callable[..., object], *device: str) -> Callable[[Any], object]:
        return _clearing(torch, lambda v: setter(*device, dtype_of(torch, v)))

    try:
        torch.is_autocast_enabled("cpu")
        by_device = True
    except TypeError:
        by_device = False
    devices = ["cpu", "cuda"]
    if by_device:
        devices += [d for d in _OTHER_AUTOCAST_DEVICES if _autocast_readable(torch, d)]
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
                add(
                    f"{name}.enabled",
                    "not in this torch",
                    missing_flag,
                    missing_flag,
                    check_bool,
                    "",
                    "",
                )
                continue
            read_on, write_on, read_dtype = (getattr(torch, n) for n in names[:3])
            write_dtype = dtype_writer(getattr(torch, names[3]))
        add(
            f"{name}.enabled",
            exists,
            read_on,
            _clearing(torch, write_on),
            check_bool,
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
            plain=dtype_name,
        )
    add(
        "autocast.cache_enabled",
        (
            hasattr(torch, "is_autocast_cache_enabled")
            and hasattr(torch, "set_autocast_cache_enabled")
        )
        or "not in this torch",
        getattr(torch, "is_autocast_cache_enabled", missing_flag),
        _clearing(torch, getattr(torch, "set_autocast_cache_enabled", missing_flag)),
        check_bool,
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
        non_negative_int,
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
            return positive_int(value)
        else:
            return non_negative_int(value)
        raise Invalid(f"expected {dict((o, a) for o, a, _ in _PRINT_OPTIONS)[option]}")

    return check


def _string_set_check(value: object) -> object:
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return sorted(value)
    raise Invalid(f"expected a list of names, got {value!r}")


def process_rows(torch: Any, add: Callable[..., None], c_flag: Callable[..., None]) -> None:
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
            functools.partial(_read_by_swap, getattr(C, swap, missing_flag)),
            getattr(C, swap, missing_flag),
            check_bool,
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
        getattr(C, "_jit_can_fuse_on_gpu", missing_flag),
        getattr(C, "_jit_override_can_fuse_on_gpu", missing_flag),
        check_bool,
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
        getattr(C, "_get_rocm_fa_preferred_backend", missing_flag),
        getattr(torch.backends.cuda, "preferred_rocm_fa_library", missing_flag),
        one_of("default", "aotriton", "ck"),
        "'default', 'aotriton', 'ck'",
        "Flash Attention library on ROCm",
        plain=enum_name,
    )
    add(
        "cuda.matmul.prefer_cublaslt_grouped_gemm",
        (
            _has_attr(C, "_get_cublaslt_prefer_grouped_gemm")
            and _has_attr(C, "_set_cublaslt_prefer_grouped_gemm")
        )
        or "needs torch >= 2.14",
        getattr(C, "_get_cublaslt_prefer_grouped_gemm", missing_flag),
        getattr(C, "_set_cublaslt_prefer_grouped_gemm", missing_flag),
        check_bool,
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
    reason = "needs torch.backends.python_native (torch >= 2.12)"
    for dsl in sorted(set(_PYTHON_NATIVE_DSLS) | set(dsls)):
        exists: bool | str = (state is not None and dsl in dsls) or (
            "not in this torch" if state is not None else reason
        )
        add(
            f"python_native.{dsl}.enabled",
            exists,
            functools.partial(_not_in, state, "_dsl_names", dsl),
            functools.partial(_native_dsl_write, native, dsl),
            check_bool,
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


def device_rows(torch: Any, add: Callable[..., None]) -> None:
    """State that can only be read with a CUDA device: probed only where one exists."""
    cuda = getattr(torch, "cuda", None)
    available = device_available(torch, "cuda")
    need = "needs a CUDA device (probed only where one exists)"
    C = torch._C
    add(
        "cuda.sync_debug_mode",
        (available and hasattr(cuda, "get_sync_debug_mode")) or need,
        getattr(cuda, "get_sync_debug_mode", missing_flag),
        getattr(cuda, "set_sync_debug_mode", missing_flag),
        choice_int(0, 1, 2),
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
            exists = "needs torch >= 2.13"
        add(
            name,
            exists,
            getattr(C, getter, missing_flag),
            getattr(C, setter, missing_flag),
            non_negative_int,
            "a non-negative int (bytes)",
            f"cuBLAS{'Lt' if 'Lt' in getter else ''} workspace size of the current device",
        )
