"""What a function can reach: the objects of some kinds its calls may read or write.

The batch check and the kernel-path comparison put back the state a run may
change (module buffers, parameters, optimizer state) before the next run; both
find that state here, from the function alone.

Importing this module imports nothing.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

__all__ = ["reached"]

#: How far from ``fn`` a search goes (each closure cell, argument, global or attribute
#: is one step).
DEPTH = 3
#: The items of a list, tuple or dict that a search looks at.
ITEMS = 64
_NOT_PLAIN = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
)


def reached(fn: object, kinds: tuple[type, ...], *, through_calls: bool = False) -> list[Any]:
    """The objects of ``kinds`` that ``fn`` reaches, each once, in the order found.

    ``fn`` itself when it is of ``kinds``; else what its bound ``__self__``, a
    ``functools.partial``'s function and arguments, its closure cells, its
    defaults and the globals its code names hold (an object of ``kinds`` is
    not searched further). With ``through_calls`` the search goes on, up to
    :data:`DEPTH` steps from ``fn``, into the functions those globals are (the
    helpers ``fn`` calls), the attributes of the user's own objects (a
    trainer holding a model and its optimizer) and the items of lists, tuples
    and dicts.
    """
    found: dict[int, Any] = {}
    seen: set[int] = set()

    def visit(obj: object, depth: int) -> None:
        if id(obj) in seen or depth > DEPTH:
            return
        seen.add(id(obj))
        if isinstance(obj, kinds):
            found[id(obj)] = obj
            return
        inner = getattr(obj, "__self__", None)
        if inner is not None:
            visit(inner, depth + 1)
        func = getattr(obj, "func", None)  # functools.partial
        if func is not None:
            visit(func, depth + 1)
            for a in (*getattr(obj, "args", ()), *getattr(obj, "keywords", {}).values()):
                visit(a, depth + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                visit(cell.cell_contents, depth + 1)
        code = getattr(obj, "__code__", None)
        glob = getattr(obj, "__globals__", None)
        if code is not None and isinstance(glob, dict):
            for name in code.co_names:
                value = glob.get(name)
                if isinstance(value, kinds):
                    found[id(value)] = value
                elif through_calls and value is not None:
                    visit(value, depth + 1)
        for default in getattr(obj, "__defaults__", None) or ():
            visit(default, depth + 1)
        if through_calls:
            for item in _contents(obj):
                visit(item, depth + 1)

    visit(fn, 0)
    return list(found.values())


def _contents(obj: object) -> list[object]:
    """The items of a list, tuple or dict, or the attributes of a user's own object."""
    if isinstance(obj, (list, tuple)):
        return list(obj[:ITEMS])
    if isinstance(obj, dict):
        return list(obj.values())[:ITEMS]
    if isinstance(obj, _NOT_PLAIN) or type(obj).__module__.split(".")[0] in ("builtins", "torch"):
        return []
    attributes = getattr(obj, "__dict__", None)
    return list(attributes.values())[:ITEMS] if isinstance(attributes, dict) else []
