"""Which fixture's teardown changed which flags.

Function scope
--------------

A flag a fixture changes after its ``yield`` (or in a finalizer) is found at
the end of the test's teardown, like one the test body left changed. The
guard tells them apart by a fingerprint when the teardown phase begins and
one after each such fixture is finalized: a change between two of them is
that fixture's. Only fixtures with teardown code are followed, so a test
whose fixtures have none pays nothing.

Wider scopes
------------

Which test finalises a wider scope depends on the order, so what such a
fixture leaves changed then is the fixture's, never the error of the test
that closed the scope, and never hidden by that test's ``backends_leaks``
marker: it is judged by the session's mode and reported once, naming the
fixture.  Two kinds of change are followed:

* a flag the fixture changed in its setup (it owns it for its scope) must be
  back to its value from before the fixture when the fixture is finalized;
* a flag its teardown changes (after its ``yield``, in a finalizer,
  unittest's ``tearDownClass``, xunit's ``teardown_module``) must be put back
  by that teardown.  Only fixtures with teardown code are followed: the guard
  adds a finalizer to such a fixture when it is set up, which pytest runs
  first when it finalizes the fixture (a fixture's finalizers run last in,
  first out), and which takes the fingerprint the teardown's changes are
  measured from.  Nothing runs per test: one fingerprint before and one after
  each such finalization.

Flags the plugin applied for the test that set the fixture up (a matrix
configuration, a test module's import-time flags) are the test's, not the
fixture's: a teardown that puts one of them back (``override_flags()``
restores every flag it saw on entry) is restoring the fixture's own state, so
the guard puts back the value from before that teardown, silently: the
configuration never outlives its tests and no test is blamed for it.

Importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_backends.isolation.watch import WATCH

__all__ = [
    "Followed",
    "Owned",
    "TeardownOwners",
    "WiderFixtures",
    "fixture_label",
    "has_teardown",
    "is_parameter",
    "leak_messages",
    "settle",
    "teardown_messages",
]


#: The fixtures pytest makes to run xunit-style and unittest setup and teardown code, by
#: the start of their names: the setup and the teardown names pytest looks for, in its
#: order, paired by spelling (``setUpModule`` goes with ``tearDownModule``).
_XUNIT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "_unittest_setUpClass_fixture_": (("setUpClass",), ("tearDownClass",)),
    "_unittest_setup_method_fixture_": (("setup_method",), ("teardown_method",)),
    "_xunit_setup_module_fixture_": (
        ("setUpModule", "setup_module"),
        ("tearDownModule", "teardown_module"),
    ),
    "_xunit_setup_class_fixture_": (("setup_class",), ("teardown_class",)),
    "_xunit_setup_function_fixture_": (("setup_function",), ("teardown_function",)),
    "_xunit_setup_method_fixture_": (("setup_method",), ("teardown_method",)),
}


def _users(name: str, value: object) -> bool:
    """Whether ``value``, found under ``name``, is code of the user's that pytest runs."""
    if value is None:
        return False
    # pytest skips a function under one of these names that is a fixture (pytest >= 8.4
    # marks it with the first attribute, older versions with the second).
    if any(hasattr(value, a) for a in ("_fixture_function_marker", "_pytestfixturefunction")):
        return False
    # unittest.TestCase's own no-op setUpClass/tearDownClass, inherited, are nobody's code.
    unittest = sys.modules.get("unittest")
    base = vars(getattr(unittest, "TestCase", object)).get(name)
    return base is None or getattr(value, "__func__", value) is not getattr(base, "__func__", base)


