"""Per-test isolation of torch backend flags, and the leak guard.

The reference is torch's state **the moment torch finished importing**: an
import hook takes that snapshot before any user code can change a flag, so
the guard works whoever imports torch (a test, a fixture, a conftest.py or a
test module), and a suite that never imports torch never pays for it.

From there the state is followed through the session:

* changes made while a ``conftest.py`` (or plugin) is imported or configured
  become the suite's baseline, listed after collection with the file that
  made them;
* changes made while a test module is imported belong to that module: they
  are applied around each of its own tests (as a module-scoped autouse fixture
  would) and undone for every other module's tests, whatever the collection
  order; they are reported once, as a warning naming the module;
* around every test the flags are compared before setup and after teardown; a
  test that leaves one changed is reported with ``before -> after`` and the
  state is put back.  A fixture owns what it changes for its scope and is
  reported, once, naming it, if the change outlives its teardown;
* changes made while no test runs (a stray thread, a hook) are reported before
  the next test, or at session end after the last one.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_backends import _keys, _options

__all__ = [
    "ITEM_FLAGS_KEY",
    "LEAK_MODES",
    "WATCH",
    "BackendsLeakWarning",
    "FlagSetter",
    "IsolationPlugin",
    "LeakSettings",
    "TorchStateWatch",
    "marker_mode",
    "parse_leak_mode",
    "resolve_leak_mode",
    "watch_torch",
]

LEAK_MODES = ("fail", "warn", "off")

#: Flags to apply around one item's setup, call and teardown (see :mod:`pytest_backends._keys`).
ITEM_FLAGS_KEY = _keys.ITEM_FLAGS_KEY

_SETUP_ERROR_KEY = _keys.SETUP_ERROR_KEY
_DRIFT_KEY = _keys.DRIFT_KEY
#: what a pytest-xdist worker sends back to the controller (workeroutput key)
_WORKER_OUTPUT = "pytest_backends_isolation"
_HOOK_SOURCE = "a hook of a conftest.py or plugin"


class BackendsLeakWarning(pytest.PytestWarning):
    """A torch backend flag was left changed (``--backends-leaks=warn``)."""


@dataclass(frozen=True)
class LeakSettings:
    """The resolved ``--backends-leaks`` mode."""

    mode: str


def parse_leak_mode(value: str, source: str) -> str:
    """Validate a leak mode; ``source`` names where it came from for the error."""
    mode = value.strip().lower()
    if _options.is_off(mode):
        return "off"
    if mode not in LEAK_MODES:
        raise pytest.UsageError(
            f"{source}: invalid value {value!r}; choose one of {', '.join(LEAK_MODES)}"
        )
    return mode


def resolve_leak_mode(config: pytest.Config) -> LeakSettings:
    """Resolve the leak mode once: command line wins over ini."""
    raw = _options.lookup(config, "backends_leaks")
    return LeakSettings(parse_leak_mode(raw.text or "fail", raw.source))


def _safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not break the error message
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 120 else text[:117] + "..."


def marker_mode(node: pytest.Item | pytest.Collector, default: str) -> tuple[str, str | None]:
    """The leak mode for ``node``: its closest ``backends_leaks`` marker, else ``default``.

    Never raises: a malformed marker gives ``(default, message)`` so that the
    caller can fail that one test and let every other test run.
    """
    marker = node.get_closest_marker("backends_leaks")
    if marker is None:
        return default, None
    args = marker.args
    if (
        not marker.kwargs
        and len(args) == 1
        and isinstance(args[0], str)
        and args[0].strip().lower() in LEAK_MODES
    ):
        return args[0].strip().lower(), None
    given = ", ".join(
        [_safe_repr(a) for a in args] + [f"{k}={_safe_repr(v)}" for k, v in marker.kwargs.items()]
    )
    return default, (
        f"@pytest.mark.backends_leaks takes one mode, one of {', '.join(map(repr, LEAK_MODES))} "
        f'(for example @pytest.mark.backends_leaks("warn")); got backends_leaks({given})'
    )


def _warn(message: str) -> None:
    """Warn; where warnings are errors (-W error), fail the current phase cleanly."""
    try:
        warnings.warn(BackendsLeakWarning(message), stacklevel=1)
    except Warning as exc:
        error = f"{type(exc).__name__} (warnings are errors here): {exc}"
    else:
        return
    pytest.fail(error, pytrace=False)


@functools.cache
def _registry() -> Any:
    # flags imports nothing heavy itself; the registry imports torch on first use
    from pytest_backends.flags import registry

    return registry()


def _lines(diff: Mapping[str, tuple[object, object]]) -> str:
    from pytest_backends.flags import format_diff

    return format_diff(diff)


def _fixture_label(fixturedef: Any) -> str:
    where = getattr(fixturedef, "baseid", "") or getattr(
        getattr(fixturedef, "func", None), "__module__", "a plugin"
    )
    return f"fixture {fixturedef.argname!r} ({fixturedef.scope} scope, defined in {where})"


@dataclass
class _Change:
    """Flags changed by one source outside any test (a conftest, a test module)."""

    source: str
    diff: dict[str, tuple[object, object]]


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch`` like the other finders do, and calls back once it has executed."""

    def __init__(self, on_loaded: Callable[[], None]) -> None:
        self._on_loaded = on_loaded
        self._busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec
        on_loaded = self._on_loaded

        def exec_then_snapshot(module: types.ModuleType) -> None:
            exec_module(module)
            on_loaded()

        # An instance attribute on this spec's own loader: module.__loader__ stays
        # torch's real loader.  An unusual loader that refuses it just means the
        # snapshot is taken when the guard first looks.
        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_then_snapshot  # type: ignore[union-attr]
        found: importlib.machinery.ModuleSpec = spec
        return found


