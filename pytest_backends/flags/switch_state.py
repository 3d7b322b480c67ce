"""Readers and writers of the switch rows (:mod:`.switches`): contexts that can only be
exited, hooks that can only be removed, config options read through their override,
TunableOp's rows (only with a CUDA or ROCm device)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from pytest_backends.flags.row import (
    Invalid,
    check_bool,
    missing_flag,
    non_negative_int,
)

Add = Callable[..., None]


def get_attr(obj: object, name: str) -> Any:
    """``getattr(obj, name, None)``, or None where the attribute access raises."""
    try:
        return getattr(obj, name, None)
    except Exception:  # a module wrapper with a strict __getattr__
        return None


def pair_row(
    add: Add, name: str, owner: object, getter: str, setter: str, doc: str, **kw: Any
) -> None:
    """A row for a getter/setter pair of ``owner`` (a bool unless ``check`` says otherwise)."""
    read, write = get_attr(owner, getter), get_attr(owner, setter)
    absent: str = kw.pop("absent", "not in this torch")  # never a keyword of the row
    exists: bool | str = (callable(read) and callable(write)) or absent
    kw.setdefault("check", check_bool)
    kw.setdefault("allowed", "True, False")
    check, allowed = kw.pop("check"), kw.pop("allowed")
    add(name, exists, read or missing_flag, write or missing_flag, check, allowed, doc, **kw)


def int_or_none(value: object) -> object:
    """Check None or a non-negative int."""
    if value is None:
        return None
    return non_negative_int(value)


def str_or_none(value: object) -> object:
    """Check None or a string."""
    if value is None or isinstance(value, str):
        return value
    raise Invalid(f"expected None or a string, got {value!r}")


def inference_mode_write(torch: Any, keep: list[object], value: bool) -> None:
    """Switch the thread's inference mode (no setter exists: a kept guard does it)."""
    # torch has no setter: an InferenceMode guard (kept alive for the process)
    # switches the thread's inference mode and its dispatch keys back.
    if bool(torch.is_inference_mode_enabled()) != value:
        keep.append(torch._C._InferenceMode(value))


GUARDS: list[object] = []


def pop_to(length: Callable[[], int], pop: Callable[[], object], value: int) -> None:
    """Pop a mode stack down to ``value`` entries; a stack cannot be grown back."""
    while length() > value:
        pop()
    if length() != value:
        raise RuntimeError(f"a mode stack can only be shortened (it has {length()} modes)")


def pop_function_mode(torch: Any) -> object:
    """Pop the top TorchFunctionMode; one that is torch's default-device context is
    dropped the way ``set_default_device(None)`` drops it.

    ``set_default_device`` keeps the context it installed (and the device it
    replaced) besides the stack: popped alone, the context would stay recorded
    and be exited again by the next ``set_default_device`` call.
    """
    mode = torch._C._pop_torch_function_stack()
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if holder is not None and holder.__dict__.get("device_context") is mode:
        holder.device_context = None
        device: Any = sys.modules.get("torch.utils._device")
        if device is not None and hasattr(mode, "old_device"):
            device.CURRENT_DEVICE = mode.old_device
    return mode


def dual_level_write(forward_ad: Any, value: int) -> None:
    """Exit forward-AD dual levels down to ``value``."""
    while forward_ad._current_level > value:
        forward_ad.exit_dual_level(level=forward_ad._current_level)
    if forward_ad._current_level != value:
        raise RuntimeError("forward-AD dual levels can only be exited")


def saved_hooks_read(autograd: Any, ok: bool) -> Callable[[], object]:
    """The reader of the innermost saved-tensors hooks (``missing_flag`` when absent)."""
    return (
        functools.partial(autograd._top_saved_tensors_default_hooks, True) if ok else missing_flag
    )


def saved_hooks_write(autograd: Any, value: object) -> None:
    """Pop saved-tensors hooks until ``value`` is the innermost again."""
    for _ in range(1000):
        top = autograd._top_saved_tensors_default_hooks(True)
        if top == value or top is None:
            break
        autograd._pop_saved_tensors_default_hooks()


