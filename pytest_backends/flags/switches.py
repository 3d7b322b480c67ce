"""Rows for the switches beyond the backend flags: autograd and TorchScript knobs, module
conversion futures, serialization options, mode stacks, hooks, TunableOp, native AOT kernels
and the numerics of compiler configs.

Every row is probed feature by feature; switches that only exist on CUDA builds or in newer
releases are read only where they exist.  Rows whose change torch cannot undo carry an
``unrestorable`` hint that says what the user must do.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from pytest_backends.flags.row import (
    Invalid,
    check_bool,
    default_device_reader,
    missing_flag,
    non_negative_int,
    one_of,
    positive_int,
)
from pytest_backends.flags.switch_state import (
    GUARDS,
    INDUCTOR_NUMERICS,
    INTEROP_HINT,
    MODULE_HOOKS,
    Add,
    any_value,
    config_row,
    dict_keys_read,
    dict_keys_write,
    dual_level_write,
    get_attr,
    handles,
    hooks_plain,
    inference_mode_write,
    int_or_none,
    module_attr_read,
    module_attr_write,
    pair_row,
    pop_function_mode,
    pop_to,
    safe_globals_plain,
    safe_globals_reader,
    safe_globals_write,
    saved_hooks_read,
    saved_hooks_write,
    sharing_write,
    tunable_rows,
    unrestorable_write,
)


def switch_rows(torch: Any, add: Add, c_flag: Callable[..., None]) -> None:
    """Every switch beyond the backend flags that exists in ``torch``."""
    C = torch._C
    c_flag(
        "autograd.grad_layout_enforcement",
        "_is_grad_layout_enforcement_enabled",
        "_set_grad_layout_enforcement_enabled",
        "AccumulateGrad makes .grad strides match the parameter's "
        "(torch.autograd.enforce_grad_layout_policy)",
    )
    c_flag(
        "autograd.override_stale_capture_stream",
        "_override_stale_capture_stream",
        "_set_override_stale_capture_stream",
        "torch.autograd.graph.set_override_stale_capture_stream (process-global)",
    )
    c_flag(
        "autograd.warn_on_accumulate_grad_stream_mismatch",
        "_warn_on_accumulate_grad_stream_mismatch",
        "_set_warn_on_accumulate_grad_stream_mismatch",
        "torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch",
    )
    pair_row(
        add,
        "autograd.fallback_mode",
        C,
        "_get_autograd_fallback_mode",
        "_set_autograd_fallback_mode",
        "what autograd does for ops without an autograd kernel",
        check=one_of("nothing", "warn", "error"),
        allowed="'nothing', 'warn', 'error'",
    )
    pair_row(
        add,
        "sm_carveout",
        C,
        "_get_sm_carveout_experimental",
        "_set_sm_carveout_experimental",
        "SMs kept free by GEMMs and FA3 (torch._C._set_sm_carveout_experimental)",
        check=int_or_none,
        allowed="None or a non-negative int",
    )
    c_flag(
        "backcompat.broadcast_warn",
        "_get_backcompat_broadcast_warn",
        "_set_backcompat_broadcast_warn",
        "warn on broadcasts that changed meaning (torch.utils.backcompat)",
    )
    c_flag(
        "backcompat.keepdim_warn",
        "_get_backcompat_keepdim_warn",
        "_set_backcompat_keepdim_warn",
        "warn on reductions whose keepdim default changed (torch.utils.backcompat)",
    )
    c_flag("sdp.fa4", "_get_fa4_sdp_enabled", "_set_sdp_use_fa4", "allow the fa4 SDPA kernel")
    functorch = get_attr(C, "_functorch")
    pair_row(
        add,
        "functorch.vmap_fallback_enabled",
        functorch,
        "_is_vmap_fallback_enabled",
        "_set_vmap_fallback_enabled",
        "vmap runs ops without a batching rule through the slow fallback",
    )
    # torch.__future__
    future = get_attr(torch, "__future__")
    for what in ("overwrite", "swap"):
        pair_row(
            add,
            f"future.{what}_module_params_on_conversion",
            future,
            f"get_{what}_module_params_on_conversion",
            f"set_{what}_module_params_on_conversion",
            f"torch.__future__.set_{what}_module_params_on_conversion",
        )
    pair_row(
        add,
        "storage.always_warn_typed_storage_removal",
        get_attr(torch, "storage"),
        "_get_always_warn_typed_storage_removal",
        "_set_always_warn_typed_storage_removal",
        "TypedStorage deprecation warning on every use",
    )
    _jit_rows(torch, add, c_flag)
    _process_state_rows(torch, add)
    _stack_rows(torch, add)
    _hook_rows(torch, add)
    tunable_rows(torch, add, _cuda_ready(torch))
    _native_aot_rows(torch, add)
    unset = _unset_sentinel()
    if unset is None:
        return
    for attr in INDUCTOR_NUMERICS:
        config_row(
            add,
            f"inductor.{attr}",
            "torch._inductor.config",
            attr,
            unset,
            f"torch._inductor.config.{attr} (read only once inductor is imported)",
        )


def _unset_sentinel() -> object | None:
    try:
        from torch.utils._config_module import _UNSET_SENTINEL
    except ImportError:  # a torch without config modules
        return None
    return _UNSET_SENTINEL


def _emit_hooks(value: object) -> object:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return tuple(value)
    raise Invalid(f"expected a (module hook, function hook) pair, got {value!r}")


def _jit_rows(torch: Any, add: Add, c_flag: Callable[..., None]) -> None:
    C = torch._C
    c_flag(
        "jit.onednn_fusion",
        "_jit_llga_enabled",
        "_jit_set_llga_enabled",
        "TorchScript oneDNN Graph fuser (torch.jit.enable_onednn_fusion)",
    )
    c_flag(
        "jit.texpr_reductions",
        "_jit_texpr_reductions_enabled",
        "_jit_set_texpr_reductions_enabled",
        "TorchScript NNC fuses reductions",
    )
    c_flag(
        "jit.texpr_dynamic_shape",
        "_jit_texpr_dynamic_shape_enabled",
        "_jit_set_texpr_dynamic_shape_enabled",
        "TorchScript NNC dynamic shapes",
    )
    for name, getter, setter, check, allowed in (
        (
            "jit.num_profiled_runs",
            "_jit_get_num_profiled_runs",
            "_jit_set_num_profiled_runs",
            non_negative_int,
            "a non-negative int",
        ),
        (
            "jit.inline_everything_mode",
            "_jit_get_inline_everything_mode",
            "_jit_set_inline_everything_mode",
            check_bool,
            "True, False",
        ),
        (
            "jit.tracer_state_warn",
            "_jit_get_tracer_state_warn",
            "_jit_set_tracer_state_warn",
            check_bool,
            "True, False",
        ),
        (
            "jit.te_must_use_llvm_cpu",
            "_jit_get_te_must_use_llvm_cpu",
            "_jit_set_te_must_use_llvm_cpu",
            check_bool,
            "True, False",
        ),
        (
            "jit.te_generate_block_code",
            "_jit_get_te_generate_block_code",
            "_jit_set_te_generate_block_code",
            check_bool,
            "True, False",
        ),
        (
            "jit.te_cuda_pointwise_loop_levels",
            "_jit_get_te_cuda_pointwise_loop_levels",
            "_jit_set_te_cuda_pointwise_loop_levels",
            any_value,
            "an int",
        ),
        (
            "jit.te_cuda_pointwise_block_count",
            "_jit_get_te_cuda_pointwise_block_count",
            "_jit_set_te_cuda_pointwise_block_count",
            any_value,
            "an int",
        ),
        (
            "jit.te_cuda_pointwise_block_size",
            "_jit_get_te_cuda_pointwise_block_size",
            "_jit_set_te_cuda_pointwise_block_size",
            any_value,
            "an int",
        ),
        (
            "jit.emit_hooks",
            "_jit_get_emit_hooks",
            "_jit_set_emit_hooks",
            _emit_hooks,
            "the (module, function) hook pair",
        ),
        (
            "jit.logging_option",
            "_jit_get_logging_option",
            "_jit_set_logging_option",
            any_value,
            "a PYTORCH_JIT_LOG_LEVEL string",
        ),
    ):
        extra = {"plain": list} if name == "jit.emit_hooks" else {}
        pair_row(
            add,
            name,
            C,
            getter,
            setter,
            f"TorchScript: torch._C.{setter}",
            check=check,
            allowed=allowed,
            **extra,
        )


def _process_state_rows(torch: Any, add: Add) -> None:
    C = torch._C
    mp = sys.modules.get("torch.multiprocessing")
    add(
        "multiprocessing.sharing_strategy",
        (mp is not None and hasattr(mp, "get_sharing_strategy")) or "not in this torch",
        get_attr(mp, "get_sharing_strategy") or missing_flag,
        functools.partial(sharing_write, mp),
        one_of("file_descriptor", "file_system"),
        "'file_descriptor', 'file_system'",
        "torch.multiprocessing.set_sharing_strategy",
    )
    config: Any = None
    with contextlib.suppress(Exception):
        config = importlib.import_module("torch.utils.serialization.config")
    options: dict[str, Any] = getattr(config, "_config", {}) if config is not None else {}
    unset = _unset_sentinel()
    for key in sorted(k for k in options if not k.startswith("_")):
        if unset is not None:
            config_row(
                add,
                f"serialization.{key}",
                "torch.utils.serialization.config",
                key,
                unset,
                f"torch.utils.serialization.config.{key}",
            )
    if config is None:
        add(
            "serialization.load.mmap",
            "needs torch.utils.serialization.config",
            missing_flag,
            missing_flag,
            any_value,
            "",
            "",
        )
    serialization = get_attr(torch, "serialization")
    add(
        "serialization.safe_globals",
        (serialization is not None and hasattr(serialization, "add_safe_globals"))
        or "not in this torch",
        safe_globals_reader(serialization),
        functools.partial(safe_globals_write, serialization),
        any_value,
        "a list of allowed globals",
        "torch.serialization.add_safe_globals (weights_only loading allow-list)",
        plain=safe_globals_plain,
    )
    add(
        "num_interop_threads",
        hasattr(torch, "get_num_interop_threads") or "not in this torch",
        get_attr(torch, "get_num_interop_threads") or missing_flag,
        functools.partial(unrestorable_write, INTEROP_HINT),
        positive_int,
        "a positive int",
        "inter-op CPU threads (set once per process: cannot be restored)",
        unrestorable=INTEROP_HINT,
    )
    add(
        "autograd.inference_mode",
        (hasattr(torch, "is_inference_mode_enabled") and hasattr(C, "_InferenceMode"))
        or "not in this torch",
        get_attr(torch, "is_inference_mode_enabled") or missing_flag,
        functools.partial(inference_mode_write, torch, GUARDS),
        check_bool,
        "True, False",
        "an inference_mode context entered and not exited",
        order=1,
    )
    forward_ad: Any = None
    with contextlib.suppress(Exception):
        forward_ad = importlib.import_module("torch.autograd.forward_ad")
    add(
        "autograd.forward_ad.dual_level",
        (forward_ad is not None and hasattr(forward_ad, "_current_level")) or "not in this torch",
        functools.partial(getattr, forward_ad, "_current_level"),
        functools.partial(dual_level_write, forward_ad),
        any_value,
        "-1 (no level) or an open level",
        "forward-AD dual level entered and not exited",
    )
    checkpoint = sys.modules.get("torch.utils.checkpoint")
    for attr, doc in (
        ("_enable_checkpoint_early_stop", "torch.utils.checkpoint.set_checkpoint_early_stop"),
        ("_checkpoint_debug_enabled", "torch.utils.checkpoint.set_checkpoint_debug_enabled"),
    ):
        add(
            "checkpoint.early_stop" if "early" in attr else "checkpoint.debug",
            (checkpoint is None or hasattr(checkpoint, attr)) or "not in this torch",
            module_attr_read("torch.utils.checkpoint", attr),
            functools.partial(module_attr_write, "torch.utils.checkpoint", attr),
            any_value,
            "None, True, False",
            doc,
        )
    profiler = get_attr(C, "_autograd")
    add(
        "profiler.enabled",
        (profiler is not None and hasattr(profiler, "_profiler_enabled")) or "not in this torch",
        get_attr(profiler, "_profiler_enabled") or missing_flag,
        functools.partial(_profiler_write, profiler),
        check_bool,
        "False (a profiler can only be stopped)",
        "an autograd profiler started and not stopped",
    )


def _profiler_write(profiler: Any, value: bool) -> None:
    if value:
        raise RuntimeError("a profiler can only be stopped, not started again")
    if profiler._profiler_enabled():
        profiler._disable_profiler()


#: The row of the torch-function mode stack, and the row of the recorded default device
#: (the stack's value keeps its modes, for the report: see .mode_stack).
STACK_ROW = "modes.torch_function_stack"
DEVICE_ROW = "default_device"

#: One mode of the stack: ``(id, mode, recorded by set_default_device)``; the id first,
#: so that comparing two stacks never calls a mode's own ``__eq__``.
ModeEntry = tuple[int, object, bool]


class ModeStack(int):
    """The stack's depth (what is compared, written back and shown), with its modes."""

    modes: tuple[ModeEntry, ...]

    def __new__(cls, entries: tuple[ModeEntry, ...]) -> ModeStack:
        stack = super().__new__(cls, len(entries))
        stack.modes = entries
        return stack

    def __reduce__(self) -> tuple[type[int], tuple[int]]:
        return int, (int(self),)  # copied or pickled, it is the depth alone