class TorchStateWatch:
    """torch's state from the moment torch finished importing, and the suite's baseline.

    One per process, because torch's state is per process.  ``baseline`` is
    the import-time state plus what conftest files and plugins changed before
    the first test; ``baseline_changes`` says who changed what.
    """

    def __init__(self) -> None:
        self.import_state: dict[str, object] | None = None
        self.baseline: dict[str, object] = {}
        self.baseline_fp: tuple[object, ...] | None = None
        self.baseline_changes: list[_Change] = []
        self.error: str | None = None
        self.settled = False  # set when the first test starts: no more baseline changes
        self.rootpath: Path | None = None
        # threads that exist before any conftest runs (pytest's, xdist's): never suspects
        self.infra_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet(
            threading.enumerate()
        )
        self._finder: _TorchFinder | None = None

    def install(self, rootpath: Path | None) -> None:
        """Take the snapshot now if torch is loaded, else when it finishes importing."""
        if rootpath is not None and self.rootpath is None:
            self.rootpath = rootpath
        if self.import_state is not None or self._finder is not None:
            return
        if "torch" in sys.modules:
            self._snapshot()
            return
        self._finder = _TorchFinder(self._loaded)
        sys.meta_path.insert(0, self._finder)

    def _loaded(self) -> None:
        finder, self._finder = self._finder, None
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
        self._snapshot()

    def _snapshot(self) -> None:
        if self.import_state is not None:
            return
        try:
            reg = _registry()
            fp = reg.fingerprint()
        except Exception as exc:  # never break `import torch` for the user
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.import_state = reg.to_plain(fp)
        self.baseline, self.baseline_fp = dict(self.import_state), fp

    def ready(self) -> bool:
        """Whether torch is loaded and its import-time state known."""
        if self.import_state is None and "torch" in sys.modules and self.error is None:
            torch = sys.modules["torch"]
            spec = getattr(torch, "__spec__", None)
            if not getattr(spec, "_initializing", False):
                self._snapshot()  # torch came in without the hook (installed late)
        return self.import_state is not None

    def checkpoint(self, source: str) -> None:
        """Adopt any change since the last checkpoint into the baseline, naming ``source``."""
        if self.settled or not self.ready():
            return
        reg = _registry()
        fp = reg.fingerprint()
        if fp == self.baseline_fp:
            return
        current = reg.to_plain(fp)
        diff = reg.diff(self.baseline, current)
        self.baseline, self.baseline_fp = current, fp
        if diff:
            self.baseline_changes.append(_Change(source, diff))

    def source_of(self, plugin: object) -> str | None:
        """A readable source for a registered plugin module (conftest paths relative)."""
        if not isinstance(plugin, types.ModuleType):
            return None
        file = getattr(plugin, "__file__", None)
        if not file:
            return f"plugin {plugin.__name__}"
        if self.rootpath is not None:
            try:
                return os.path.relpath(file, self.rootpath)
            except ValueError:  # another drive on Windows
                pass
        return str(file)

    def baseline_lines(self) -> list[str]:
        """One line per source whose changes are still in the baseline."""
        if self.import_state is None:
            return []
        by_source: dict[str, list[str]] = {}
        for change in self.baseline_changes:
            for name in change.diff:
                for other in by_source.values():
                    other[:] = [e for e in other if not e.startswith(f"{name}=")]
                value = self.baseline.get(name)
                if value != self.import_state.get(name):
                    by_source.setdefault(change.source, []).append(f"{name}={value}")
        return [
            f"session baseline differs from torch defaults: {', '.join(entries)} ({source})"
            for source, entries in by_source.items()
            if entries
        ]

    # -- hooks (the watch is registered as a plugin before conftests load) --

    def pytest_plugin_registered(self, plugin: object) -> None:
        """A conftest (or plugin module) was imported: its changes become the baseline."""
        source = self.source_of(plugin)
        if source is not None:
            self.checkpoint(source)

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        """Changes made by pytest_configure hooks of conftests and plugins."""
        self.checkpoint(_HOOK_SOURCE)


