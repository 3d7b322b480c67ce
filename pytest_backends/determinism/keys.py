"""How the Python recorder keys what an op receives and returns.

The per-op facts the recorder needs once per op overload (:class:`OpInfo`: the
arguments it writes, whether it is a pure view, what the op tables of
:mod:`~pytest_backends.determinism.op_tables` say about it), the keys of
values that are not tensors (:func:`value_key`), the memory a strided view
covers (:func:`covered_memory`), tensors the recorder cannot read
(:func:`opaque`) or cannot see into (:func:`dispatches_in_python`), and the
fastest digest function available (:func:`digest_function`).

Importing this module imports torch: load it only when the harness runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from pytest_backends import _tree
from pytest_backends.determinism import op_tables
from pytest_backends.determinism.record import Slot, dtype_name

__all__ = [
    "CAST_ERROR",
    "INFOS",
    "PLAIN",
    "OpInfo",
    "covered_memory",
    "default_generator",
    "digest_function",
    "digest_module",
    "dispatches_in_python",
    "op_info",
    "opaque",
    "rewrap_numbers",
    "run_op",
    "storage_ptr",
    "tensors_in",
    "value_key",
]

#: Values that are their own keys.
PLAIN = frozenset(
    {
        bool,
        int,
        str,
        complex,
        type(None),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)


@dataclass(frozen=True)
class OpInfo:
    """What the recorder needs to know of one op overload, computed once per process."""

    op: Any
    call: Callable[..., Any]
    name: str
    written: tuple[int, ...]
    pure_view: bool
    uninitialized: bool
    workspaces: frozenset[int]
    overwrites: bool
    out_positions: tuple[int, ...]
    out_names: frozenset[str]
    #: ``set_``: the tensor now shows other memory; its contents are keyed where first read.
    rebinds: bool = False
    #: Draws random numbers (from the default generator unless one is passed).
    seeded: bool = False
    #: Marks a range and computes nothing (:data:`.op_tables.MARKER_NAMESPACES`): not recorded.
    marker: bool = False
    #: ``CompositeImplicitAutograd``: looked through to the ops it calls, never recorded
    #: itself. Such an op reaches the recorder only where autograd is excluded
    #: (``torch.inference_mode``); the native recorder looks through it too.
    composite: bool = False


#: The :class:`OpInfo` of every op seen, by ``id`` of the op: ``OpOverload.__hash__`` is a
#: Python method, too slow for every op. The entry holds the op, so its id is never reused
#: while the entry exists.
INFOS: dict[int, OpInfo] = {}


def op_info(func: Any) -> OpInfo:
    """The :class:`OpInfo` of ``func`` (an ``OpOverload``), from the cache or its schema."""
    info = INFOS.get(id(func))
    if info is not None:
        return info
    name = func.name().split(".", 1)[0]
    schema = func._schema
    written = tuple(
        i
        for i, arg in enumerate(schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )
    outs = [
        (i, arg.name)
        for i, arg in enumerate(schema.arguments)
        if getattr(arg, "is_out", False) or (arg.kwarg_only and i in written)
    ]
    info = OpInfo(
        func,
        # ``OpOverload.__call__`` is a Python frame around this callable.
        getattr(func, "_op", func),
        name,
        written,
        bool(func.is_view) and not written,
        name in op_tables.UNINITIALIZED,
        op_tables.WORKSPACES.get(name, frozenset()),
        name in op_tables.OVERWRITES,
        tuple(i for i, _ in outs),
        frozenset(n for _, n in outs),
        name in op_tables.REBINDS,
        torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()),
        name.split("::", 1)[0] in op_tables.MARKER_NAMESPACES,
        _composite(func),
    )
    INFOS[id(func)] = info
    return info


def _composite(func: Any) -> bool:
    """Whether ``func`` has a ``CompositeImplicitAutograd`` kernel (what the native hook asks)."""
    try:
        return bool(
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        )
    except RuntimeError:  # an overload the dispatcher does not hold: it reaches no kernel
        return False


def storage_ptr(t: torch.Tensor) -> int:
    """The address of ``t``'s storage (0 when it has none that can be read)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


def digest_module() -> Any:
    """:mod:`pytest_backends.determinism.digest`, imported when first needed."""
    from pytest_backends.determinism import digest

    return digest


def digest_function() -> Callable[[torch.Tensor], torch.Tensor]:
    """The fastest way to digest one tensor: the native op's C++ entry point if loaded."""
    module = digest_module()
    op = module._native_digest_op(None)
    if op is None:
        return _python_digest
    # OpOverload.__call__ is a Python frame around this callable.
    return getattr(op, "_op", op)  # type: ignore[no-any-return]


def _python_digest(t: torch.Tensor) -> torch.Tensor:
    """The digest in torch ops; a ZeroTensor raises TypeError (the caller keys it as unreadable).

    A ZeroTensor (``aten::_efficientzerotensor``: forward AD's zero tangents,
    ``torch.func.jvp``) has a storage without memory; digesting it with torch ops
    crashed the process (the native digest does not read it).
    """
    if t._is_zerotensor():
        raise TypeError("digest: a ZeroTensor has no memory to read")
    return digest_module()._python_digest(t)  # type: ignore[no-any-return]


