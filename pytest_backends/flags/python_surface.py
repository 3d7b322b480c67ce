"""The switch surface beyond ``torch._C``'s getter/setter pairs, enumerated from torch itself.

Discovery (:func:`pytest_backends.flags.surface.discover`) adds these names on the
running torch, so that every catalogue row manages at least one discovered name and
removing a row leaves that name unknown:

* the autocast switches of every device type torch's autocast supports
  (``torch.set_autocast_enabled[xla]``), from ``torch._C._autocast_supported_devices``;
* the keyword options of ``torch``'s Python setters (``torch.set_printoptions(threshold=)``);
* the switch functions of the modules that hold process state (TunableOp, checkpointing,
  global module hooks, serialization, multiprocessing, autograd graph hooks, forward AD),
  the mode stacks and hook stacks of ``torch._C`` (``_len_``/``_pop_``/``_push_``/``_top_``),
  and ``torch``'s ``is_*_enabled`` and ``autocast_*`` functions;
* the options of the config modules (``torch.utils.serialization.config``, and
  ``torch._inductor.config`` once something imported it), through their ``_config`` table;
* the objects one level inside ``torch.backends`` (``torch.backends.cudnn.conv.fp32_precision``,
  ``torch.backends.python_native.triton.enabled``), the attributes a module wrapper keeps in
  the module it wraps, and the functions of ``torch.backends`` and its modules.

The offline name lists hold ``torch._C`` names only; these names are checked on each
installed torch.
"""

# ruff: noqa: E501  (the name table keeps one torch name per line)

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import sys
import types
from typing import Any

from pytest_backends.flags.switch_state import INDUCTOR_NUMERICS

__all__ = ["PY_MANAGED", "python_surface"]

#: Modules whose functions change process state, and the function names counted as switches.
_MODULES: tuple[tuple[str, str], ...] = (
    (
        "torch.cuda.tunable",
        r"^(set_|get_|enable|is_enabled|tuning_|record_untuned_|wildcard_fallback_)",
    ),
    ("torch.utils.checkpoint", r"^set_checkpoint_"),
    ("torch.nn.modules.module", r"^register_module_"),
    ("torch.serialization", r"^(set_|get_default|add_safe_globals|clear_safe_globals)"),
    ("torch.multiprocessing", r"^(set_|get_)sharing_strategy"),
    ("torch.autograd.graph", r"^set_"),
    ("torch.autograd.forward_ad", r"^(enter|exit)_dual_level"),
    ("torch.storage", r"^_(set|get)_always_warn"),
)
_STACKS = re.compile(r"^_(len|pop|push|top)_")
_TORCH = re.compile(r"^(is_\w+_enabled|autocast_\w+)$")
_BACKEND_FUNCTIONS = re.compile(r"^(set_|get_|enable|disable|flags_frozen|preferred_)")

