"""What the matrix reads of collected items, and how it reads it cheaply.

The check for markers that hooks added runs over every item twice per
collection (before pytest's ``-k``/``--deselect`` and after every other
hook), so it reads markers with a :class:`MarkReader`: each item's own
markers once per pass, and the markers of the parents they share (a module,
a class) once per pass, not once per item.  The other helpers tell which
definition an item comes from and whether an item collected again is the
same parameter set with a config added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pytest_backends.matrix import markers
from pytest_backends.matrix.configs import BackendConfig

__all__ = ["PARAM", "Mark", "MarkReader", "definition_id", "read_marks", "same", "same_params"]

#: The test-id parameter and fixture that carry the config.
PARAM = "backend_config"


def definition_id(item: pytest.Item) -> str:
    """The node id of the function an item was generated from (without ``[params]``)."""
    name = item.name
    original = getattr(item, "originalname", name)
    return item.nodeid[: len(item.nodeid) - len(name) + len(original)]


#: One marker's arguments: ``(args, kwargs)``.
Mark = tuple[Sequence[object], Mapping[str, object]]


def read_marks(node: Any) -> list[Mark]:
    """The ``backends`` markers of ``node`` and its parents, closest first."""
    return [(m.args, m.kwargs) for m in node.iter_markers(markers.MARKER)]


class MarkReader:
    """Reads the ``backends`` markers of many items in one pass, each parent's once.

    An item's markers are its own, then its parents' from the closest up, as
    ``iter_markers`` gives them.  Items share their parents (a module, a
    class), so the parents' part is read once per reader.  Use one reader per
    pass over the items: a marker added to a parent between two passes is then
    seen by the next.
    """

    def __init__(self) -> None:
        # id(parent) -> (parent, its markers and its parents'); the node is kept
        # so that its id is not reused while the reader lives.
        self._parents: dict[int, tuple[Any, list[Mark]]] = {}

    def __call__(self, node: Any) -> list[Mark]:
        """The markers of ``node``, equal to :func:`read_marks` of it."""
        own = [
            (m.args, m.kwargs)
            for m in node.own_markers
            if getattr(m, "name", None) == markers.MARKER
        ]
        parent = node.parent
        if parent is None:
            return own
        known = self._parents.get(id(parent))
        if known is None:
            known = self._parents[id(parent)] = (parent, self(parent))
        return own + known[1]


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
