"""A row of the registry (:class:`Flag`), and the checks, readers and writers rows share."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Check = Callable[[object], object]


@dataclass(frozen=True, eq=False)
class ReadGroup:
    """Rows read together: ``read()`` returns the raw values of ``names``, in that order."""

    names: tuple[str, ...]
    read: Callable[[], tuple[object, ...]]


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
    allowance (the ``disable_global_flags`` switch itself).  ``unrestorable``
    rows are reported with what the user must do; ``unmanaged`` rows come from
    the runtime net (a switch torch has and the catalogue does not know).
    ``group`` (set by :func:`~pytest_backends.flags.registry.grouped`) reads this
    row together with others in one call; ``read`` still reads it alone.
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
    #: what the user must do, for state torch cannot put back once changed
    unrestorable: str | None = None
    #: a switch discovery found and no row manages: reported, never restored
    unmanaged: bool = False
    #: rows whose raw values one call reads together, for the fingerprint
    group: ReadGroup | None = None


class Invalid(ValueError):
    """A value failed validation; the registry adds the flag name."""


def check_bool(value: object) -> object:
    """Check a bool flag value."""
    if isinstance(value, bool):
        return value
    raise Invalid(f"expected True or False, got {value!r}")


def one_of(*choices: str) -> Check:
    """A check that accepts one of the strings ``choices``."""

    def check(value: object) -> object:
        if isinstance(value, str) and value in choices:
            return value
        raise Invalid(f"expected one of {', '.join(map(repr, choices))}, got {value!r}")

    return check


def positive_int(value: object) -> object:
    """Check a positive int."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise Invalid(f"expected a positive int, got {value!r}")


def reduction_pair(value: object) -> object:
    """cuBLAS reduced-precision settings: a bool or (allow_reduced, allow_splitk)."""
    if isinstance(value, bool):
        return (value, True)
    if (
        isinstance(value, (tuple, list))
        and 1 <= len(value) <= 2
        and all(isinstance(v, bool) for v in value)
    ):
        return (value[0], value[1] if len(value) == 2 else True)
    raise Invalid(f"expected a bool or a pair (allow_reduced, allow_splitk), got {value!r}")


def unfrozen(torch: Any) -> contextlib.AbstractContextManager[object]:
    """Allow ContextProp writes even after ``disable_global_flags()``.

    The previous frozen state is put back on exit, so user code that froze
    the flags still sees them frozen.
    """
    allow = getattr(torch.backends, "__allow_nonbracketed_mutation", None)
    return allow() if allow is not None else contextlib.nullcontext()


