"""One walk over nested Python values: the containers every comparison opens.

Containers are mappings (children by key, path ``[key!r]``), named tuples and
dataclass instances (by field, ``.name``), and lists, tuples and other
sequences (by index, ``[i]``; ``str`` and ``bytes`` are leaves). Everything
else is a leaf: tensors, NumPy arrays, numbers, None, and any other object,
which the caller accepts or refuses. :func:`flag_effect`, the tolerance
assertions, :func:`assert_reproducible`, the digest's repeat and the op
recorder all walk values through this module.

Nothing heavy is imported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["Empty", "StructureMismatch", "children", "iter_leaves", "leaves", "zip_leaves"]


class StructureMismatch(AssertionError):
    """Two values do not have the same containers (keys or lengths differ)."""


@dataclasses.dataclass(frozen=True)
class Empty:
    """The leaf :func:`leaves` gives for an empty container when asked to (``empty=True``)."""

    kind: str


def children(value: object) -> list[tuple[str, Any]] | None:
    """``(path suffix, child)`` of a container, in order; None for a leaf."""
    if isinstance(value, Mapping):
        return [(f"[{key!r}]", item) for key, item in value.items()]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # named tuple
        return [(f".{name}", item) for name, item in zip(value._fields, value)]
    if isinstance(value, (list, tuple)) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))
    ):
        return [(f"[{i}]", item) for i, item in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value)]
    return None


def leaves(value: object, path: str = "", *, empty: bool = False) -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every leaf, depth first.

    With ``empty``, an empty container yields one :class:`Empty` leaf, so two
    values with different containers never give the same leaves.
    """
    items = children(value)
    if items is None:
        yield path, value
        return
    if empty and not items:
        yield path, Empty(type(value).__name__)
    for suffix, item in items:
        yield from leaves(item, path + suffix, empty=empty)


def iter_leaves(value: object) -> Iterator[Any]:
    """The leaves of lists and tuples (an op's arguments or outputs), without paths."""
    if type(value) is list or isinstance(value, tuple):
        for item in value:
            yield from iter_leaves(item)
    else:
        yield value


def zip_leaves(a: object, b: object, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """``(path, leaf of a, leaf of b)`` over two values with the same containers.

    Where one side is a leaf, or the two are containers of different kinds,
    the pair is yielded as leaves. Raises :class:`StructureMismatch` naming
    the path where keys or lengths differ.
    """
    left, right = children(a), children(b)
    if left is None or right is None or isinstance(a, Mapping) != isinstance(b, Mapping):
        yield path, a, b
        return
    where = f" at {path}" if path else ""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise StructureMismatch(
                f"keys differ{where}: [{', '.join(sorted(map(repr, a)))}] != "
                f"[{', '.join(sorted(map(repr, b)))}]"
            )
        for key in a:
            yield from zip_leaves(a[key], b[key], f"{path}[{key!r}]")
        return
    if len(left) != len(right):
        raise StructureMismatch(f"lengths differ{where}: {len(left)} != {len(right)}")
    for (suffix, x), (_, y) in zip(left, right):
        yield from zip_leaves(x, y, path + suffix)


def shown(value: object, limit: int = 80) -> str:
    """``value`` for an error message: its type, and its text where that is short.

    A tensor or array passed by mistake prints as its type and shape, never as
    its values.
    """
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, type):
        return f"a {type(value).__name__} of shape {list(shape)}"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"