def hooks_plain(value: object) -> object:
    """The plain value of the saved-tensors hooks row."""
    return "none" if value is None else "a saved_tensors_hooks context is active"


MODULE_HOOKS = (
    "_global_buffer_registration_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
)


def dict_keys_read(mapping: dict[Any, Any]) -> object:
    """A hook dictionary's raw value: the tuple of its keys."""
    return tuple(mapping) if mapping else ()


def dict_keys_write(mapping: dict[Any, Any], extra: tuple[str, ...], value: object) -> None:
    """Remove the hooks not in ``value`` (from ``mapping`` and the ``extra`` dictionaries)."""
    wanted = set(value) if isinstance(value, (list, tuple)) else set()
    for key in [k for k in mapping if k not in wanted]:
        mapping.pop(key, None)
        for other in extra:
            other_map = getattr(sys.modules["torch.nn.modules.module"], other, None)
            if isinstance(other_map, dict):
                other_map.pop(key, None)


def handles(value: object) -> object:
    """The plain value of a hook dictionary: its keys as a list."""
    return list(value) if isinstance(value, tuple) else value


def _module_attr_get(module: str, attr: str) -> object:
    mod = sys.modules.get(module)
    return None if mod is None else getattr(mod, attr, None)


def module_attr_read(module: str, attr: str) -> Callable[[], object]:
    """A module attribute: None (torch's default) until the module is imported."""
    mod = sys.modules.get(module)
    if mod is None:
        return functools.partial(_module_attr_get, module, attr)
    return functools.partial(vars(mod).get, attr)  # imported: its dictionary, read directly


def override(entry: Any) -> object:
    """A config entry's user override: a ContextVar's value, or (torch 2.11) the attribute."""
    held = entry.user_override
    return held.get() if isinstance(held, contextvars.ContextVar) else held


def set_override(entry: Any, value: object) -> None:
    """Set a config entry's user override, in either of torch's layouts (see :func:`override`)."""
    held = entry.user_override
    if isinstance(held, contextvars.ContextVar):
        held.set(value)
    else:
        entry.user_override = value


class _ConfigOption:
    """One option of a torch config module, read through its user override.

    The raw value is the option's override (torch's unset sentinel while the
    option keeps its default, and while the module is not imported), so a
    config module imported during a test is no change, and reading never
    imports it.
    """

    def __init__(self, module: str, key: str, unset: object) -> None:
        self.module, self.key, self.unset = module, key, unset

    def read(self) -> object:
        mod = sys.modules.get(self.module)
        entry = None if mod is None else getattr(mod, "_config", {}).get(self.key)
        return self.unset if entry is None else override(entry)

    def plain(self, value: object) -> object:
        mod = sys.modules.get(self.module)
        entry = None if mod is None else getattr(mod, "_config", {}).get(self.key)
        if value is self.unset or (entry is not None and value == entry.default):
            return "default"
        return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)

    def write(self, value: object) -> None:
        mod = sys.modules.get(self.module)
        entry = None if mod is None else getattr(mod, "_config", {}).get(self.key)
        if entry is None:
            return
        if value == "default" or value is self.unset:
            set_override(entry, self.unset)
            return
        *path, last = self.key.split(".")
        obj: Any = mod
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)


def module_attr_write(module: str, attr: str, value: object) -> None:
    """Set ``attr`` of ``module`` when it is imported."""
    mod = sys.modules.get(module)
    if mod is not None:
        setattr(mod, attr, value)


def config_row(add: Add, name: str, module: str, key: str, unset: object, doc: str) -> None:
    """Add the row of one config-module option, read through its override."""
    option = _ConfigOption(module, key, unset)
    mod = sys.modules.get(module)
    entry = None if mod is None else getattr(mod, "_config", {}).get(key)
    held = None if entry is None else entry.user_override
    # an imported module's option in a torch that keeps overrides in a ContextVar: its
    # getter, called directly
    read = held.get if isinstance(held, contextvars.ContextVar) else option.read
    add(
        name,
        True,
        read,
        option.write,
        any_value,
        "the option's values, or 'default'",
        doc,
        plain=option.plain,
    )