# Precision strings accepted per fp32_precision backend.
CUDA_PRECISIONS = ("ieee", "tf32", "none")
ALL_PRECISIONS = ("ieee", "tf32", "bf16", "none")
FP32_ROWS: tuple[tuple[str, str, str, str | None], ...] = (
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


def choice_int(*choices: int) -> Check:
    """A check that accepts one of the ints ``choices`` (or "default", "warn", "error")."""

    def check(value: object) -> object:
        names = {"default": 0, "warn": 1, "error": 2}
        value = names.get(value, value) if isinstance(value, str) else value
        if isinstance(value, int) and not isinstance(value, bool) and value in choices:
            return value
        raise Invalid(f"expected one of {', '.join(map(str, choices))}, got {value!r}")

    return check


def device_available(torch: Any, device: str) -> bool:
    """Whether torch offers ``device`` on this machine (never raises)."""
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


def read_or_mixed(read: Callable[[], object]) -> object:
    """``read()``, or :data:`MIXED` when the legacy and fp32_precision APIs disagree."""
    try:
        return read()
    except RuntimeError:
        return MIXED


def write_unless_mixed(write: Callable[[Any], object], value: object) -> None:
    """Write ``value`` unless it is :data:`MIXED` (a state public API cannot recreate)."""
    # A mixed legacy state cannot be recreated through public API; the
    # fp32_precision strings written after this still restore what matters.
    if value != MIXED:
        write(value)


def missing_flag(*_args: object) -> object:
    """The reader and writer of a flag the running torch does not have: raises."""
    raise RuntimeError("this flag does not exist in the running torch")


def any_str(value: object) -> object:
    """Check a non-empty string."""
    if isinstance(value, str) and value:
        return value
    raise Invalid(f"expected a non-empty string, got {value!r}")


def non_negative_int(value: object) -> object:
    """Check a non-negative int."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise Invalid(f"expected a non-negative int, got {value!r}")


def enum_name(value: object) -> object:
    """An enum's plain value: its lower-case name."""
    return str(getattr(value, "name", value)).lower()


def dtype_name(value: object) -> object:
    """A dtype's plain value: its name without ``torch.``."""
    return str(value).removeprefix("torch.")


_DEFAULT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def dtype_of(torch: Any, value: object) -> Any:
    """The torch dtype named by ``value`` (a dtype is returned as it is)."""
    return getattr(torch, value) if isinstance(value, str) else value


def dtype_check(torch: Any, value: object) -> object:
    """Check a default dtype (a name or a torch dtype); returns its name."""
    name = dtype_name(value) if isinstance(value, torch.dtype) else value
    if name in _DEFAULT_DTYPES:
        return name
    raise Invalid(f"expected one of {', '.join(map(repr, _DEFAULT_DTYPES))}, got {value!r}")


def priority_order(torch: Any, value: object) -> object:
    """Check an SDPA priority order: a permutation of the backends' values or names."""
    members = {int(m): m for name, m in torch._C._SDPBackend.__members__.items() if name != "ERROR"}
    names = {name.lower(): int(m) for name, m in torch._C._SDPBackend.__members__.items()}
    if isinstance(value, (list, tuple)):
        order = [names.get(v.lower(), -1) if isinstance(v, str) else v for v in value]
        if sorted(o for o in order if isinstance(o, int)) == sorted(members) and len(order) == len(
            members
        ):
            return [int(o) for o in order]
    raise Invalid(f"expected a permutation of {sorted(members)} (SDPBackend values), got {value!r}")


def default_device_reader(torch: Any) -> tuple[Callable[[], object], Callable[[Any], object]]:
    """A cheap raw read of the global default device, and its plain form.

    ``torch.get_default_device()`` walks the mode stack (about 3 us); the
    global setting itself is one thread-local attribute, which is what
    ``set_default_device`` writes.
    """
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if holder is None:
        return getattr(torch, "get_default_device", missing_flag), str

    def read() -> object:
        # the calling thread's dict of the thread-local: a missed getattr raises inside
        return holder.__dict__.get("device_context")

    def plain(context: Any) -> object:
        return "cpu" if context is None else str(context.device)

    return read, plain


def write_default_device(torch: Any, value: str) -> None:
    """Set the default device ("cpu" clears the override)."""
    # "cpu" is torch's own default: clearing the override avoids leaving a
    # device-context mode installed that every factory call would pay for.
    torch.set_default_device(None if value == "cpu" else value)


def pair_writer(setter: Callable[..., None], paired: bool) -> Callable[[Any], None]:
    """A writer calling ``setter(*value)`` for a paired value, else ``setter`` itself."""
    if paired:
        return lambda v: setter(*v)
    return setter


def attribute_reader(obj: object, attr: str) -> Callable[[], object]:
    """The cheapest exact read of ``obj.attr`` for a ``torch.backends`` module wrapper.

    The wrappers define ``__getattr__``, which makes every attribute read go through a
    slow hook; a ``ContextProp`` is read through its getter, a plain class default
    through the instance dictionary that an assignment writes.
    """
    cls = type(obj)
    prop = cls.__dict__.get(attr)
    getter = getattr(prop, "getter", None)
    if callable(getter) and hasattr(prop, "__set__"):
        return getter  # type: ignore[no-any-return]
    namespace = getattr(obj, "__dict__", None)
    inner = getattr(getattr(obj, "m", None), "__dict__", None)
    if not isinstance(namespace, dict) or any(attr in vars(k) for k in cls.__mro__[1:]):
        return functools.partial(getattr, obj, attr)
    if attr in cls.__dict__:
        if hasattr(prop, "__get__"):
            return functools.partial(getattr, obj, attr)
        return functools.partial(namespace.get, attr, prop)
    if not isinstance(inner, dict):
        return functools.partial(getattr, obj, attr)
    # an assignment to the wrapper lands in its own dictionary; else the wrapped module's
    own, wrapped, missing = namespace, inner, object()

    def read() -> object:
        value = own.get(attr, missing)
        return wrapped.get(attr) if value is missing else value

    return read


def set_attr(torch: Any, obj: object, attr: str, value: object) -> None:
    """Set ``obj.attr`` even while the backend flags are frozen."""
    with unfrozen(torch):
        setattr(obj, attr, value)


def outside_modes(torch: Any, fn: Callable[..., object], *args: object) -> object:
    """``fn(*args)`` with the user's torch-function and dispatch modes out of the way.

    Some getters and setters are torch ops (the per-device cuFFT plan cache's
    are): called under a mode a test left pushed, they reach that mode, which
    may raise (a bare ``TorchFunctionMode`` does) or answer for torch.
    """
    disable, exclude = _mode_guards(torch._C)
    with disable(), exclude():
        return fn(*args)


@functools.cache
def _mode_guards(C: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The two guards of :func:`outside_modes`, found once (a fingerprint reads through them)."""
    disable = getattr(C, "DisableTorchFunction", contextlib.nullcontext)
    guard: Any = getattr(C, "_ExcludeDispatchKeyGuard", None)
    try:
        keys = C.DispatchKeySet(C.DispatchKey.Python) | C.DispatchKeySet(
            C.DispatchKey.PythonTLSSnapshot
        )
    except Exception:  # an older torch without these keys
        guard = None
    exclude = functools.partial(guard, keys) if guard is not None else contextlib.nullcontext
    return disable, exclude
