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
from collections.abc import Generator
from dataclasses import dataclass

import pytest

from pytest_backends import _native, _shared, _xdist

__all__ = ["SETTINGS_KEY", "NativeBuildPlugin", "Settings", "plugins"]

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
    when a build starts, a worker registers :class:`_NoticeCarrier` only once a
    test has triggered a build, and a controller registers :class:`_WorkerNotices`
    only when an xdist worker starts.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker = _xdist.is_worker(config)
        self._notices: list[str] = []
        self._carrier: _NoticeCarrier | None = None
        self._relay: _WorkerNotices | None = None
        self._inherited = os.environ.get("PYTEST_CURRENT_TEST")
        # An in-process pytester run configures a second session: give the
        # listener back to the outer one when this one ends.
        self.previous_listener = _native.build_listener()

    # -- session start: build ahead of the tests -------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.worker or not self._determinism_on():
            return
        _native.prepare(self._progress)

    def _determinism_on(self) -> bool:
        return self.config.pluginmanager.has_plugin(_DETERMINISM_PLUGIN)

    def _progress(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(_PREFIX + line)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: object) -> None:
        """xdist controller: relay the notices that workers attach to their reports."""
        if self._relay is None:
            self._relay = _WorkerNotices(self.config)
            self.config.pluginmanager.register(self._relay, "backends-native-relay")

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
        if self._carrier is None:
            self._carrier = _NoticeCarrier()
            self.config.pluginmanager.register(self._carrier, "backends-native-carrier")
        self._carrier.notices.append(line)

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


class _NoticeCarrier:
    """Worker: attaches the build notices to the report of the test that triggered them."""

    def __init__(self) -> None:
        self.notices: list[str] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if self.notices:
            _shared.add_property(report, PROPERTY, list(self.notices))
            self.notices.clear()
        return report


class _WorkerNotices:
    """xdist controller: prints the build notices carried by workers' reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        notices = _shared.report_data(report, PROPERTY)
        if not isinstance(notices, list):
            return
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
    return [(plugin, "backends-native")]