def any_value(value: object) -> object:
    """Accept any value as it is."""
    return value


def sharing_write(mp: Any, value: str) -> None:
    """Set torch.multiprocessing's sharing strategy."""
    mp.set_sharing_strategy(value)


def _user_global(entry: object) -> bool:
    obj = entry[0] if isinstance(entry, tuple) else entry
    return not str(getattr(obj, "__module__", "") or "").startswith("torch")


def _safe_globals_read(serialization: Any) -> object:
    # torch registers its own globals as its modules are imported: only the user's count
    return tuple(g for g in serialization.get_safe_globals() if _user_global(g))


def safe_globals_reader(serialization: Any) -> Callable[[], object]:
    """The allow-list set itself (torch replaces it on every change), else the public getter."""
    module = sys.modules.get("torch._weights_only_unpickler")
    namespace = getattr(module, "__dict__", None)
    if isinstance(namespace, dict) and isinstance(namespace.get("_marked_safe_globals_set"), set):
        return functools.partial(namespace.get, "_marked_safe_globals_set")
    return functools.partial(_safe_globals_read, serialization)


def _global_name(entry: object) -> str:
    obj = entry[0] if isinstance(entry, tuple) else entry
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


def safe_globals_plain(value: object) -> object:
    """The plain value of the safe globals: the sorted names the user added."""
    if isinstance(value, (tuple, set, frozenset)):
        return sorted(_global_name(g) for g in value if _user_global(g))
    return value


def safe_globals_write(serialization: Any, value: object) -> None:
    """Keep only the safe globals in ``value`` (and torch's own)."""
    wanted = set(value) if isinstance(value, (list, tuple)) else set()
    current = serialization.get_safe_globals()
    keep = [g for g in current if not _user_global(g) or _global_name(g) in wanted]
    serialization.clear_safe_globals()
    if keep:
        serialization.add_safe_globals(keep)


def unrestorable_write(hint: str, _value: object) -> None:
    """The writer of a row torch cannot put back: raises with what to do."""
    raise RuntimeError(hint)


INTEROP_HINT = (
    "torch can set the inter-op thread count only once per process: call "
    "torch.set_num_interop_threads() in conftest.py before any test, or run this test "
    "in its own process (pytest-forked's --forked, or a subprocess)"
)
#: The inductor options that decide compiled numerics: each is a row.
INDUCTOR_NUMERICS = (
    "deterministic",
    "batch_invariant",
    "numerics",
    "emulate_precision_casts",
    "fallback_random",
    "eager_numerics.division_rounding",
    "eager_numerics.disable_ftz",
    "eager_numerics.use_pytorch_libdevice",
)


