"""The leak guard's hooks: apply an item's flags, check every phase boundary, restore.

Around every test the flags are compared before setup and after teardown,
one fingerprint at each boundary: a test that leaves one changed is reported
with ``before -> after`` and the state is put back.  A fixture owns what it
changes for its scope and is reported, once, naming it, if the change
outlives its teardown.  Changes made while no test runs (a stray thread, a
hook) are reported before the next test, or at session end after the last.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from pytest_backends import _shared
from pytest_backends.isolation.findings import Findings, drift_message, warn_leak
from pytest_backends.isolation.markers import marker_mode
from pytest_backends.isolation.modules import ModuleFlags
from pytest_backends.isolation.snapshot import Fingerprint, diff_lines, registry
from pytest_backends.isolation.teardown import (
    Followed,
    Owned,
    TeardownOwners,
    WiderFixtures,
    fixture_label,
    is_parameter,
    leak_messages,
    settle,
    teardown_messages,
)
from pytest_backends.isolation.threads import ThreadOrigins
from pytest_backends.isolation.threads import hint as thread_hint
from pytest_backends.isolation.watch import HOOK_SOURCE, WATCH, TorchStateWatch, torch_own

if TYPE_CHECKING:
    from pytest_backends.isolation.settings import Settings

__all__ = ["DRIFT_KEY", "SETUP_ERROR_KEY", "IsolationPlugin"]

#: Why the guard fails an item at setup (a bad marker, flags it could not apply).
SETUP_ERROR_KEY: pytest.StashKey[str] = pytest.StashKey()
#: A change of the torch state found before an item's setup (made between tests).
DRIFT_KEY: pytest.StashKey[str] = pytest.StashKey()


@dataclass
class _ItemState:
    item: pytest.Item
    mode: str
    # None while torch is not loaded: the reference is then the baseline; may be the
    # guard's between-tests state itself, copied before the test's state departs from it
    expected: dict[str, object] | None
    expected_fp: Fingerprint | None
    # (name, origin) of threads alive when the test started that may change flags
    threads: list[tuple[str, str]] = field(default_factory=list)
    # the state right after the teardown check: anything later is not the test's
    checked_fp: Fingerprint | None = None
    teardown: TeardownOwners = field(default_factory=TeardownOwners)
    # flags the plugin applied for the test (its configuration, its module's
    # import-time flags) where they differ from the between-tests state
    applied: dict[str, object] = field(default_factory=dict)
    # what conftest hooks changed in the test's phases: (hook, phase, diff) (see .hooks)
    hooks: list[tuple[str, str, dict[str, tuple[object, object]]]] = field(default_factory=list)


class IsolationPlugin:
    """Applies per-item flags, restores state and reports leaks."""

    def __init__(self, settings: Settings, watch: TorchStateWatch | None = None) -> None:
        self.settings = settings
        self.watch = WATCH if watch is None else watch
        # A session started inside a running one (pytester's inline runs) finds
        # torch's state owned by the enclosing session: its reference is the
        # state it starts with, not the enclosing session's baseline.
        self._nested = self.watch.settled
        self._ambient: dict[str, object] | None = None
        self._ambient_fp: Fingerprint | None = None
        self._current: _ItemState | None = None
        # flags each test module set while imported
        self.modules = ModuleFlags()
        self._owned: dict[Any, Owned] = {}
        # wider fixtures with teardown code, whose teardown is followed
        self.wider = WiderFixtures(lambda: registry().fingerprint() if self.watch.ready() else None)
        # fixture leaks waiting for the teardown of the test that finalised them
        self._pending: list[tuple[str, str]] = []
        # what is reported in the summary, and whether it fails the run
        self.findings = Findings()
        self._previous: str | None = None
        # changes made after a test's teardown check (logreport/logfinish hooks,
        # threads): reported before the next test or at session end
        self._late: list[tuple[str, dict[str, tuple[object, object]]]] = []
        self.threads = ThreadOrigins(self.watch)

    # -- bookkeeping ------------------------------------------------------

    def _ensure_ambient(self) -> dict[str, object]:
        if self._ambient is None:
            if self._nested:
                reg = registry()
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
            self.findings.add(
                "torch backend flags that could not be restored", str(exc), fails=True
            )

    def _torch_own(
        self, delta: dict[str, tuple[object, object]], *references: dict[str, object]
    ) -> dict[str, tuple[object, object]]:
        """``delta`` less torch's own first-use settings, which become the process's state.

        They are written into the between-tests reference, the session
        baseline, the running test's expected state and ``references``, so
        nothing restores them (see :mod:`.first_use`).
        """
        own = torch_own(delta)
        if not own:
            return delta
        for reference in (self._ensure_ambient(), self.watch.baseline, *references):
            reference.update(own)
        self._ambient_fp = self.watch.baseline_fp = None
        current = self._current
        if current is not None and current.expected is not None:
            current.expected.update(own)
            current.expected_fp = None
        return {name: change for name, change in delta.items() if name not in own}

    @contextlib.contextmanager
    def _unchecked_on_error(self, where: str) -> Iterator[None]:
        """Report the guard's own failure in the summary instead of raising it."""
        try:
            yield
        except Exception as exc:
            self._unchecked(where, exc, fails=False)

    def _unchecked(self, where: str, exc: Exception, fails: bool) -> None:
        """Report the guard's failure at ``where``; with ``fails``, the run fails where
        leaks fail it (the flags may not have been restored for the tests after it)."""
        self.findings.add(
            "torch backend flags that could not be checked",
            f"{where}: {type(exc).__name__}: {exc}",
            fails=fails and self.settings.mode == "fail",
        )

    # -- collection: what conftests and test modules change while imported --

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, object, object]:
        if not isinstance(collector, pytest.File):
            return (yield)
        self.watch.checkpoint(HOOK_SOURCE)
        report = yield
        with self._unchecked_on_error(collector.nodeid):  # never break collection
            self.modules.check_import(
                collector, self.watch, self.settings.mode, self._restore, self.findings
            )
        return report

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        """The suite's baseline, when conftest files or plugins changed torch's defaults."""
        self.watch.checkpoint(HOOK_SOURCE)
        return [f"pytest-backends: {line}" for line in self.watch.baseline_lines()]

    # -- around each test -------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        flags = _shared.stashed(item.stash, _shared.ITEM_FLAGS_KEY, None)
        mode, marker_error = marker_mode(item, self.settings.mode)
        if marker_error:
            item.stash[SETUP_ERROR_KEY] = f"{item.nodeid}: {marker_error}"
        if not flags and mode == "off" and self.settings.mode == "off":
            return (yield)
        threads_before = self.threads.alive()
        try:
            state: _ItemState | None = self._begin(item, flags, mode, threads_before)
        except Exception as exc:  # a broken registry fails this test, not the run
            item.stash[SETUP_ERROR_KEY] = (
                f"pytest-backends could not read torch backend flags: {type(exc).__name__}: {exc}"
            )
            state = None
        self._current = state
        try:
            return (yield)
        finally:
            self._current = None
            self._previous = item.nodeid
            threads_after = self.threads.alive()
            if threads_after is not threads_before:  # else no thread started or ended
                self.threads.started_by(set(threads_after) - set(threads_before), item.nodeid)
            if state is not None:
                try:  # inline, not _unchecked_on_error: this runs for every test
                    self._end(item, state)
                except Exception as exc:
                    self._unchecked(f"after {item.nodeid} finished", exc, fails=True)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Register the primitive-log wrapper when a collected test needs it (else no call hook)."""
        needs = any(
            _shared.reduces_onednn_precision(flags)
            for item in session.items
            if (flags := _shared.stashed(item.stash, _shared.ITEM_FLAGS_KEY, None))
        )
        manager = session.config.pluginmanager
        name = "backends-isolation-primitive-log"
        if needs and not manager.has_plugin(name):
            from pytest_backends.isolation.primitive_log import PrimitiveLogPlugin

            manager.register(PrimitiveLogPlugin(), name)
            session.config.add_cleanup(lambda: manager.unregister(name=name))

    def _begin(
        self,
        item: pytest.Item,
        flags: Mapping[str, object] | None,
        mode: str,
        threads: list[threading.Thread],
    ) -> _ItemState:
        watch = self.watch
        alive: list[threading.Thread] | None = threads
        if flags and not watch.ready():
            registry()  # imports torch; the import hook takes the snapshot
            watch.ready()
            alive = None  # the import ran code: take the threads again
        if not watch.settled:
            watch.checkpoint(HOOK_SOURCE)
            watch.settled = True
        strays = self.threads.suspects(alive)
        if not watch.ready():
            return _ItemState(item, mode, None, None, strays)
        reg = registry()
        self._check_drift(reg, item)
        # the between-tests state itself, not a copy: copied before a change of its own
        expected_fp, expected = self._ambient_fp, self._ensure_ambient()
        module_flags = self.modules.of(item)
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
                item.stash[SETUP_ERROR_KEY] = f"cannot apply backend flags: {exc}"
        state = _ItemState(item, mode, expected, expected_fp, strays)
        if expected_fp is not self._ambient_fp:
            ambient = self._ensure_ambient()
            state.applied = {k: v for k, v in expected.items() if ambient.get(k, v) != v}
        return state

    def _check_drift(self, reg: Any, item: pytest.Item) -> None:
        """Flags changed while no test ran, e.g. by a thread an earlier test started."""
        ambient = self._ensure_ambient()
        fp = reg.fingerprint()
        drift: dict[str, tuple[object, object]] = {}
        if fp != self._ambient_fp:
            drift = self._torch_own(reg.diff(ambient, reg.to_plain(fp)))
            self._restore(reg, ambient)
            self._ambient_fp = reg.fingerprint()
        elif not self._late:
            self.threads.settled()
            return  # nothing changed between tests: nothing to report
        text = self._late_text(drift)
        if self.settings.mode == "off" or not text:
            return
        # Emitted in the setup phase, where pytest records warnings per test (and
        # where -W error makes it that test's error, never an INTERNALERROR).
        item.stash[DRIFT_KEY] = drift_message(item.nodeid, text) + thread_hint(
            self.threads.suspects(), "at that time", self.threads.finished()
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
        reg = registry()
        ambient = self._ensure_ambient()
        fp = reg.fingerprint()
        if state.checked_fp is not None and fp != state.checked_fp:
            late = self._torch_own(reg.diff(reg.to_plain(state.checked_fp), reg.to_plain(fp)))
            if late and self.settings.mode != "off":
                self._late.append((f"after {item.nodeid} finished", late))
        if self._ambient_fp is None or fp != self._ambient_fp:
            self._restore(reg, ambient)
            self._ambient_fp = reg.fingerprint()

    def _late_text(self, drift: Mapping[str, tuple[object, object]]) -> str:
        """Changes made after earlier tests' checks, then ``drift``, one block each."""
        blocks = [f"{when}:\n{diff_lines(diff)}" for when, diff in self._late]
        self._late = []
        if drift:
            after = f"after {self._previous} finished" if self._previous else "before any test"
            blocks.append(f"{after}:\n{diff_lines(drift)}")
        return "\n".join(blocks)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Report drift found before this test, and errors that belong to this test."""
        drift = _shared.stashed(item.stash, DRIFT_KEY, None)
        if drift is not None:
            warn_leak(drift)
        error = _shared.stashed(item.stash, SETUP_ERROR_KEY, None)
        if error is not None:
            pytest.fail(error, pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        state = self._current
        if state is None or is_parameter(fixturedef):
            return (yield)
        before_fp = registry().fingerprint() if self.watch.ready() else None
        result = yield
        label = fixture_label(fixturedef)
        state.teardown.watch(fixturedef, label)
        with self._unchecked_on_error(label):  # never break the fixture
            self.wider.watch(fixturedef, state.applied, before_fp)  # if wider than the test
            self._own(fixturedef, state, before_fp)
        return result

    def _own(self, fixturedef: Any, state: _ItemState, before_fp: Fingerprint | None) -> None:
        if not self.watch.ready():
            return
        reg = registry()
        after_fp = reg.fingerprint()
        if after_fp == before_fp:
            return
        before = reg.to_plain(before_fp) if before_fp is not None else dict(self.watch.baseline)
        delta = self._torch_own(reg.diff(before, reg.to_plain(after_fp)), before)
        if not delta:
            return
        # A function-scoped fixture is part of its test; a wider one is judged by
        # the session's mode, never by the marker of whichever test set it up.
        mode = state.mode if fixturedef.scope == "function" else self.settings.mode
        ambient = self._ensure_ambient()
        self._owned[fixturedef] = Owned(
            fixture_label(fixturedef),
            fixturedef.scope,
            {name: b for name, (b, _a) in delta.items()},
            mode,
            {name: ambient.get(name) for name in delta},
        )
        after = {name: a for name, (_b, a) in delta.items()}
        if fixturedef.scope != "function":
            self._ensure_ambient().update(after)
            self._ambient_fp = None
        if state.expected is None or state.expected is self._ambient:
            state.expected = dict(self._ensure_ambient())
        state.expected.update(after)
        state.expected_fp = None

    def pytest_fixture_post_finalizer(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> None:
        state = self._current
        if state is not None and state.teardown.follows(fixturedef) and self.watch.ready():
            with self._unchecked_on_error(fixture_label(fixturedef)):
                state.teardown.finalized(registry(), fixturedef)
        owned = self._owned.pop(fixturedef, None)
        followed = self.wider.pop(fixturedef)
        if owned is None and followed is None:
            return
        with self._unchecked_on_error(fixture_label(fixturedef)):  # never break teardown
            self._finalized(fixturedef, owned, followed)

    def _finalized(self, fixturedef: Any, owned: Owned | None, followed: Followed | None) -> None:
        if not self.watch.ready():
            return
        reg = registry()
        running = self._current.applied if self._current is not None else None
        restore, by_setup, by_teardown = settle(reg, owned, followed, self._torch_own, running)
        if restore:
            self._restore(reg, restore)
        mode = owned.mode if owned is not None else self.settings.mode
        for message in leak_messages(fixturedef, by_setup, by_teardown):
            if mode != "off" and fixturedef.scope == "function":
                self._pending.append((mode, message))  # part of its test
            elif mode != "off":
                # Not an error of whichever test happened to finalise the scope
                # (that depends on the order): once per fixture and change, in the
                # summary, and the run fails under "fail".
                self.findings.add(
                    "torch backend flags leaked by fixtures", message, fails=mode == "fail"
                )
        if owned is None:
            return
        if owned.scope != "function":
            self._ensure_ambient().update(owned.ambient_before)
            self._ambient_fp = None
        state = self._current
        if state is not None and state.expected is not None:
            state.expected = {**state.expected, **owned.before}  # a copy: never the ambient
            state.expected_fp = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        state = self._current
        if state is not None and state.teardown.follows() and self.watch.ready():
            with self._unchecked_on_error(item.nodeid):
                state.teardown.begin(registry())
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
        if fail:
            if warn:
                item.add_report_section(
                    "teardown", "torch backend flags leaked (warn)", "\n\n".join(warn)
                )
            # A leak is not the failure an xfail marker expects.
            from pytest_backends.isolation.xfail import unmask_xfail  # on the first leak

            unmask_xfail(item)
            pytest.fail("\n\n".join(fail), pytrace=False)
        for message in warn:
            warn_leak(message)
        return result

    def _check(self, item: pytest.Item) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {"fail": [], "warn": [], "off": []}
        pending, self._pending = self._pending, []
        for mode, message in pending:
            found[mode].append(message)
        state = self._current
        if state is None or not self.watch.ready():
            return found
        checked: Fingerprint | None = None
        try:
            checked = self._check_test(item, state, found)
        except Exception as exc:  # report, never crash the run
            found["fail"].append(
                f"pytest-backends could not check torch backend flags: {type(exc).__name__}: {exc}"
            )
        if checked is None:
            with contextlib.suppress(Exception):
                checked = registry().fingerprint()
        state.checked_fp = checked
        return found

    def _check_test(
        self, item: pytest.Item, state: _ItemState, found: dict[str, list[str]]
    ) -> Fingerprint | None:
        """Report what the test left changed; the state it leaves, if that is ``fp``.

        Returns the fingerprint taken after teardown when nothing was restored
        (the caller keeps it as the state the test handed back), else None.
        """
        if state.mode == "off":
            return None
        reg = registry()
        fp: Fingerprint = reg.fingerprint()
        if state.expected_fp is not None and fp == state.expected_fp:
            return state.expected_fp  # the same object: the next comparisons with it are cheap
        expected = state.expected
        if expected is None:
            expected = dict(self._ensure_ambient())
        after = reg.to_plain(fp)
        if state.hooks:
            from pytest_backends.isolation.hooks import HOOKS_TITLE, hook_findings

            for message in hook_findings(reg, state.hooks, after):
                self.findings.add(HOOKS_TITLE, message, fails=state.mode == "fail")
        leaked = self._torch_own(reg.diff(expected, after), expected)
        if not leaked:
            return fp
        self._restore(reg, expected)
        by_fixture, leaked = state.teardown.split(reg.visible(leaked, expected, after))
        found[state.mode].extend(teardown_messages(by_fixture))  # not the test body's
        if leaked:
            found[state.mode].append(
                f"{item.nodeid} left torch backend flags changed:\n{diff_lines(leaked)}\n"
                "They were restored for the next test. Restore them "
                "in the test (try/finally), or set them with the backend_flags fixture or "
                "pytest_backends.override_flags(), which always restore."
                + thread_hint(state.threads)
            )
        return None

    def pytest_plugin_registered(self, plugin: object, manager: pytest.PytestPluginManager) -> None:
        """A conftest with test-phase hooks: what they change is theirs (see .hooks)."""
        if str(getattr(plugin, "__file__", "")).endswith("conftest.py") and any(
            hasattr(plugin, f"pytest_runtest_{phase}") for phase in ("setup", "call", "teardown")
        ):
            from pytest_backends.isolation.hooks import watch_conftest

            watch_conftest(self, plugin, manager)

    def checkpoint(self) -> Fingerprint | None:
        """The flags now, while the guard checks a running test (else None)."""
        state = self._current
        ready = state is not None and state.mode != "off" and self.watch.ready()
        fp: Fingerprint | None = registry().fingerprint() if ready else None
        return fp

    def hook_changed(self, label: str, phase: str, before_fp: Fingerprint) -> None:
        """Hook ``label`` changed flags since ``before_fp``: the test expects them."""
        state, reg = self._current, registry()
        after_fp = reg.fingerprint()
        if state is None or after_fp == before_fp:
            return
        before = reg.to_plain(before_fp)
        delta = self._torch_own(reg.diff(before, reg.to_plain(after_fp)), before)
        if not delta:
            return
        state.hooks.append((label, phase, delta))
        state.expected = {**(state.expected or self._ensure_ambient())}
        state.expected.update({name: a for name, (_b, a) in delta.items()})
        state.expected_fp = None
        if phase == "teardown" and state.teardown.follows():
            state.teardown.begin(reg)  # not the next finalized fixture's change

    # -- session end ------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """After the last fixture's teardown: late changes, leftovers, the exit status."""
        with self._unchecked_on_error("at session end"):  # never an INTERNALERROR
            self._finish(session)
        if self.findings.leave_for_controller(session.config, self.watch.baseline_lines()):
            return
        for title, message in self.findings.failing:
            _shared.fail_session(session.config, title, message)
        if self.findings.fails_run and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _finish(self, session: pytest.Session) -> None:
        for mode, message in self._pending:
            self.findings.add(
                "torch backend flags leaked by fixtures", message, fails=mode == "fail"
            )
        self._pending = []
        if (
            self.settings.mode == "off"
            or not self.watch.ready()
            # a pytest-xdist controller runs no test: its flags reach none
            or session.config.pluginmanager.has_plugin("dsession")
        ):
            return
        reg = registry()
        reference = self._ensure_ambient()
        fp = reg.fingerprint()
        late: dict[str, tuple[object, object]] = {}
        if fp != self._ambient_fp:
            late = self._torch_own(reg.diff(reference, reg.to_plain(fp)))
            self._restore(reg, reference)
        text = self._late_text(late)
        if not text:
            return
        self.findings.add(
            "torch backend flags changed after the last test",
            f"torch backend flags changed while no test was running:\n{text}\n"
            "They were restored at session end. A thread or a hook (pytest_runtest_logfinish, "
            "pytest_sessionfinish, ...) changed them; join threads that change flags and "
            "restore what hooks change."
            + thread_hint(self.threads.suspects(), "at session end", self.threads.finished()),
            fails=self.settings.mode == "fail",
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """pytest-xdist controller: gather what a worker found outside its tests."""
        self.findings.gather(node)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Everything found outside a test's own report."""
        if self.watch.error is not None and self.settings.mode != "off":
            self.findings.add(
                "torch backend flags were not checked",
                f"pytest-backends could not read torch's flags when torch was imported "
                f"({self.watch.error}); the leak guard was off for this run.",
                fails=False,
            )
        self.findings.write(terminalreporter)