def function_stack_reader(
    torch: Any,
) -> tuple[Callable[[], object], Callable[[Any], object]] | None:
    """The row's raw reader (the modes, ``()`` when none) and plain form; None without
    a way to read the modes in this torch."""
    C = torch._C
    length = getattr(C, "_len_torch_function_stack", None)
    at = getattr(C, "_get_function_stack_at", None)
    if not callable(length) or not callable(at):
        return None
    recorded, _ = default_device_reader(torch)  # the context set_default_device recorded

    def read() -> object:
        depth = length()
        if not depth:
            return ()
        record = recorded()
        return tuple((id(mode), mode, mode is record) for mode in map(at, range(depth)))

    return read, _stack_plain


def _stack_plain(raw: object) -> object:
    """The plain value: the depth, as a :class:`ModeStack` where the modes were read."""
    return ModeStack(raw) if isinstance(raw, tuple) else raw


def _stack_rows(torch: Any, add: Add) -> None:
    C = torch._C
    for name, length, pop, doc in (
        (
            "modes.torch_function_stack",
            "_len_torch_function_stack",
            "_pop_torch_function_stack",
            "TorchFunctionModes entered and not exited (set_default_device installs one)",
        ),
        (
            "modes.dispatch_stack",
            "_len_torch_dispatch_stack",
            "_pop_torch_dispatch_stack",
            "TorchDispatchModes entered and not exited",
        ),
    ):
        ok = callable(get_attr(C, length)) and callable(get_attr(C, pop))
        # the function stack keeps its modes, for the report (see .mode_stack)
        modes = function_stack_reader(torch) if name == STACK_ROW else None
        read, plain = modes or (get_attr(C, length) or missing_flag, any_value)
        add(
            name,
            ok or "not in this torch",
            read,
            functools.partial(
                pop_to,
                get_attr(C, length),
                functools.partial(get_attr(C, pop), None)
                if name == "modes.dispatch_stack"
                else functools.partial(pop_function_mode, torch),
            ),
            non_negative_int,
            "a non-negative int (modes can only be popped)",
            doc,
            plain=plain,
            order=60,
        )
    add(
        "modes.torch_function_state",
        (
            callable(get_attr(C, "_get_torch_function_state"))
            and callable(get_attr(C, "_set_torch_function_state"))
        )
        or "not in this torch",
        get_attr(C, "_get_torch_function_state") or missing_flag,
        functools.partial(_set_function_state, C),
        any_value,
        "a _TorchFunctionState",
        "torch function handling disabled (DisableTorchFunction entered and not exited)",
        plain=lambda v: str(getattr(v, "name", v)),
    )


