"""When the native harness gets built during a pytest run, and who is told.

The first JIT build of the native extension takes a minute or more on a
fresh cache. It must not be charged silently to whichever test first asks
for a digest, so:

* when a determinism option is on, the controller builds it at session start,
  once, before any xdist worker starts, with a progress line;
* when a test triggers the build anyway (``assert_reproducible`` without a
  determinism option), a line on the terminal, outside output capture, names
  the test and points to ``python -m pytest_backends build-native``. Under
  xdist the worker attaches the line to the test's report and the controller
  prints it;
* a run that never uses the harness never builds: nothing here loads it
  unless a determinism option is on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from pytest_backends import _native, _shared, _xdist

__all__ = ["SETTINGS_KEY", "NativeBuildPlugin", "Settings", "WorkerNotices", "plugins"]

#: Report property carrying the build notices raised while the test ran (from a worker).
PROPERTY = "backends_native_build"
_PREFIX = "pytest-backends: "
#: The determinism feature's plugin: when it is registered, the harness is built up front.
_DETERMINISM_PLUGIN = "backends-determinism"


@dataclass(frozen=True)
class Settings:
    """The native build feature has no option of its own: it follows the determinism feature."""

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Nothing to resolve."""
        return cls()


SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()


def _running_test(inherited: str | None) -> str | None:
    """The node id of the test whose phase is running (pytest's ``PYTEST_CURRENT_TEST``).

    ``inherited`` is the value the session started with: a pytest run inside a
    test of another one inherits the outer test's, which names no test of its own.
    """
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if not current or current == inherited:
        return None
    return current.rsplit(" ", 1)[0]


class NativeBuildPlugin:
    """Builds at session start when asked to, and announces builds that tests trigger.

    It has no per-test hook: the running test is read from ``PYTEST_CURRENT_TEST``
    when a build starts, and a worker puts the notice in that item's user
    properties, which pytest copies into its reports; an xdist controller prints
    them through :class:`WorkerNotices`, which it has only when workers start.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker = _xdist.is_worker(config)
        self._session: pytest.Session | None = None
        self._inherited = os.environ.get("PYTEST_CURRENT_TEST")
        # An in-process pytester run configures a second session: give the
        # listener back to the outer one when this one ends.
        self.previous_listener = _native.build_listener()

    # -- session start: build ahead of the tests -------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._session = session
        if self.worker or not self._determinism_on():
            return
        _native.prepare(self._progress)

    def _determinism_on(self) -> bool:
        return self.config.pluginmanager.has_plugin(_DETERMINISM_PLUGIN)

    def _progress(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(_PREFIX + line)

    # -- a test triggers the build ---------------------------------------------------------

    def notice(self, why: str) -> None:
        """Build listener: the extension is about to be compiled in this process."""
        nodeid = _running_test(self._inherited)
        if nodeid is None:
            return  # a build at session start has its own progress lines
        line = (
            f"{nodeid} triggered a build of the native determinism harness "
            f"({why}); it can take minutes and counts in this test's duration. Run "
            "`python -m pytest_backends build-native` before the tests (e.g. in CI)"
        )
        if not self.worker:
            self._write_now(line)
            return
        items = self._session.items if self._session is not None else []
        item = next((i for i in items if i.nodeid == nodeid), None)
        if item is not None:
            _shared.attach(item, PROPERTY, [line])

    def _write_now(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        if capman is None:
            reporter.ensure_newline()
            reporter.write_line(_PREFIX + line)
            return
        with capman.global_and_fixture_disabled():
            reporter.ensure_newline()
            reporter.write_line(_PREFIX + line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        _native.set_build_listener(self.previous_listener)


class WorkerNotices:
    """xdist controller: prints the build notices carried by workers' reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._printed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        notices = _shared.read(report, PROPERTY)
        if not isinstance(notices, list):
            return
        # the item's properties ride on each of its phase reports: print a notice once
        notices = [line for line in notices if line not in self._printed]
        self._printed.update(notices)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        node = getattr(report, "node", None)
        worker = getattr(node, "gateway", None)
        where = f"[{worker.id}] " if worker is not None else ""
        for line in notices:
            reporter.ensure_newline()
            reporter.write_line(f"{_PREFIX}{where}{line}")


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The plugin to register, made the process's build listener."""
    plugin = NativeBuildPlugin(config)
    _native.set_build_listener(plugin.notice)
    plugins: list[tuple[object, str]] = [(plugin, "backends-native")]
    starts_workers = getattr(config.option, "numprocesses", None) or getattr(
        config.option, "tx", None
    )
    if starts_workers and not _xdist.is_worker(config):
        plugins.append((WorkerNotices(config), "backends-native-relay"))
    return plugins
