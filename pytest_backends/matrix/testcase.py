"""``unittest.TestCase`` methods in the backend matrix.

pytest collects a ``TestCase`` class with its own collector, whose items run
each method through unittest's protocol (``setUp``, ``tearDown``,
``subTest``, skips, expected failures).  That collector never calls
``pytest_generate_tests``, so a ``TestCase`` method cannot be parametrized,
and its item builds the ``TestCase`` instance from the item's name.

The matrix therefore extends pytest's collector rather than replacing it: the
collector is handed a subclass of the user's class (same name, module and
qualified name) in which each config of a marked method is a test method of
its own, named ``test_x[mkldnn-on]`` and bound to the original function, and
the original name is hidden from collection.  pytest's own collector and items
then run every config through unittest's protocol unchanged, with node ids
``file.py::Class::test_x[mkldnn-on]``.

Hidden consequences, documented for users: ``self._testMethodName`` carries
the config id, ``type(self)`` is the subclass (``isinstance`` checks and
``super()`` are unaffected), and attributes that ``setUpClass`` sets on
``cls`` land on the subclass, where ``self`` finds them.  The subclass is made
without running the user's class machinery (``__init_subclass__``, a custom
metaclass's ``__new__``/``__init__``), so class registries see the user's
class once.  Class-level setup (``setUpClass``, class-scoped fixtures) runs
once per class, not per config: under the first config's flags, and
``tearDownClass`` under the last one's.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from pytest_backends.matrix import markers

__all__ = [
    "align_node_id",
    "config_names",
    "expandable",
    "is_testcase",
    "matrix_subclass",
    "method_marks",
    "unittest_names",
]


def is_testcase(obj: object) -> bool:
    """Whether ``obj`` is a ``unittest.TestCase`` subclass (without importing unittest)."""
    unittest = sys.modules.get("unittest")
    return unittest is not None and isinstance(obj, type) and issubclass(obj, unittest.TestCase)


def unittest_names(cls: type) -> list[str]:
    """The test method names unittest finds on ``cls`` (``__test__ = False`` excluded)."""
    import unittest

    return [
        name
        for name in unittest.TestLoader().getTestCaseNames(cls)
        if getattr(getattr(cls, name), "__test__", True)
    ]


def method_marks(
    cls: type, name: str, collector: pytest.Class
) -> list[tuple[Sequence[object], Mapping[str, object]]]:
    """The ``backends`` markers of one method, closest first (method, class, module)."""
    own = getattr(getattr(cls, name), "pytestmark", [])
    if not isinstance(own, list):
        own = [own]
    marks = [(m.args, m.kwargs) for m in own if getattr(m, "name", None) == markers.MARKER]
    marks += [(m.args, m.kwargs) for m in collector.iter_markers(markers.MARKER)]
    return marks


def config_names(name: str, config_ids: Sequence[str]) -> list[str]:
    """The test names of one method's configs: ``test_x[mkldnn-on]``."""
    return [f"{name}[{config_id}]" for config_id in config_ids]


def align_node_id(item: pytest.Item) -> None:
    """Give a config item the structured id pytest gives a parametrized item.

    pytest builds a ``TestCase`` item's structured id (``Node.id``, pytest
    9.2 and later) from its name, so ``test_x[mkldnn-on]`` is one name with
    no parameters, while ids read back from text (``--lf``'s cache, node ids
    on the command line) parse ``[mkldnn-on]`` as the parameters: the two
    never compare equal and ``--lf`` deselected the item that failed.  The
    item's id becomes the parse of its node id, as for any parametrized test.
    Older pytest has no structured ids; nothing changes there.
    """
    current = getattr(item, "_id", None)
    if current is None or not hasattr(current, "params"):
        return
    parsed = type(current).parse(item.nodeid)
    if parsed != current:
        item._id = parsed


def _hidden(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` under its own name, still callable, but not collected as a test."""

    @functools.wraps(func)
    def method(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    method.__test__ = False  # type: ignore[attr-defined]
    return method


def expandable(cls: type, name: str) -> bool:
    """Whether the method can be given config names (a plain or ``async`` function)."""
    return inspect.isfunction(inspect.getattr_static(cls, name, None))


def matrix_subclass(cls: type, expanded: Mapping[str, Sequence[str]]) -> type:
    """A subclass of ``cls`` where method ``m`` of ``expanded`` runs as each name listed.

    ``expanded`` maps a method name to its config test names.  The subclass
    keeps ``cls``'s name, module, qualified name and docstring, so reports,
    unittest ids and fixtures look as they do for ``cls``.
    """
    namespace: dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    for name, names in expanded.items():
        func = inspect.getattr_static(cls, name)
        namespace[name] = _hidden(func)
        for config_name in names:
            namespace[config_name] = func
    return _subclass_quietly(cls, namespace)


def _subclass_quietly(cls: type, namespace: dict[str, Any]) -> type:
    """``type(cls.__name__, (cls,), namespace)`` without the user's class machinery.

    The subclass is an implementation detail of the matrix: the class hooks of
    ``cls`` and its bases (``__init_subclass__``, a metaclass's ``__new__`` and
    ``__init__``) must not run for it, or registries would record the class
    twice and hooks with required keywords would fail. ``__init_subclass__`` is
    shadowed on ``cls`` while the subclass is made; a metaclass other than
    ``type`` and ``abc.ABCMeta`` (which has no user hooks) is bypassed by
    calling ``type.__new__`` with it.
    """
    import abc

    meta = type(cls)
    sentinel = object()
    own = cls.__dict__.get("__init_subclass__", sentinel)
    type.__setattr__(cls, "__init_subclass__", classmethod(_no_init_subclass))
    try:
        if meta in (type, abc.ABCMeta):
            return meta(cls.__name__, (cls,), namespace)
        return type.__new__(meta, cls.__name__, (cls,), namespace)
    finally:
        if own is sentinel:
            type.__delattr__(cls, "__init_subclass__")
        else:
            type.__setattr__(cls, "__init_subclass__", own)


def _no_init_subclass(cls: type, /, **kwargs: object) -> None:
    """Stands in for the user's ``__init_subclass__`` while the matrix subclass is made."""
