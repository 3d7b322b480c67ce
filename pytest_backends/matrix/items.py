"""What the matrix reads of collected items, and how it reads it cheaply.

A test's ``backends`` markers are read once per node and cached in the
node's stash (:func:`read_marks`); they are read again only when a marker
list of the node or a parent changed, which is what the checks for markers
added by hooks look for (they run on every item twice per collection).
The other helpers tell which definition an item comes from and whether an
item collected again is the same parameter set with a config added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pytest_backends.matrix import markers
from pytest_backends.matrix.configs import BackendConfig

__all__ = ["PARAM", "Mark", "definition_id", "read_marks", "same", "same_params"]

#: The test-id parameter and fixture that carry the config.
PARAM = "backend_config"


def definition_id(item: pytest.Item) -> str:
    """The node id of the function an item was generated from (without ``[params]``)."""
    name = item.name
    original = getattr(item, "originalname", name)
    return item.nodeid[: len(item.nodeid) - len(name) + len(original)]


#: One marker's arguments: ``(args, kwargs)``.
Mark = tuple[Sequence[object], Mapping[str, object]]


#: A node's ``backends`` markers as last read, and the marker lists they were read from.
_MARKS_KEY: pytest.StashKey[tuple[tuple[tuple[list[Any], int], ...], list[Mark]]] = (
    pytest.StashKey()
)


def _marker_lists(node: Any) -> tuple[tuple[list[Any], int], ...]:
    """Each node's own marker list, from ``node`` up, with its length when read."""
    lists = []
    while node is not None:
        lists.append((node.own_markers, len(node.own_markers)))
        node = node.parent
    return tuple(lists)


def _unchanged(node: Any, lists: tuple[tuple[list[Any], int], ...]) -> bool:
    """Whether no marker list from ``node`` up was replaced or grew or shrank since ``lists``."""
    for own, length in lists:
        if node is None or node.own_markers is not own or len(own) != length:
            return False
        node = node.parent
    return node is None


def read_marks(node: Any) -> list[Mark]:
    """The ``backends`` markers of ``node`` and its parents, closest first.

    Read once per node and cached in its stash; read again only when a marker
    was added to (or removed from) the node or a parent since, which is what
    the checks for markers added by hooks look for.
    """
    cached = node.stash.get(_MARKS_KEY, None)
    if cached is not None and _unchanged(node, cached[0]):
        marks: list[Mark] = cached[1]
        return marks
    found = [(m.args, m.kwargs) for m in node.iter_markers(markers.MARKER)]
    node.stash[_MARKS_KEY] = (_marker_lists(node), found)
    return found


def same(a: object, b: object) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an object whose == raises or is ambiguous (a tensor)
        return False


def same_params(old: pytest.Item, new: pytest.Item) -> bool:
    """Whether ``new`` is ``old`` collected again with a config: the same parameter set.

    Parameter sets are matched by identity (their parameter id, which pytest
    makes unique within each parametrization), never by value: two sets whose
    values compare equal (``[[2.0], [2.0]]``) are still two tests.
    """
    old_spec = getattr(old, "callspec", None)
    new_spec = getattr(new, "callspec", None)
    if old_spec is None or new_spec is None:
        return old_spec is None and (new_spec is None or set(new_spec.params) <= {PARAM})
    config = new_spec.params.get(PARAM)
    config_id = config.id if isinstance(config, BackendConfig) else ""
    return without_config_id(str(new_spec.id), config_id) == str(old_spec.id)


def without_config_id(param_id: str, config_id: str) -> str:
    """A parameter id without the config's part (``3-mkldnn-off`` -> ``3``)."""
    if not config_id:
        return param_id
    if param_id == config_id:
        return ""
    for candidate in (
        param_id.removesuffix("-" + config_id),
        param_id.removeprefix(config_id + "-"),
        param_id.replace(f"-{config_id}-", "-", 1),
    ):
        if candidate != param_id:
            return candidate
    return param_id