#: Discovered Python names a catalogue row manages, with the row's name.
PY_MANAGED: dict[str, str] = {
    "torch.set_printoptions(precision=)": "printoptions.precision",
    "torch.set_printoptions(threshold=)": "printoptions.threshold",
    "torch.set_printoptions(edgeitems=)": "printoptions.edgeitems",
    "torch.set_printoptions(linewidth=)": "printoptions.linewidth",
    "torch.set_printoptions(sci_mode=)": "printoptions.sci_mode",
    "torch.cuda.tunable.enable": "tunableop.enabled",
    "torch.cuda.tunable.is_enabled": "tunableop.enabled",
    "torch.cuda.tunable.tuning_enable": "tunableop.tuning",
    "torch.cuda.tunable.tuning_is_enabled": "tunableop.tuning",
    "torch.cuda.tunable.record_untuned_enable": "tunableop.record_untuned",
    "torch.cuda.tunable.record_untuned_is_enabled": "tunableop.record_untuned",
    "torch.cuda.tunable.set_max_tuning_duration": "tunableop.max_tuning_duration",
    "torch.cuda.tunable.get_max_tuning_duration": "tunableop.max_tuning_duration",
    "torch.cuda.tunable.set_max_tuning_iterations": "tunableop.max_tuning_iterations",
    "torch.cuda.tunable.get_max_tuning_iterations": "tunableop.max_tuning_iterations",
    "torch.cuda.tunable.set_filename": "tunableop.filename",
    "torch.cuda.tunable.get_filename": "tunableop.filename",
    "torch.cuda.tunable.get_results": "tunableop.results",
    "torch.cuda.tunable.set_rotating_buffer_size": "tunableop.rotating_buffer_size",
    "torch.cuda.tunable.get_rotating_buffer_size": "tunableop.rotating_buffer_size",
    "torch.cuda.tunable.set_cublaslt_requested_algo_count": "tunableop.cublaslt_requested_algo_count",
    "torch.cuda.tunable.get_cublaslt_requested_algo_count": "tunableop.cublaslt_requested_algo_count",
    "torch.cuda.tunable.wildcard_fallback_enable": "tunableop.wildcard_fallback",
    "torch.cuda.tunable.wildcard_fallback_is_enabled": "tunableop.wildcard_fallback",
    "torch.utils.checkpoint.set_checkpoint_early_stop": "checkpoint.early_stop",
    "torch.utils.checkpoint.set_checkpoint_debug_enabled": "checkpoint.debug",
    "torch.nn.modules.module.register_module_buffer_registration_hook": "nn.module_buffer_registration_hooks",
    "torch.nn.modules.module.register_module_module_registration_hook": "nn.module_module_registration_hooks",
    "torch.nn.modules.module.register_module_parameter_registration_hook": "nn.module_parameter_registration_hooks",
    "torch.nn.modules.module.register_module_backward_hook": "nn.module_backward_hooks",
    "torch.nn.modules.module.register_module_full_backward_hook": "nn.module_backward_hooks",
    "torch.nn.modules.module.register_module_full_backward_pre_hook": "nn.module_backward_pre_hooks",
    "torch.nn.modules.module.register_module_forward_hook": "nn.module_forward_hooks",
    "torch.nn.modules.module.register_module_forward_pre_hook": "nn.module_forward_pre_hooks",
    "torch.serialization.set_default_load_endianness": "serialization.load.endianness",
    "torch.serialization.get_default_load_endianness": "serialization.load.endianness",
    "torch.serialization.set_default_mmap_options": "serialization.load.mmap_flags",
    "torch.serialization.set_crc32_options": "serialization.save.compute_crc32",
    "torch.serialization.add_safe_globals": "serialization.safe_globals",
    "torch.serialization.clear_safe_globals": "serialization.safe_globals",
    "torch.multiprocessing.set_sharing_strategy": "multiprocessing.sharing_strategy",
    "torch.multiprocessing.get_sharing_strategy": "multiprocessing.sharing_strategy",
    "torch.autograd.graph.set_override_stale_capture_stream": "autograd.override_stale_capture_stream",
    "torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch": "autograd.warn_on_accumulate_grad_stream_mismatch",
    "torch.autograd.graph.set_multithreading_enabled": "autograd.multithreading_enabled",
    "torch.autograd.forward_ad.enter_dual_level": "autograd.forward_ad.dual_level",
    "torch.autograd.forward_ad.exit_dual_level": "autograd.forward_ad.dual_level",
    "torch.storage._set_always_warn_typed_storage_removal": "storage.always_warn_typed_storage_removal",
    "torch.storage._get_always_warn_typed_storage_removal": "storage.always_warn_typed_storage_removal",
    "_len_torch_dispatch_stack": "modes.dispatch_stack",
    "_pop_torch_dispatch_stack": "modes.dispatch_stack",
    "_len_torch_function_stack": "modes.torch_function_stack",
    "_pop_torch_function_stack": "modes.torch_function_stack",
    "_push_on_torch_function_stack": "modes.torch_function_stack",
    "_push_on_torch_dispatch_stack": "modes.dispatch_stack",
    "_top_saved_tensors_default_hooks": "autograd.saved_tensors_hooks",
    "_pop_saved_tensors_default_hooks": "autograd.saved_tensors_hooks",
    "_push_saved_tensors_default_hooks": "autograd.saved_tensors_hooks",
    "torch.is_inference_mode_enabled": "autograd.inference_mode",
    "torch.is_anomaly_enabled": "autograd.anomaly_enabled",
    "torch.is_anomaly_check_nan_enabled": "autograd.anomaly_check_nan",
    "torch.is_grad_enabled": "autograd.grad_enabled",
    "torch.is_warn_always_enabled": "warn_always",
    "torch.is_autocast_cache_enabled": "autocast.cache_enabled",
    "torch.is_deterministic_algorithms_warn_only_enabled": "deterministic_algorithms.warn_only",
    "torch.autocast_increment_nesting": "autocast.nesting",
    "torch.autocast_decrement_nesting": "autocast.nesting",
    "torch.backends.disable_global_flags": "flags_frozen",
    "torch.backends.flags_frozen": "flags_frozen",
    "torch.backends.mha.get_fastpath_enabled": "mha.fastpath_enabled",
    "torch.backends.mha.set_fastpath_enabled": "mha.fastpath_enabled",
    "torch.backends.cuda.preferred_blas_library": "cuda.preferred_blas_library",
    "torch.backends.cuda.preferred_linalg_library": "cuda.preferred_linalg_library",
    "torch.backends.cuda.preferred_rocm_fa_library": "cuda.preferred_rocm_fa_library",
    "torch.backends.cuda.cufft_plan_cache": "cuda.cufft_plan_cache[0].max_size",
    "torch.backends.cuda.enable_cudnn_sdp": "sdp.cudnn",
    "torch.backends.cuda.enable_flash_sdp": "sdp.flash",
    "torch.backends.cuda.enable_math_sdp": "sdp.math",
    "torch.backends.cuda.enable_mem_efficient_sdp": "sdp.mem_efficient",
    "torch.backends.cuda.enable_fa3_sdp": "sdp.fa3",
    "torch.backends.cuda.enable_fa4_sdp": "sdp.fa4",
    "torch.backends.cuda.enable_overrideable_sdp": "sdp.overrideable",
    "torch.is_autocast_cpu_enabled": "autocast.cpu.enabled",
    "torch.is_autocast_enabled": "autocast.cuda.enabled",
    "torch.is_autocast_ipu_enabled": "autocast.ipu.enabled",
    "torch.is_autocast_xla_enabled": "autocast.xla.enabled",
    "torch.serialization.get_default_mmap_options": "serialization.load.mmap_flags",
    "torch.backends.python_native.disable_operations": "python_native.disabled_operations",
    "torch.backends.python_native.enable_operations": "python_native.disabled_operations",
    "torch.backends.python_native.disable_dispatch_keys": "python_native.disabled_dispatch_keys",
    "torch.backends.python_native.enable_dispatch_keys": "python_native.disabled_dispatch_keys",
}
for _option in INDUCTOR_NUMERICS:
    PY_MANAGED[f"torch._inductor.config.{_option}"] = f"inductor.{_option}"