def _set_function_state(C: Any, value: object) -> None:
    states = C._TorchFunctionState
    C._set_torch_function_state(states.__members__[value] if isinstance(value, str) else value)


def _hook_rows(torch: Any, add: Add) -> None:
    autograd = get_attr(torch._C, "_autograd")
    ok = callable(get_attr(autograd, "_top_saved_tensors_default_hooks")) and callable(
        get_attr(autograd, "_pop_saved_tensors_default_hooks")
    )
    add(
        "autograd.saved_tensors_hooks",
        ok or "not in this torch",
        saved_hooks_read(autograd, ok),
        functools.partial(saved_hooks_write, autograd),
        any_value,
        "None (contexts can only be exited)",
        "a saved_tensors_hooks context entered and not exited",
        plain=hooks_plain,
    )
    module = sys.modules.get("torch.nn.modules.module")
    for attr in MODULE_HOOKS:
        mapping: Any = getattr(module, attr, None)
        extra = (
            ("_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")
            if attr == "_global_forward_hooks"
            else ("_global_is_full_backward_hook",)
            if attr == "_global_backward_hooks"
            else ()
        )
        add(
            f"nn.module{attr.removeprefix('_global')}",
            isinstance(mapping, dict) or "not in this torch",
            functools.partial(dict_keys_read, mapping),
            functools.partial(dict_keys_write, mapping, extra),
            any_value,
            "handle ids (hooks can only be removed)",
            f"global nn.Module hooks (torch.nn.modules.module.{attr})",
            plain=handles,
        )