#: The process's watch.  Module state on purpose: torch's flags are per
#: process, and the import hook must exist before any conftest imports torch.
WATCH = TorchStateWatch()


def watch_torch(config: pytest.Config) -> TorchStateWatch:
    """Install the import hook (idempotent); the watch, for ``plugin.py`` to register."""
    WATCH.install(getattr(config, "rootpath", None))
    return WATCH


@dataclass
class _Owned:
    """Flags a fixture changed during its setup."""

    label: str
    scope: str
    before: dict[str, object]
    mode: str
    # the between-tests values of those flags before the fixture (without the
    # import-time flags of the module whose test set it up)
    ambient_before: dict[str, object] = field(default_factory=dict)


@dataclass
class _ItemState:
    item: pytest.Item
    mode: str
    # None while torch is not loaded: the reference is then the baseline
    expected: dict[str, object] | None
    expected_fp: tuple[object, ...] | None
    # (name, origin) of threads alive when the test started that may change flags
    threads: list[tuple[str, str]] = field(default_factory=list)
    # the state right after the teardown check: anything later is not the test's
    checked_fp: tuple[object, ...] | None = None


class IsolationPlugin:
    """Applies per-item flags, restores state and reports leaks."""

    def __init__(self, settings: LeakSettings, watch: TorchStateWatch | None = None) -> None:
        self.settings = settings
        self.watch = WATCH if watch is None else watch
        # A session started inside a running one (pytester's inline runs) finds
        # torch's state owned by the enclosing session: its reference is the
        # state it starts with, not the enclosing session's baseline.
        self._nested = self.watch.settled
        self._ambient: dict[str, object] | None = None
        self._ambient_fp: tuple[object, ...] | None = None
        self._current: _ItemState | None = None
        # flags each test module set while imported (by the module's node id)
        self._module_flags: dict[str, dict[str, object]] = {}
        self._owned: dict[Any, _Owned] = {}
        # fixture leaks waiting for the teardown of the test that finalised them
        self._pending: list[tuple[str, str]] = []
        # summary sections (title -> messages) and whether any of them fails the run
        self._sections: dict[str, list[str]] = {}
        self._fails_run = False
        self._previous: str | None = None
        # changes made after a test's teardown check (logreport/logfinish hooks,
        # threads): reported before the next test or at session end
        self._late: list[tuple[str, dict[str, tuple[object, object]]]] = []
        self._threads: weakref.WeakKeyDictionary[threading.Thread, str] = (
            weakref.WeakKeyDictionary()
        )
        self._suite_threads: weakref.WeakKeyDictionary[threading.Thread, str | None] = (
            weakref.WeakKeyDictionary()
        )

    # -- bookkeeping ------------------------------------------------------

    def _ensure_ambient(self) -> dict[str, object]:
        if self._ambient is None:
            if self._nested:
                reg = _registry()
                self._ambient_fp = reg.fingerprint()
                self._ambient = reg.to_plain(self._ambient_fp)
            else:
                self._ambient = dict(self.watch.baseline)
                self._ambient_fp = self.watch.baseline_fp
        return self._ambient

    def _restore(self, reg: Any, state: Mapping[str, object]) -> None:
        try:
            reg.restore(state)
        except Exception as exc:  # report, never crash the run
            self._add("torch backend flags that could not be restored", str(exc), fails=True)

    @contextlib.contextmanager
    def _unchecked_on_error(self, where: str) -> Iterator[None]:
        """Report the guard's own failure in the summary instead of raising it."""
        try:
            yield
        except Exception as exc:
            self._add(
                "torch backend flags that could not be checked",
                f"{where}: {type(exc).__name__}: {exc}",
                fails=False,
            )

    def _add(self, title: str, message: str, fails: bool) -> None:
        messages = self._sections.setdefault(title, [])
        if message not in messages:
            messages.append(message)
        self._fails_run = self._fails_run or fails

    def _suspect_threads(self) -> list[tuple[str, str]]:
        """Threads that may change flags behind a test's back, with where they came from.

        A thread an earlier test started, or one running code of the suite
        itself (a conftest.py, a helper module); not the threads of pytest and
        its plugins.
        """
        current = threading.current_thread()
        suspects = []
        for thread in threading.enumerate():
            if thread is current or thread in self.watch.infra_threads:
                continue
            origin = self._threads.get(thread) or self._suite_origin(thread)
            if origin is not None:
                suspects.append((thread.name, origin))
        return suspects

    def _suite_origin(self, thread: threading.Thread) -> str | None:
        """ "outside any test (running <code>)" for a thread running the suite's code."""
        if thread not in self._suite_threads:
            func = getattr(thread, "_target", None) or type(thread).run
            code = getattr(func, "__code__", None)
            name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
            in_suite = code is not None and self._in_rootdir(code.co_filename)
            self._suite_threads[thread] = f"outside any test (running {name})" if in_suite else None
        return self._suite_threads[thread]

    def _in_rootdir(self, file: str) -> bool:
        root = self.watch.rootpath
        if not file or root is None or "site-packages" in file:
            return False
        try:
            return Path(file).resolve().is_relative_to(root.resolve())
        except (OSError, ValueError):
            return False

    @staticmethod
    def _thread_hint(threads: list[tuple[str, str]], when: str = "during this test") -> str:
        if not threads:
            return ""
        lines = "".join(
            f"\n  thread {name!r}, started {origin}, was running {when}" for name, origin in threads
        )
        return f"\nFlags are process-global, so another thread may have made this change:{lines}"

    # -- collection: what conftests and test modules change while imported --

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, object, object]:
        if not isinstance(collector, pytest.File):
            return (yield)
        self.watch.checkpoint(_HOOK_SOURCE)
        report = yield
        with self._unchecked_on_error(collector.nodeid):  # never break collection
            self._check_import(collector)
        return report

    def _check_import(self, collector: pytest.Collector) -> None:
        watch = self.watch
        if watch.settled or not watch.ready():
            return
        reg = _registry()
        fp = reg.fingerprint()
        if fp == watch.baseline_fp:
            return
        diff = reg.diff(watch.baseline, reg.to_plain(fp))
        if not diff:
            return
        mode, _error = marker_mode(collector, self.settings.mode)
        if mode == "off":
            # not guarded: nothing restores, so the change is the baseline from now on
            watch.checkpoint(f"{collector.nodeid} (import, not checked)")
            return
        # What a module sets while imported is what it means for its own tests
        # (like a module-scoped autouse fixture): those tests run under it,
        # every other module's tests under the baseline, whatever the order.
        self._module_flags[collector.nodeid] = {name: a for name, (_b, a) in diff.items()}
        self._restore(reg, watch.baseline)
        watch.baseline_fp = reg.fingerprint()
        self._add(
            "torch backend flags set while importing test modules (warning)",
            f"{collector.nodeid} changed torch backend flags while it was imported:\n"
            f"{_lines(diff)}\n"
            "pytest imports every test module before running any test, so these flags would "
            "also reach the tests of every module collected after it. pytest-backends applies "
            "them to this module's own tests only and restores the baseline for every other "
            "module's tests. To make this explicit, set them in a fixture (scope='module', "
            "autouse=True) with pytest_backends.override_flags(), or in conftest.py to make "
            "them the suite's baseline.",
            fails=False,
        )

    def _module_flags_of(self, item: pytest.Item) -> dict[str, object] | None:
        """The flags ``item``'s module set while it was imported, if any."""
        if not self._module_flags:
            return None
        node: Any = item
        while node is not None:
            if isinstance(node, pytest.File):
                return self._module_flags.get(node.nodeid)
            node = node.parent
        return None

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        """The suite's baseline, when conftest files or plugins changed torch's defaults."""
        self.watch.checkpoint(_HOOK_SOURCE)
        return [f"pytest-backends: {line}" for line in self.watch.baseline_lines()]

    # -- around each test -------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        flags = item.stash.get(ITEM_FLAGS_KEY, None)
        mode, marker_error = marker_mode(item, self.settings.mode)
        if marker_error:
            item.stash[_SETUP_ERROR_KEY] = f"{item.nodeid}: {marker_error}"
        if not flags and mode == "off" and self.settings.mode == "off":
            return (yield)
        threads_before = set(threading.enumerate())
        try:
            state: _ItemState | None = self._begin(item, flags, mode)
        except Exception as exc:  # a broken registry fails this test, not the run
            item.stash[_SETUP_ERROR_KEY] = (
                f"pytest-backends could not read torch backend flags: {type(exc).__name__}: {exc}"
            )
            state = None
        self._current = state
        try:
            return (yield)
        finally:
            self._current = None
            self._previous = item.nodeid
            for thread in set(threading.enumerate()) - threads_before:
                self._threads[thread] = f"by {item.nodeid}"
            if state is not None:
                self._end(item, state)

    # trylast: inside pytest's capture wrapper, which points fd 1 at its own file
    # when the call starts; the primitive log must redirect fd 1 after it.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        """Under a reduced oneDNN precision, capture oneDNN's primitive log during the call.

        The tolerance model then bounds each result by the precision of the
        kernel that computed it (``pytest_backends.tolerance.kernel_precision``),
        not by the flag's worst case.  About 0.3 ms a test; only for items whose
        flags set ``fp32_precision`` to ``bf16`` or ``tf32``.
        """
        flags = item.stash.get(ITEM_FLAGS_KEY, None)
        if not flags or not _reduces_onednn_precision(flags):
            return (yield)
        from pytest_backends import kernels

        if kernels.active_log() is not None:  # --backends-verify or the test captures already
            return (yield)
        log = kernels.PrimitiveLog()
        started = log.start()
        try:
            return (yield)
        finally:
            if started:
                log.stop()

    def _begin(
        self,
        item: pytest.Item,
        flags: Mapping[str, object] | None,
        mode: str,
    ) -> _ItemState:
        watch = self.watch
        if flags and not watch.ready():
            _registry()  # imports torch; the import hook takes the snapshot
            watch.ready()
        if not watch.settled:
            watch.checkpoint(_HOOK_SOURCE)
            watch.settled = True
        strays = self._suspect_threads()
        if not watch.ready():
            return _ItemState(item, mode, None, None, strays)
        reg = _registry()
        self._check_drift(reg, item)
        expected_fp, expected = self._ambient_fp, dict(self._ensure_ambient())
        module_flags = self._module_flags_of(item)
        if module_flags:
            # a module-, package- or session-scoped fixture set up after the import
            # owns what it changed since, as it would without the plugin
            baseline = watch.baseline
            module_flags = {
                name: value
                for name, value in module_flags.items()
                if expected.get(name) == baseline.get(name)
            }
        if module_flags:
            self._restore(reg, module_flags)
            expected_fp = reg.fingerprint()
            expected = reg.to_plain(expected_fp)
        if flags:
            try:
                reg.apply(reg.validate(flags))
                expected_fp = reg.fingerprint()
                expected = reg.to_plain(expected_fp)
            except ValueError as exc:
                self._restore(reg, self._ensure_ambient())
                item.stash[_SETUP_ERROR_KEY] = f"cannot apply backend flags: {exc}"
        return _ItemState(item, mode, expected, expected_fp, strays)

    def _check_drift(self, reg: Any, item: pytest.Item) -> None:
        """Flags changed while no test ran, e.g. by a thread an earlier test started."""
        ambient = self._ensure_ambient()
        fp = reg.fingerprint()
        drift: dict[str, tuple[object, object]] = {}
        if fp != self._ambient_fp:
            drift = reg.diff(ambient, reg.to_plain(fp))
            self._restore(reg, ambient)
            self._ambient_fp = reg.fingerprint()
        text = self._late_text(drift)
        if self.settings.mode == "off" or not text:
            return
        # Emitted in the setup phase, where pytest records warnings per test (and
        # where -W error makes it that test's error, never an INTERNALERROR).
        item.stash[_DRIFT_KEY] = (
            f"torch backend flags changed between tests (before {item.nodeid} started):\n"
            f"{text}\n"
            "No test was running, so the change came from another thread (for example "
            "one an earlier test started and did not join) or from a plugin hook. "
            "The flags were restored. Flags are process-global: join threads that "
            "change them before the test ends."
            + self._thread_hint(self._suspect_threads(), "at that time")
        )

    def _end(self, item: pytest.Item, state: _ItemState) -> None:
        if not self.watch.ready():
            return
        if state.checked_fp is not None and state.checked_fp == self._ambient_fp:
            # The test ran under the between-tests state and left it so: there is
            # nothing to restore, and a change made from here on is found by the
            # next boundary (the next test's drift check, or the session's end),
            # which reports it as made "after <this test> finished" as well.
            return
        reg = _registry()
        ambient = self._ensure_ambient()
        fp = reg.fingerprint()
        if state.checked_fp is not None and fp != state.checked_fp:
            late = reg.diff(reg.to_plain(state.checked_fp), reg.to_plain(fp))
            if late and self.settings.mode != "off":
                self._late.append((f"after {item.nodeid} finished", late))
        if self._ambient_fp is None or fp != self._ambient_fp:
            self._restore(reg, ambient)
            self._ambient_fp = reg.fingerprint()

    def _late_text(self, drift: Mapping[str, tuple[object, object]]) -> str:
        """Changes made after earlier tests' checks, then ``drift``, one block each."""
        blocks = [f"{when}:\n{_lines(diff)}" for when, diff in self._late]
        self._late = []
        if drift:
            after = f"after {self._previous} finished" if self._previous else "before any test"
            blocks.append(f"{after}:\n{_lines(drift)}")
        return "\n".join(blocks)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Report drift found before this test, and errors that belong to this test."""
        drift = item.stash.get(_DRIFT_KEY, None)
        if drift is not None:
            _warn(drift)
        error = item.stash.get(_SETUP_ERROR_KEY, None)
        if error is not None:
            pytest.fail(error, pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        state = self._current
        if state is None:
            return (yield)
        before_fp = _registry().fingerprint() if self.watch.ready() else None
        result = yield
        with self._unchecked_on_error(_fixture_label(fixturedef)):  # never break the fixture
            self._own(fixturedef, state, before_fp)
        return result

    def _own(
        self, fixturedef: Any, state: _ItemState, before_fp: tuple[object, ...] | None
    ) -> None:
        if not self.watch.ready():
            return
        reg = _registry()
        after_fp = reg.fingerprint()
        if after_fp == before_fp:
            return
        before = reg.to_plain(before_fp) if before_fp is not None else dict(self.watch.baseline)
        delta = reg.diff(before, reg.to_plain(after_fp))
        if not delta:
            return
        # A function-scoped fixture is part of its test; a wider one is judged by
        # the session's mode, never by the marker of whichever test set it up.
        mode = state.mode if fixturedef.scope == "function" else self.settings.mode
        ambient = self._ensure_ambient()
        self._owned[fixturedef] = _Owned(
            _fixture_label(fixturedef),
            fixturedef.scope,
            {name: b for name, (b, _a) in delta.items()},
            mode,
            {name: ambient.get(name) for name in delta},
        )
        after = {name: a for name, (_b, a) in delta.items()}
        if fixturedef.scope != "function":
            self._ensure_ambient().update(after)
            self._ambient_fp = None
        if state.expected is None:
            state.expected = dict(self._ensure_ambient())
        state.expected.update(after)
        state.expected_fp = None

    def pytest_fixture_post_finalizer(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> None:
        owned = self._owned.pop(fixturedef, None)
        if owned is None:
            return
        with self._unchecked_on_error(owned.label):  # never break teardown
            self._finalized(owned)

    def _finalized(self, owned: _Owned) -> None:
        reg = _registry()
        current = reg.snapshot()
        leaked = {
            name: (before, current.get(name))
            for name, before in owned.before.items()
            if current.get(name) != before
        }
        if leaked:
            self._restore(reg, owned.before)
            message = (
                f"{owned.label} changed torch backend flags and did not restore them "
                f"in its teardown:\n{_lines(leaked)}\n"
                "Restore them after the fixture's yield, or set them inside "
                "pytest_backends.override_flags(), which always restores."
            )
            if owned.mode != "off" and owned.scope == "function":
                self._pending.append((owned.mode, message))  # part of its test
            elif owned.mode != "off":
                # Not an error of whichever test happened to finalise the scope
                # (that depends on the order): once per fixture and change, in the
                # summary, and the run fails under "fail".
                self._add(
                    "torch backend flags leaked by fixtures", message, fails=owned.mode == "fail"
                )
        if owned.scope != "function":
            self._ensure_ambient().update(owned.ambient_before)
            self._ambient_fp = None
        state = self._current
        if state is not None and state.expected is not None:
            state.expected.update(owned.before)
            state.expected_fp = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        try:
            result = yield
        except BaseException:
            found = self._check(item)
            text = "\n\n".join(found["fail"] + found["warn"])
            if text:
                item.add_report_section("teardown", "torch backend flags leaked", text)
            raise
        found = self._check(item)
        fail, warn = found["fail"], found["warn"]
        # pytest would turn a teardown error of an xfail test into one more
        # "xfailed", hiding the leak; a warning stays visible.
        if fail and item.get_closest_marker("xfail") is not None:
            fail, warn = [], fail + warn
        if fail:
            if warn:
                item.add_report_section(
                    "teardown", "torch backend flags leaked (warn)", "\n\n".join(warn)
                )
            pytest.fail("\n\n".join(fail), pytrace=False)
        for message in warn:
            _warn(message)
        return result

    def _check(self, item: pytest.Item) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {"fail": [], "warn": [], "off": []}
        pending, self._pending = self._pending, []
        for mode, message in pending:
            found[mode].append(message)
        state = self._current
        if state is None or not self.watch.ready():
            return found
        checked: tuple[object, ...] | None = None
        try:
            checked = self._check_test(item, state, found)
        except Exception as exc:  # report, never crash the run
            found["fail"].append(
                f"pytest-backends could not check torch backend flags: {type(exc).__name__}: {exc}"
            )
        if checked is None:
            with contextlib.suppress(Exception):
                checked = _registry().fingerprint()
        state.checked_fp = checked
        return found

    def _check_test(
        self, item: pytest.Item, state: _ItemState, found: dict[str, list[str]]
    ) -> tuple[object, ...] | None:
        """Report what the test left changed; the state it leaves, if that is ``fp``.

        Returns the fingerprint taken after teardown when nothing was restored
        (the caller keeps it as the state the test handed back), else None.
        """
        if state.mode == "off":
            return None
        reg = _registry()
        fp: tuple[object, ...] = reg.fingerprint()
        if state.expected_fp is not None and fp == state.expected_fp:
            return fp
        expected = state.expected
        if expected is None:
            expected = dict(self._ensure_ambient())
        leaked = reg.diff(expected, reg.to_plain(fp))
        if not leaked:
            return fp
        self._restore(reg, expected)
        found[state.mode].append(
            f"{item.nodeid} left torch backend flags changed:\n{_lines(leaked)}\n"
            "They were restored for the next test. Restore them in the test "
            "(try/finally), or set them with the backend_flags fixture or "
            "pytest_backends.override_flags(), which always restore."
            + self._thread_hint(state.threads)
        )
        return None

    # -- session end ------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """After the last fixture's teardown: late changes, leftovers, the exit status."""
        with self._unchecked_on_error("at session end"):  # never an INTERNALERROR
            self._finish(session)
        config = session.config
        workeroutput = getattr(config, "workeroutput", None)
        if isinstance(workeroutput, dict):
            workeroutput[_WORKER_OUTPUT] = {
                "sections": {k: list(v) for k, v in self._sections.items()},
                "baseline": self.watch.baseline_lines(),
                "fails": self._fails_run,
            }
        elif self._fails_run and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _finish(self, session: pytest.Session) -> None:
        for mode, message in self._pending:
            self._add("torch backend flags leaked by fixtures", message, fails=mode == "fail")
        self._pending = []
        if (
            self.settings.mode == "off"
            or not self.watch.ready()
            # a pytest-xdist controller runs no test: its flags reach none
            or session.config.pluginmanager.has_plugin("dsession")
        ):
            return
        reg = _registry()
        reference = self._ensure_ambient()
        fp = reg.fingerprint()
        late: dict[str, tuple[object, object]] = {}
        if fp != self._ambient_fp:
            late = reg.diff(reference, reg.to_plain(fp))
            self._restore(reg, reference)
        text = self._late_text(late)
        if not text:
            return
        self._add(
            "torch backend flags changed after the last test",
            f"torch backend flags changed while no test was running:\n{text}\n"
            "They were restored at session end. A thread or a hook (pytest_runtest_logfinish, "
            "pytest_sessionfinish, ...) changed them; join threads that change flags and "
            "restore what hooks change."
            + self._thread_hint(self._suspect_threads(), "at session end"),
            fails=self.settings.mode == "fail",
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """pytest-xdist controller: gather what a worker found outside its tests."""
        output = getattr(node, "workeroutput", None)
        data = output.get(_WORKER_OUTPUT) if isinstance(output, dict) else None
        if not isinstance(data, dict):
            return
        for title, messages in dict(data.get("sections", {})).items():
            for message in messages:
                self._add(str(title), str(message), fails=False)
        for line in data.get("baseline", []):
            self._add("torch backend flags: session baseline", str(line), fails=False)
        self._fails_run = self._fails_run or bool(data.get("fails"))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Everything found outside a test's own report."""
        if self.watch.error is not None and self.settings.mode != "off":
            self._add(
                "torch backend flags were not checked",
                f"pytest-backends could not read torch's flags when torch was imported "
                f"({self.watch.error}); the leak guard was off for this run.",
                fails=False,
            )
        for title, messages in self._sections.items():
            terminalreporter.section(title, sep="=")
            for message in messages:
                terminalreporter.line(message)
        if self._fails_run:
            terminalreporter.line(
                "pytest-backends: the run fails because of the torch backend flag changes "
                "above (--backends-leaks=fail)."
            )


def _reduces_onednn_precision(flags: Mapping[str, object]) -> bool:
    """Whether ``flags`` let oneDNN compute fp32 ops in a reduced precision."""
    return any(
        (name == "fp32_precision" or (name.startswith("mkldnn.") and "fp32_precision" in name))
        and value in ("bf16", "tf32")
        for name, value in flags.items()
    )


@dataclass
class FlagSetter:
    """The value of the ``backend_flags`` fixture: set flags, restored at teardown."""

    _before: dict[str, object] | None = field(default=None, repr=False)

    def set(self, mapping: Mapping[str, object]) -> None:
        """Validate and apply ``mapping``; raises ``ValueError`` and changes nothing if invalid."""
        reg = _registry()
        normalised = reg.validate(mapping)
        before = reg.snapshot()
        if self._before is None:
            self._before = before
        try:
            reg.apply(normalised)
        except ValueError:
            reg.restore(before)
            raise

    def get(self, name: str) -> object:
        """The current plain value of one flag."""
        reg = _registry()
        if name not in reg.by_name:
            reg.validate({name: None})
        row = reg.by_name[name]
        return row.plain(row.read())

    def snapshot(self) -> dict[str, object]:
        """All flags as plain values."""
        return dict(_registry().snapshot())

    def close(self) -> None:
        """Restore the state from before the first :meth:`set`."""
        if self._before is not None:
            before, self._before = self._before, None
            _registry().restore(before)
