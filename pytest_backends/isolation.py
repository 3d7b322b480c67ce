"""Per-test isolation of torch backend flags, and the leak guard.

Around every test the guard fingerprints all flags before setup and after
teardown.  A test that leaves a flag changed is reported (by default as an
error at teardown naming each flag's ``before -> after``) and the state is put
back so the next test starts clean.  Flags changed by a fixture belong to
that fixture for its scope: a module-scoped fixture may change a flag for
the whole module, and is reported only if the change outlives its teardown.

The guard does nothing until torch has been imported by someone else: a
suite that never imports torch never pays for it.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_backends import _keys, _options
from pytest_backends.flags import torch_imported as _torch_loaded

__all__ = [
    "ITEM_FLAGS_KEY",
    "LEAK_MODES",
    "BackendsLeakWarning",
    "FlagSetter",
    "IsolationPlugin",
    "LeakSettings",
    "parse_leak_mode",
    "resolve_leak_mode",
]

LEAK_MODES = ("fail", "warn", "off")

#: Flags to apply around one item's setup, call and teardown (see :mod:`pytest_backends._keys`).
ITEM_FLAGS_KEY = _keys.ITEM_FLAGS_KEY

_SETUP_ERROR_KEY = _keys.SETUP_ERROR_KEY


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


@dataclass
class _Owned:
    """Flags a fixture changed during its setup."""

    label: str
    scope: str
    before: dict[str, object]


@dataclass
class _ItemState:
    item: pytest.Item
    mode: str
    expected: dict[str, object]
    expected_fp: tuple[object, ...] | None
    applied: bool
    # (thread name, nodeid that started it) for threads earlier tests left running
    threads: list[tuple[str, str]] = field(default_factory=list)
    # fingerprint read after teardown when it matched ``expected_fp``
    end_fp: tuple[object, ...] | None = None


@functools.cache
def _registry() -> Any:
    # flags imports nothing heavy itself; the registry imports torch on first use
    from pytest_backends.flags import registry

    return registry()


def _lines(diff: Mapping[str, tuple[object, object]]) -> str:
    from pytest_backends.flags import format_diff

    return format_diff(diff)


def _fixture_label(fixturedef: Any) -> str:
    where = getattr(fixturedef, "baseid", "") or "conftest/plugin"
    return f"fixture {fixturedef.argname!r} ({fixturedef.scope} scope, defined in {where})"


class IsolationPlugin:
    """Applies per-item flags, restores state and reports leaks."""

    def __init__(self, settings: LeakSettings) -> None:
        self.settings = settings
        self._ambient: dict[str, object] | None = None
        self._ambient_fp: tuple[object, ...] | None = None
        self._current: _ItemState | None = None
        self._owned: dict[Any, _Owned] = {}
        self._fixture_leaks: list[str] = []
        self._previous: str | None = None
        # threads still alive after the test that started them ended
        self._threads: weakref.WeakKeyDictionary[threading.Thread, str] = (
            weakref.WeakKeyDictionary()
        )

    def _mode_for(self, item: pytest.Item) -> str:
        marker = item.get_closest_marker("backends_leaks")
        if marker is None:
            return self.settings.mode
        if len(marker.args) != 1 or not isinstance(marker.args[0], str):
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.backends_leaks takes one of "
                f"{', '.join(LEAK_MODES)}, got {marker.args!r}"
            )
        return parse_leak_mode(marker.args[0], f"{item.nodeid}: @pytest.mark.backends_leaks")

    def _refresh_ambient(self, reg: Any) -> None:
        fp = reg.fingerprint()
        self._ambient_fp, self._ambient = fp, reg.to_plain(fp)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        flags = item.stash.get(ITEM_FLAGS_KEY, None)
        if not flags and (self.settings.mode == "off" or not _torch_loaded()):
            return (yield)
        mode = self._mode_for(item)
        threads_before = set(threading.enumerate())
        reg = _registry()
        fp = reg.fingerprint()
        if self._ambient is None or self._ambient_fp is None:
            self._ambient_fp, self._ambient = fp, reg.to_plain(fp)
        elif fp != self._ambient_fp:
            self._report_drift(reg, reg.to_plain(fp), item, mode)
        applied = False
        if flags:
            try:
                reg.apply(reg.validate(flags))
                applied = True
            except ValueError as exc:
                reg.restore(self._ambient)
                item.stash[_SETUP_ERROR_KEY] = exc
        if applied:
            expected_fp = reg.fingerprint()
            expected = reg.to_plain(expected_fp)
        else:
            expected_fp, expected = self._ambient_fp, dict(self._ambient)
        strays = [(t.name, nodeid) for t, nodeid in list(self._threads.items()) if t.is_alive()]
        self._current = _ItemState(item, mode, expected, expected_fp, applied, strays)
        state = self._current
        try:
            return (yield)
        finally:
            self._current = None
            self._previous = item.nodeid
            for thread in set(threading.enumerate()) - threads_before:
                self._threads[thread] = item.nodeid
            if self._ambient_fp is None:
                reg.restore(self._ambient)
                self._refresh_ambient(reg)
            elif (
                state.end_fp is None or state.end_fp != self._ambient_fp
            ) and reg.fingerprint() != self._ambient_fp:
                reg.restore(self._ambient)

    def _report_drift(
        self, reg: Any, current: dict[str, object], item: pytest.Item, mode: str
    ) -> None:
        """Flags changed while no test ran, e.g. by a thread an earlier test started."""
        assert self._ambient is not None
        drift = reg.diff(self._ambient, current)
        reg.restore(self._ambient)
        if mode == "off" or not drift:
            return
        after = f"after {self._previous} finished" if self._previous else "before the first test"
        warnings.warn(
            BackendsLeakWarning(
                f"torch backend flags changed between tests ({after}, before "
                f"{item.nodeid} started):\n{_lines(drift)}\n"
                "No test was running, so the change came from another thread (for example "
                "one an earlier test started and did not join) or from a plugin hook. "
                "The flags were restored. Flags are process-global: join threads that "
                "change them before the test ends."
            ),
            stacklevel=1,
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        error = item.stash.get(_SETUP_ERROR_KEY, None)
        if error is not None:
            pytest.fail(f"cannot apply backend flags: {error}", pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        if self._current is None or self._current.mode == "off" or not _torch_loaded():
            return (yield)
        reg = _registry()
        before_fp = reg.fingerprint()
        result = yield
        after_fp = reg.fingerprint()
        if after_fp != before_fp:
            delta = reg.diff(reg.to_plain(before_fp), reg.to_plain(after_fp))
            self._owned[fixturedef] = _Owned(
                _fixture_label(fixturedef),
                fixturedef.scope,
                {name: before for name, (before, _after) in delta.items()},
            )
            after = {name: a for name, (_b, a) in delta.items()}
            if fixturedef.scope != "function" and self._ambient is not None:
                self._ambient.update(after)
                self._ambient_fp = None
            self._current.expected.update(after)
            self._current.expected_fp = None
        return result

    def pytest_fixture_post_finalizer(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> None:
        owned = self._owned.pop(fixturedef, None)
        if owned is None:
            return
        reg = _registry()
        current = reg.snapshot()
        leaked = {
            name: (before, current.get(name))
            for name, before in owned.before.items()
            if current.get(name) != before
        }
        if leaked:
            reg.restore(owned.before)
            self._fixture_leaks.append(
                f"{owned.label} changed torch backend flags and did not restore them "
                f"in its teardown:\n{_lines(leaked)}\n"
                "Restore them after the fixture's yield, or set them inside "
                "pytest_backends.override_flags(), which always restores."
            )
        if owned.scope != "function" and self._ambient is not None:
            self._ambient.update(owned.before)
            self._ambient_fp = None
        if self._current is not None:
            self._current.expected.update(owned.before)
            self._current.expected_fp = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        try:
            result = yield
        except BaseException:
            message = self._check(item)
            if message:
                item.add_report_section("teardown", "torch backend flags leaked", message)
            raise
        message = self._check(item)
        if message:
            mode = self._current.mode if self._current else self.settings.mode
            # pytest would turn a teardown error of an xfail test into one more
            # "xfailed", hiding the leak; a warning stays visible.
            if mode == "fail" and item.get_closest_marker("xfail") is None:
                pytest.fail(message, pytrace=False)
            warnings.warn(BackendsLeakWarning(message), stacklevel=1)
        return result

    def _check(self, item: pytest.Item) -> str | None:
        state = self._current
        messages, self._fixture_leaks = self._fixture_leaks, []
        if state is None or state.mode == "off":
            return None
        reg = _registry()
        fp = reg.fingerprint()
        if fp == state.expected_fp:
            state.end_fp = fp
        else:
            current = reg.to_plain(fp)
            leaked = reg.diff(state.expected, current)
            if leaked:
                reg.restore(state.expected)
                messages.append(
                    f"{item.nodeid} left torch backend flags changed:\n{_lines(leaked)}\n"
                    "They were restored for the next test. Restore them in the test "
                    "(try/finally), or set them with the backend_flags fixture or "
                    "pytest_backends.override_flags(), which always restore."
                    + self._thread_hint(state.threads)
                )
        return "\n\n".join(messages) or None

    @staticmethod
    def _thread_hint(threads: list[tuple[str, str]]) -> str:
        if not threads:
            return ""
        lines = "".join(
            f"\n  thread {name!r}, started by {nodeid}, was running during this test"
            for name, nodeid in threads
        )
        return (
            "\nFlags are process-global, so a thread an earlier test left running may have "
            f"made this change:{lines}"
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._fixture_leaks:
            terminalreporter.section("torch backend flags leaked by fixtures", sep="=")
            for message in self._fixture_leaks:
                terminalreporter.line(message)


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