def tunable_rows(torch: Any, add: Add, cuda_ready: bool) -> None:
    """TunableOp's switches, absent (with the reason) without a CUDA device."""
    need = "needs a CUDA device (TunableOp)"
    tunable: Any = None
    if cuda_ready:
        with contextlib.suppress(Exception):
            tunable = importlib.import_module("torch.cuda.tunable")
        settle_tunable_filename(tunable)
    for name, getter, setter, check, allowed in (
        ("enabled", "is_enabled", "enable", check_bool, "True, False"),
        ("tuning", "tuning_is_enabled", "tuning_enable", check_bool, "True, False"),
        (
            "record_untuned",
            "record_untuned_is_enabled",
            "record_untuned_enable",
            check_bool,
            "True, False",
        ),
        (
            "max_tuning_duration",
            "get_max_tuning_duration",
            "set_max_tuning_duration",
            non_negative_int,
            "milliseconds",
        ),
        (
            "max_tuning_iterations",
            "get_max_tuning_iterations",
            "set_max_tuning_iterations",
            non_negative_int,
            "an int",
        ),
        (
            "cublaslt_requested_algo_count",
            "get_cublaslt_requested_algo_count",
            "set_cublaslt_requested_algo_count",
            non_negative_int,
            "an int",
        ),
        (
            "wildcard_fallback",
            "wildcard_fallback_is_enabled",
            "wildcard_fallback_enable",
            check_bool,
            "True, False",
        ),
    ):
        pair_row(
            add,
            f"tunableop.{name}",
            tunable,
            getter,
            setter,
            f"torch.cuda.tunable.{setter}",
            check=check,
            allowed=allowed,
            absent=need,
        )
    # rows whose writer takes the module: the rotating buffer's, in the getter's unit
    for name, getter, setter, write, check, allowed in (
        (
            "rotating_buffer_size",
            "get_rotating_buffer_size",
            "set_rotating_buffer_size",
            rotating_buffer_write,
            rotating_buffer_check,
            "bytes, as get_rotating_buffer_size() reports (whole MB, or the L2 cache size)",
        ),
        (
            "filename",
            "get_filename",
            "set_filename",
            tunable_filename_write,
            str_or_none,
            "a file name",
        ),
    ):
        add(
            f"tunableop.{name}",
            (tunable is not None and hasattr(tunable, getter) and hasattr(tunable, setter)) or need,
            get_attr(tunable, getter) or missing_flag,
            functools.partial(write, tunable),
            check,
            allowed,
            f"torch.cuda.tunable.{setter}",
        )
    add(
        "tunableop.results",
        (tunable is not None and hasattr(tunable, "get_results")) or need,
        lambda: tuple(tunable.get_results()) if tunable is not None else (),
        functools.partial(_tunable_results_write, tunable),
        any_value,
        "the tuned results (cleared on restore)",
        "TunableOp's in-memory results: a test that tunes changes later tests' kernels",
        plain=_results_plain,
    )


def _results_plain(value: object) -> object:
    """The results as lists, as they read back from JSON (the raw value is a tuple)."""
    if isinstance(value, (tuple, list)):
        return [_results_plain(v) for v in value]
    return value


def settle_tunable_filename(tunable: Any) -> None:
    """Let torch give TunableOp's results file its lazy default before the first reading.

    torch names the file (``PYTORCH_TUNABLEOP_FILENAME``, else
    ``tunableop_results.csv``, with the device ordinal inserted) the first time
    anything asks for the results: a tuned GEMM, or ``get_results()``, which is
    how the results row is read. Unsettled, the guard's own first reading of
    the results changed the filename it had just read, and the next reading
    blamed a test, a module or a conftest for it on every CUDA machine.
    """
    get_results = getattr(tunable, "get_results", None)
    if callable(get_results):
        with contextlib.suppress(Exception):
            get_results()


def _tunable_results_write(tunable: Any, value: object) -> None:
    clear = getattr(tunable, "_clear_all", None)
    if clear is None:
        raise RuntimeError("this torch cannot clear TunableOp results (needs torch >= 2.15)")
    clear()


_MIB = 1 << 20


def rotating_buffer_check(value: object) -> object:
    """Check a TunableOp rotating buffer size: an int, as the getter reports it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise Invalid(f"expected an int (bytes, as get_rotating_buffer_size() reports), got {value!r}")


def rotating_buffer_write(tunable: Any, value: int) -> None:
    """Set TunableOp's rotating buffer so that its getter reports ``value`` again.

    Newer torch takes megabytes and reports bytes (a negative size meaning
    the L2 cache size, reported as that size); older torch takes and
    reports the same number. Writing a read value back unchanged would, on
    the newer, ask for a million times the buffer (and overflow torch's
    int), so the setter's unit is found by writing 1 and reading it back.
    """
    get, put = tunable.get_rotating_buffer_size, tunable.set_rotating_buffer_size
    if get() == value:  # also where PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE decides the value
        return
    put(1)
    scale = _MIB if get() == _MIB else 1
    if value < 0 or value % scale == 0:
        put(value // scale if value >= 0 else value)
    else:
        put(-1)  # the L2 cache size, which need not be whole megabytes
    if get() != value:
        raise ValueError(
            f"TunableOp's rotating buffer cannot be set to {value} bytes here (it is set "
            "in whole megabytes, or -1 for the L2 cache size)"
        )


def tunable_filename_write(tunable: Any, value: str) -> None:
    """Set TunableOp's results file name (without the device suffix)."""
    tunable.set_filename(value, False)