for _device in ("cpu", "cuda", "mtia", "maia", "xpu", "ipu", "hpu", "xla", "privateuseone", "mps"):
    PY_MANAGED[f"torch.set_autocast_enabled[{_device}]"] = f"autocast.{_device}.enabled"
    PY_MANAGED[f"torch.set_autocast_dtype[{_device}]"] = f"autocast.{_device}.dtype"


def _public(module: object, pattern: re.Pattern[str]) -> list[str]:
    names = []
    for name in dir(module):
        if not pattern.match(name):
            continue
        with contextlib.suppress(Exception):
            if callable(getattr(module, name)):
                names.append(name)
    return names


def _options(module: object, function: str) -> list[str]:
    """The keyword options of a Python setter (``set_printoptions(threshold=)``)."""
    try:
        parameters = inspect.signature(getattr(module, function)).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: one switch
        return []
    keywords = [p.name for p in parameters if p.default is not inspect.Parameter.empty]
    return keywords if len(keywords) > 1 else []


def _config_names(module_name: str, imported_only: bool) -> list[str]:
    module = sys.modules.get(module_name)
    if module is None and not imported_only:
        with contextlib.suppress(Exception):
            module = importlib.import_module(module_name)
    table = getattr(module, "_config", None)
    if not isinstance(table, dict):
        return []
    return [f"{module_name}.{key}" for key in table if not key.startswith("_")]