def _defined(fixturedef: Any, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that the fixture's module or class defines, as pytest looks."""
    owner = getattr(getattr(fixturedef, "node", None), "obj", None)
    if owner is not None:
        for name in names:
            try:
                value = getattr(owner, name, None)
            except Exception:  # a user's descriptor may raise; then it is not the one
                continue
            if _users(name, value):
                return name
        return None
    # Before pytest 9.1 a fixture knows no node: pytest's function keeps what it
    # calls in its closure.
    called: dict[str, object] = {}
    for cell in getattr(getattr(fixturedef, "func", None), "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            value = cell.cell_contents
            called.setdefault(str(getattr(value, "__name__", "")), value)
    return next((n for n in names if n in called and _users(n, called[n])), None)


def _xunit_methods(fixturedef: Any, setups: tuple[str, ...], teardowns: tuple[str, ...]) -> str:
    """``setUpModule/tearDownModule``: the names the user wrote, the missing one in their style."""
    setup, teardown = _defined(fixturedef, setups), _defined(fixturedef, teardowns)
    if setup is not None:
        style = setups.index(setup)
    elif teardown is not None:
        style = teardowns.index(teardown)
    else:
        style = len(setups) - 1
    return f"{setup or setups[style]}/{teardown or teardowns[style]}"


def _defined_in(fixturedef: Any) -> str:
    """Where a fixture is defined: the node of its test module or class, else its file.

    A fixture of a test module or class is named by that node
    (``test_a.py::TestC``); one of a ``conftest.py`` by the file it is defined
    in, relative to the rootdir (its node is the directory, which names no
    file); a plugin's by its module. Every fixture setup asks, so the answer
    is kept per fixture definition.
    """
    try:
        return _WHERE[fixturedef]
    except (KeyError, TypeError):  # TypeError: not weakly referable, never kept
        pass
    func = getattr(fixturedef, "func", None)
    func = getattr(func, "__func__", func)  # a fixture defined as a method
    where = _where(
        str(getattr(fixturedef, "baseid", "") or ""),
        getattr(getattr(func, "__code__", None), "co_filename", None),
        getattr(func, "__module__", None),
    )
    with contextlib.suppress(TypeError):
        _WHERE[fixturedef] = where
    return where


_WHERE: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _where(baseid: str, file: str | None, module: str | None) -> str:
    root = WATCH.rootpath
    if "::" in baseid or baseid.endswith(".py") or not file or root is None:
        return baseid or module or "a plugin"  # a test module's or class's node
    # a directory's node (a conftest's fixture), "" at the rootdir and for plugins
    with contextlib.suppress(ValueError, OSError):  # outside the rootdir
        rel = Path(file).resolve().relative_to(Path(root).resolve()).as_posix()
        if rel.startswith(f"{baseid}/") if baseid else rel == "conftest.py":
            return rel
    return baseid or module or "a plugin"


def is_parameter(fixturedef: Any) -> bool:
    """A ``parametrize`` argument's stand-in fixture: it returns the parameter, runs no code."""
    func = getattr(fixturedef, "func", None)
    return getattr(func, "__name__", "") == "get_direct_param_fixture_func" and getattr(
        func, "__module__", ""
    ).startswith("_pytest")


def fixture_label(fixturedef: Any) -> str:
    """How reports name a fixture: its name, scope and where it is defined.

    The fixtures pytest makes to run xunit-style and unittest setup and
    teardown code are named by that code as the test module spells it
    (``setUpModule/tearDownModule``, ``setup_module/teardown_module``,
    ``setUpClass/tearDownClass``, ``setup_method/teardown_method``, ...).
    """
    where = _defined_in(fixturedef)
    argname = str(fixturedef.argname)
    if argname.startswith("_"):
        for prefix, (setups, teardowns) in _XUNIT.items():
            if argname.startswith(prefix):
                methods = _xunit_methods(fixturedef, setups, teardowns)
                return f"{methods} of {where} ({fixturedef.scope} scope, pytest's {argname!r})"
    return f"fixture {argname!r} ({fixturedef.scope} scope, defined in {where})"


def _where_to_restore(fixturedef: Any) -> str:
    """Where the user's code restores what its setup changed: a fixture's yield, or xunit's
    teardown (``teardown_method``, ``tearDownClass``, ...) as the test module spells it."""
    argname = str(fixturedef.argname)
    for prefix, (setups, teardowns) in _XUNIT.items():
        if argname.startswith(prefix):
            teardown = _xunit_methods(fixturedef, setups, teardowns).split("/")[1]
            return f"in {teardown}"
    return "after the fixture's yield"


def teardown_messages(by_fixture: Mapping[str, Mapping[str, tuple[object, object]]]) -> list[str]:
    """One leak message per fixture whose teardown left flags changed."""
    from pytest_backends.isolation.snapshot import diff_lines

    return [
        f"{label} changed torch backend flags in its teardown (after its yield, or in a "
        f"finalizer) and did not restore them:\n{diff_lines(changes)}\nThey were restored "
        "for the next test; restore them in the fixture's teardown."
        for label, changes in by_fixture.items()
    ]


def _pytest_own(finalizer: Any) -> bool:
    """pytest's own finalizer of every fixture (it forgets the cached value): no user code."""
    return (
        getattr(finalizer, "__name__", "") == "<lambda>"
        and getattr(finalizer, "__module__", "") == "_pytest.fixtures"
    )


def has_teardown(fixturedef: Any) -> bool:
    """Whether the fixture registered teardown code while it was set up (unknown: True)."""
    finalizers = getattr(fixturedef, "_finalizers", None)
    if finalizers is None:
        return True
    return any(not _pytest_own(f) for f in finalizers)


class TeardownOwners:
    """The fixtures of one test whose teardown may change flags, and what each changed."""

    def __init__(self) -> None:
        self._labels: dict[int, str] = {}
        self._checkpoint: Any = None
        #: flag name -> the label of the fixture whose teardown made its last change
        self.changed_by: dict[str, str] = {}

    def watch(self, fixturedef: Any, label: str) -> None:
        """Follow ``fixturedef``'s teardown if it is function-scoped and has one."""
        if fixturedef.scope == "function" and has_teardown(fixturedef):
            self._labels[id(fixturedef)] = label

    def follows(self, fixturedef: Any = None) -> bool:
        """Whether ``fixturedef`` (None: any fixture of the test) is followed."""
        return bool(self._labels) if fixturedef is None else id(fixturedef) in self._labels

    def begin(self, registry: Any) -> None:
        """The teardown phase begins: the state each followed fixture's change is taken from."""
        if self._labels:
            self._checkpoint = registry.fingerprint()

    def finalized(self, registry: Any, fixturedef: Any) -> None:
        """``fixturedef`` was finalized: what changed since the last checkpoint is its."""
        label = self._labels.pop(id(fixturedef), None)
        if label is None or self._checkpoint is None:
            return
        fp = registry.fingerprint()
        if fp == self._checkpoint:
            return
        before, after = registry.to_plain(self._checkpoint), registry.to_plain(fp)
        for name in registry.diff(before, after):
            self.changed_by[name] = label
        self._checkpoint = fp

    def split(
        self, leaked: Mapping[str, tuple[object, object]]
    ) -> tuple[dict[str, dict[str, tuple[object, object]]], dict[str, tuple[object, object]]]:
        """``leaked`` as ``({fixture label: its leaks}, the rest)``."""
        by_fixture: dict[str, dict[str, tuple[object, object]]] = {}
        rest: dict[str, tuple[object, object]] = {}
        for name, change in leaked.items():
            label = self.changed_by.get(name)
            if label is None:
                rest[name] = change
            else:
                by_fixture.setdefault(label, {})[name] = change
        return by_fixture, rest


@dataclass
class Owned:
    """Flags a fixture changed during its setup."""

    label: str
    scope: str
    before: dict[str, object]
    mode: str
    # the between-tests values of those flags before the fixture (without the
    # import-time flags of the module whose test set it up)
    ambient_before: dict[str, object] = field(default_factory=dict)


@dataclass
class Followed:
    """A wider fixture with teardown code, and the state its teardown starts from."""

    #: flags the plugin applied for the test that set the fixture up (not the fixture's)
    under: dict[str, object]
    #: the fingerprint taken right before its setup (every flag as it found them), if read
    found: Any = None
    #: the fingerprint taken right before its teardown code runs
    checkpoint: Any = None


class WiderFixtures:
    """The wider fixtures whose teardown the guard follows (see the module docstring)."""

    def __init__(self, fingerprint: Callable[[], Any]) -> None:
        # returns None while torch's state cannot be read
        self._fingerprint = fingerprint
        self._followed: dict[Any, Followed] = {}

    def watch(
        self,
        fixturedef: Any,
        under: Mapping[str, object],
        found: Any = None,
    ) -> None:
        """Follow ``fixturedef`` (just set up) if it is wider than a test and has teardown code.

        ``found`` is the fingerprint taken right before its setup (None: not read).
        """
        if fixturedef.scope == "function" or not has_teardown(fixturedef):
            return
        add = getattr(fixturedef, "addfinalizer", None)
        if add is None:
            return
        followed = Followed(dict(under), found)
        self._followed[fixturedef] = followed
        # added after the fixture's own teardown: pytest runs it before that teardown
        add(functools.partial(self._checkpoint, followed))

    def _checkpoint(self, followed: Followed) -> None:
        with contextlib.suppress(Exception):  # never break the fixture's teardown
            followed.checkpoint = self._fingerprint()

    def pop(self, fixturedef: Any) -> Followed | None:
        """The follow-up of ``fixturedef``, which pytest has just finalized, if followed."""
        if not self._followed:
            return None
        return self._followed.pop(fixturedef, None)


def settle(
    reg: Any,
    owned: Owned | None,
    followed: Followed | None,
    torch_own: Callable[..., dict[str, tuple[object, object]]],
    running: Mapping[str, object] | None = None,
) -> tuple[dict[str, object], dict[str, tuple[object, object]], dict[str, tuple[object, object]]]:
    """What a finalized wider fixture left: ``(to put back, setup leaks, teardown leaks)``.

    ``owned`` is what it changed in its setup, ``followed`` its teardown's
    follow-up (its checkpoint, the flags the plugin had applied for the
    test that set it up, and the flags as it found them), ``running`` the
    flags the plugin applied for the test whose teardown finalizes it, and
    ``torch_own(delta, reference)`` drops torch's own first-use settings
    from a change.
    """
    running = running or {}
    fp = reg.fingerprint()
    current = reg.to_plain(fp)
    teardown: dict[str, tuple[object, object]] = {}
    if followed is not None and followed.checkpoint is not None and fp != followed.checkpoint:
        start = reg.to_plain(followed.checkpoint)
        teardown = torch_own(reg.diff(start, current), start)
    under = followed.under if followed is not None else {}
    found = reg.to_plain(followed.found) if followed and followed.found is not None else {}
    restore: dict[str, object] = {}
    by_teardown: dict[str, tuple[object, object]] = {}
    for name, (before, after) in teardown.items():
        restore[name] = before
        if name in under and after == under[name]:
            continue  # it put back a flag the plugin had applied for the test that set it up
        if name in running and before == running[name] and name in found and after == found[name]:
            # it put back a flag as it found it, over the value the plugin applied for
            # the test that finalizes it (a later matrix configuration)
            continue
        by_teardown[name] = (before, after)
        # the running test's value is put back either way
    by_setup: dict[str, tuple[object, object]] = {}
    for name, before in (owned.before if owned is not None else {}).items():
        restore.pop(name, None)
        by_teardown.pop(name, None)
        if current.get(name) != before:
            by_setup[name] = (before, current.get(name))
            restore[name] = before
    # a precision string the legacy setters rewrote with the kernels' precision
    # unchanged is put back, and is no leak (as for a test)
    if by_setup:
        by_setup = reg.visible(by_setup, {**current, **owned.before} if owned else current, current)
    if by_teardown:
        start = {**current, **{name: b for name, (b, _a) in by_teardown.items()}}
        by_teardown = reg.visible(by_teardown, start, current)
    return restore, by_setup, by_teardown


def leak_messages(
    fixturedef: Any,
    by_setup: Mapping[str, tuple[object, object]],
    by_teardown: Mapping[str, tuple[object, object]],
) -> list[str]:
    """The messages naming the fixture (:func:`fixture_label`) for what :func:`settle` found."""
    from pytest_backends.isolation.snapshot import diff_lines

    label = fixture_label(fixturedef)
    messages = []
    if by_setup:
        messages.append(
            f"{label} changed torch backend flags and did not restore them "
            f"in its teardown:\n{diff_lines(by_setup)}\n"
            f"Restore them {_where_to_restore(fixturedef)}, or set them inside "
            "pytest_backends.override_flags(), which always restores."
        )
    if by_teardown:
        messages.append(
            f"{label} changed torch backend flags in its teardown and did not restore "
            f"them:\n{diff_lines(by_teardown)}\nThey were restored; restore them in the "
            "teardown too. Which test finalises the fixture's scope depends on the order, "
            "so this is no test's error."
        )
    return messages