def _cuda_ready(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _native_aot_rows(torch: Any, add: Add) -> None:
    """Native AOT kernels (torch >= 2.15): the switch and its unconditional mask."""
    native = None
    registry = None
    C = torch._C
    if callable(get_attr(C, "_get_native_aot_enabled")):
        with contextlib.suppress(Exception):
            native = importlib.import_module("torch._native")
            registry = importlib.import_module("torch._native.registry")
    add(
        "native_aot.enabled",
        (native is not None and hasattr(native, "set_aot_enabled")) or "needs torch >= 2.15",
        get_attr(C, "_get_native_aot_enabled") or missing_flag,
        get_attr(native, "set_aot_enabled") or missing_flag,
        check_bool,
        "True, False",
        "torch._native.set_aot_enabled: embedded AOT kernels instead of stock aten",
        # after the python_native rows: disabling a DSL also switches AOT off on 2.15
        order=55,
    )
    add(
        "native_aot.unconditional_masked",
        (registry is not None and hasattr(registry, "_set_mask_unconditional"))
        or "needs torch >= 2.15",
        get_attr(C, "_get_native_aot_unconditional_masked") or missing_flag,
        get_attr(registry, "_set_mask_unconditional") or missing_flag,
        check_bool,
        "True, False",
        "native AOT kernels masked unconditionally (restored through the registry, "
        "which rebuilds every router)",
        order=56,
    )
