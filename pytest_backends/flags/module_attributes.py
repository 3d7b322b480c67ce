"""Attributes a test sets on the ``torch.backends`` modules themselves.

``torch.backends.cudnn.enabled`` is a property that writes torch's switch. On a
plain module such as ``torch.backends.nnpack`` (whose switch is ``set_flags``),
``torch.backends.nnpack.enabled = False`` only adds a module attribute that
torch never reads, and ``torch.backends.cuda.flash_sdp_enabled = False``
replaces a function with a bool. Either stays for every later test, and the
first one looks as if it had turned NNPACK off.

The ``backends.module_attributes`` row fingerprints the public attributes of
every loaded ``torch.backends`` module by identity (cheap: a dict copy per
module), so that a test adding, replacing or deleting one is reported, and its
writer puts the objects back. Its plain value lists what differs from torch's
own modules (empty for torch as imported). A submodule's import (an attribute
``torch.backends.x`` that is the module ``torch.backends.x``) and private names
(torch's lazy caches) are not compared.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pytest_backends.flags.row import Invalid

__all__ = ["ROW", "module_attribute_row"]

ROW = "backends.module_attributes"
_DELETED = object()


class _State:
    """The attributes of every loaded ``torch.backends`` module, as read.

    Equal when every module holds the same names with the same (or equal)
    values: dict equality, which takes identical objects as equal without
    comparing them. A value whose comparison raises (a tensor) is a change.
    """

    __slots__ = ("copies", "modules")

    def __init__(self, modules: tuple[types.ModuleType, ...], copies: list[dict[str, object]]):
        self.modules = modules
        self.copies = copies

    @property
    def items(self) -> list[tuple[types.ModuleType, dict[str, object]]]:
        """Each module with its attributes as read."""
        return list(zip(self.modules, self.copies, strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _State):
            return False
        try:
            return self.modules == other.modules and self.copies == other.copies
        except Exception:  # a value without a boolean equality
            return False

    def __hash__(self) -> int:
        return len(self.modules)


def _submodule(owner: types.ModuleType, name: str, value: object) -> bool:
    """Whether ``owner.name`` is the imported submodule ``owner.__name__ + '.' + name``."""
    return isinstance(value, types.ModuleType) and value.__name__ == f"{owner.__name__}.{name}"


def _modules(root: types.ModuleType) -> Iterator[types.ModuleType]:
    """``torch.backends`` and its imported submodules, depth first."""
    todo = [root]
    while todo:
        module = todo.pop()
        yield module
        todo.extend(v for k, v in vars(module).items() if _submodule(module, k, v))


def _public(
    module: types.ModuleType, attrs: dict[str, object], owned: frozenset[tuple[int, str]]
) -> dict[str, object]:
    """The attributes this row compares: public, no submodule, no switch.

    A name the module's type defines (a property of torch's ``PropModule``) is
    a switch, and so is an attribute another row reads (``owned``: ``id(module)``
    and name, ``torch.backends.opt_einsum.enabled``); those are their rows'.
    """
    kind = type(module)
    return {
        k: v
        for k, v in attrs.items()
        if not k.startswith("_")
        and not _submodule(module, k, v)
        and not hasattr(kind, k)
        and (id(module), k) not in owned
    }


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def module_attribute_row(
    torch: Any, owned: Iterable[tuple[object, str]] = ()
) -> tuple[Callable[[], object], Callable[[Any], None], Any]:
    """The reader, writer and plain conversion of the ``backends.module_attributes`` row.

    What torch's modules hold when the row is built (at torch's import, before
    user code) is torch's own; a module imported later is torch's as first seen.
    ``owned`` lists the (module, attribute) pairs other rows read and write.
    """
    root = torch.backends
    owned_ids = frozenset((id(module), attr) for module, attr in owned)

    def public(module: types.ModuleType, attrs: dict[str, object]) -> dict[str, object]:
        return _public(module, attrs, owned_ids)

    original: dict[str, tuple[types.ModuleType, dict[str, object]]] = {}
    built = {m.__name__: dict(vars(m)) for m in _modules(root)}
    #: description -> (module name, attribute, object or _DELETED), for the writer
    seen: dict[str, tuple[str, str, object]] = {}

    # the modules, walked again only when one of them gains or loses an attribute
    # (a submodule import adds one to its parent): the walk is the costly part
    # (modules, their attribute dicts, the dicts' sizes); a module's dict is the same object
    # for its life, so only the copies are made on each read
    walked: list[tuple[tuple[types.ModuleType, ...], list[dict[str, Any]], tuple[int, ...]]] = [
        ((), [], ())
    ]

    # the state last read: while every module's dict equals its copies there, it is
    # returned again, so a read costs one comparison and no copy, and the guard's
    # comparisons of two fingerprints holding it stop at its identity
    last: list[_State | None] = [None]

    def read() -> object:
        modules, dicts, sizes = walked[0]
        state = last[0]
        if state is not None and state.modules is modules:
            try:
                if dicts == state.copies:
                    return state
            except Exception:  # a value without a boolean equality: read afresh
                pass
        copies = [d.copy() for d in dicts]
        if not modules or tuple(map(len, copies)) != sizes:
            modules = tuple(_modules(root))
            dicts = [vars(m) for m in modules]
            copies = [d.copy() for d in dicts]
            walked[0] = (modules, dicts, tuple(map(len, copies)))
        state = _State(modules, copies)
        last[0] = state
        return state

    def own(module: types.ModuleType, attrs: dict[str, object]) -> dict[str, object]:
        if module.__name__ not in original:
            at_build = built.get(module.__name__)
            original[module.__name__] = (module, public(module, at_build or attrs))
        return original[module.__name__][1]

    def plain(state: object) -> object:
        assert isinstance(state, _State)
        out: list[str] = []
        for module, attrs in state.items:
            name, base, now = module.__name__, own(module, attrs), public(module, attrs)
            for attr in sorted(set(base) | set(now)):
                value = now.get(attr, _DELETED)
                if value is base.get(attr, _DELETED):
                    continue
                if value is _DELETED:
                    desc = f"del {name}.{attr}"
                elif attr in base:
                    desc = f"{name}.{attr} = {_short(value)} (torch's: {_short(base[attr])})"
                elif isinstance(sys.modules.get(f"{name}.{attr}"), types.ModuleType):
                    desc = f"{name}.{attr} = {_short(value)} (torch's: the module {name}.{attr})"
                else:
                    desc = (
                        f"{name}.{attr} = {_short(value)} (no such attribute: torch never reads it)"
                    )
                seen[desc] = (name, attr, value)
                out.append(desc)
        return out

    def write(want: object) -> None:
        wanted = {seen[d][:2]: seen[d][2] for d in descriptions(want)}
        for module in list(_modules(root)):
            name = module.__name__
            base = own(module, dict(vars(module)))
            now = public(module, dict(vars(module)))
            for attr in set(base) | set(now) | {a for m, a in wanted if m == name}:
                target = wanted.get((name, attr), base.get(attr, _DELETED))
                if target is _DELETED:
                    imported = sys.modules.get(f"{name}.{attr}")
                    if isinstance(imported, types.ModuleType):
                        target = imported  # never delete a submodule a test replaced
                if target is _DELETED:
                    if attr in now:
                        delattr(module, attr)
                elif getattr(module, attr, _DELETED) is not target:
                    setattr(module, attr, target)

    def descriptions(value: object) -> list[str]:
        if isinstance(value, (list, tuple)) and all(v in seen for v in value):
            return list(value)
        raise Invalid(
            "this row is restored by the guard only (it holds objects); expected [] for "
            f"torch's own attributes, got {value!r}"
        )

    def check(value: object) -> object:
        return descriptions(value)

    return read, write, (plain, check)