_PYTHON_DISPATCH: dict[type, bool] = {}
_TRACER_MODULES = ("torch._subclasses", "torch._functorch", "torch.fx", "torch._export")


def dispatches_in_python(t: torch.Tensor) -> bool:
    """Whether ops on ``t`` run inside a ``__torch_dispatch__`` that no recorder sees."""
    cls = type(t)
    python = _PYTHON_DISPATCH.get(cls)
    if python is None:
        try:
            python = bool(torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python))
        except (RuntimeError, TypeError, AttributeError):
            python = False
        # The tracers' own tensors (FakeTensor, FunctionalTensor) carry no test data:
        # their ops are the compiler's, as for the native recorder.
        python = python and not cls.__module__.startswith(_TRACER_MODULES)
        _PYTHON_DISPATCH[cls] = python
    return python


def covered_memory(t: torch.Tensor) -> tuple[torch.Tensor, tuple[Any, ...]] | None:
    """The tensor to digest for ``t`` and what to add to its key; None when it is unreadable.

    A view whose storage is smaller than the view needs (a storage freed with
    ``untyped_storage().resize_(0)``) cannot be read, nor can a ``ZeroTensor`` (forward
    AD's zero tangents, ``aten::_efficientzerotensor``): its storage has no memory,
    and reading it crashes the process. An overlapping view (an
    ``expand``, stride 0) is digested by the memory it covers, with its sizes and
    strides added to the key, never materialised.
    """
    try:
        if t.layout != torch.strided or t.numel() == 0:
            return t, ()
        sizes, strides = tuple(t.shape), tuple(t.stride())
        span = 1
        for n, stride in zip(sizes, strides):
            span += (n - 1) * stride
        offset = t.storage_offset()
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return t, ()  # no storage to check (the digest says whether it can read it)
    if t._is_zerotensor() or storage.nbytes() < (offset + span) * t.element_size():
        return None
    if span < t.numel():
        return t.as_strided((span,), (1,), offset), ("strided", sizes, strides)
    return t, ()


def opaque(t: torch.Tensor) -> Slot:
    """The key of a tensor the recorder cannot read: only what it is, never its contents.

    A nested tensor has no shape (``t.shape`` raises): its components' shapes
    stand for it, as in the native recorder.
    """
    if t.is_nested and type(t) is torch.Tensor:
        shape: tuple[Any, ...] = tuple(map(tuple, t._nested_tensor_size().tolist()))
        what = "nested"
    else:
        shape, what = tuple(t.shape), str(t.layout)
    return (op_tables.SlotTag.OPAQUE, dtype_name(t.dtype), shape, what, type(t).__name__)


def value_key(a: object) -> Slot:
    """The key of a value that is not a tensor (floats by their exact hex form)."""
    if isinstance(a, float):
        return a.hex()
    if type(a) in PLAIN:
        return a
    if isinstance(a, (list, tuple)):
        return tuple(value_key(x) for x in a)
    return ("object", type(a).__name__)


def tensors_in(value: object) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (lists, tuples, dicts opened)."""
    return (leaf for leaf in _tree.iter_leaves(value) if isinstance(leaf, torch.Tensor))


# TorchScript's graph printer hands wrapped-number tensors to the dispatcher, and the
# Python binding gives them to the mode as plain numbers (measured with torch 2.13:
# ``aten::_local_scalar_dense`` and ``aten::view`` arrive with a float ``self``).
#: The start of the error a number in a Tensor position raises.
CAST_ERROR = "Expected a value of type 'Tensor'"
_NUMBER_DTYPES: tuple[tuple[type, torch.dtype], ...] = (
    (bool, torch.bool),
    (int, torch.int64),
    (float, torch.float64),
    (complex, torch.complex128),
)


def rewrap_numbers(op: Any, args: Sequence[Any]) -> tuple[Any, ...] | None:
    """``args`` with plain numbers in Tensor positions turned back into 0-dim tensors."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    changed = False
    out = list(args)
    for i, (arg, value) in enumerate(zip(schema.arguments, args)):
        if not isinstance(arg.type, torch.TensorType):
            continue
        for kind, dtype in _NUMBER_DTYPES:
            if type(value) is kind:
                out[i] = torch.tensor(value, dtype=dtype)
                changed = True
                break
    return tuple(out) if changed else None


def run_op(call: Any, op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``call(*args, **kwargs)``, again with numbers rewrapped where the binding unwrapped them."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as exc:
        rewrapped = rewrap_numbers(op, args) if CAST_ERROR in str(exc) else None
        if rewrapped is None:
            raise
        return call(*rewrapped, **kwargs)


def default_generator(
    args: Sequence[Any], kwargs: dict[str, Any]
) -> torch.Generator | Literal[False] | None:
    """The default generator of the device a random op runs on (None: it has none).

    False when the op is passed a generator: it draws from that one.
    """
    device = "cpu"
    found = False
    for a in [*args, *kwargs.values()]:
        if isinstance(a, torch.Generator):
            return False
        if not found and isinstance(a, torch.Tensor):
            device, found = a.device.type, True
        elif not found and isinstance(a, torch.device):
            device, found = a.type, True
    if device == "cpu":
        return torch.default_generator
    if device == "cuda":
        try:
            return torch.cuda.default_generators[torch.cuda.current_device()]
        except (RuntimeError, IndexError, AttributeError):
            return None
    return None