def _attributes(module: object) -> set[str]:
    """Every attribute of a ``torch.backends`` module, its wrapper class and the module it wraps.

    A module's ``dir`` lists its own dictionary only; the wrappers keep switches on their
    class (``CudnnModule.conv``) and in the module they wrap.
    """
    names = set(dir(module)) | set(vars(type(module)))
    wrapped = getattr(module, "m", None)
    if isinstance(wrapped, types.ModuleType):
        names |= set(vars(wrapped))
    return {n for n in names if not n.startswith("_")}


def _functions(module: object, prefix: str) -> set[str]:
    names = set()
    for attr in _attributes(module):
        if _BACKEND_FUNCTIONS.match(attr):
            with contextlib.suppress(Exception):
                if callable(getattr(module, attr)) and not isinstance(getattr(module, attr), type):
                    names.add(f"{prefix}.{attr}")
    return names


def _backends_names(torch: Any) -> set[str]:
    backends = torch.backends
    names = _functions(backends, "torch.backends")
    for mod_name, module in sorted(vars(backends).items()):
        prefix = f"torch.backends.{mod_name}"
        if mod_name.startswith("_") or getattr(module, "__name__", None) != prefix:
            continue  # not a backend module (a wrapper's own reference to its module)
        names |= _functions(module, prefix)
        wrapped = getattr(module, "m", None)
        if isinstance(wrapped, types.ModuleType):  # a wrapper keeps its state in the module
            for attr, value in vars(wrapped).items():
                public = not attr.startswith("_") and not callable(value)
                if public and not isinstance(value, types.ModuleType):
                    names.add(f"{prefix}.{attr}")
        for attr in _attributes(module):
            with contextlib.suppress(Exception):
                value = getattr(module, attr)
                if callable(value) or not type(value).__module__.startswith("torch.backends"):
                    continue
                # an object or submodule one level in: its precision or on/off switch
                for switch in ("fp32_precision", "enabled"):
                    if hasattr(value, switch) and not callable(getattr(value, switch)):
                        names.add(f"{prefix}.{attr}.{switch}")
    return names


def python_surface(torch: Any) -> set[str]:
    """The Python-level switch names of the running ``torch`` (see the module docstring)."""
    names: set[str] = set()
    devices = getattr(torch._C, "_autocast_supported_devices", None)
    if callable(devices):
        for device in devices():
            names.add(f"torch.set_autocast_enabled[{device}]")
            names.add(f"torch.set_autocast_dtype[{device}]")
    for function in (n for n in dir(torch) if n.startswith("set_")):
        names.update(f"torch.{function}({o}=)" for o in _options(torch, function))
    names.update(f"torch.{n}" for n in _public(torch, _TORCH))
    for module_name, pattern in _MODULES:
        module = None
        with contextlib.suppress(Exception):
            module = importlib.import_module(module_name)
        if module is not None:
            names.update(f"{module_name}.{n}" for n in _public(module, re.compile(pattern)))
    for module in [torch._C, getattr(torch._C, "_autograd", None)]:
        if module is not None:
            names.update(_public(module, _STACKS))
    names.update(_config_names("torch.utils.serialization.config", imported_only=False))
    names.update(_config_names("torch._inductor.config", imported_only=True))
    names.update(_backends_names(torch))
    return names
