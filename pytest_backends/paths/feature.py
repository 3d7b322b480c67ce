"""Per-op traces as a feature: ``--backends-trace=DIR`` and the plugin that writes them.

Importing this module never imports torch.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_backends import _options, _shared
from pytest_backends._shared import CONFIG_KEY

__all__ = ["SETTINGS_KEY", "Settings", "plugins"]


@dataclass(frozen=True)
class Settings:
    """The resolved trace option: the directory, or ``None`` when off."""

    trace_dir: Path | None = None
    diverge: bool = False

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Resolve ``--backends-trace`` once."""
        diverge = bool(_options.lookup(config, "backends_diverge").value)
        raw = _options.lookup(config, "backends_trace")
        text = str(raw.text).strip()
        if not text:
            if raw.from_cli:
                raise pytest.UsageError("--backends-trace: expected a directory, got ''")
            return cls(None, diverge)
        base = Path(config.invocation_params.dir) if raw.from_cli else config.rootpath
        path = base / text
        if path.exists() and not path.is_dir():
            raise pytest.UsageError(f"--backends-trace: {path} exists and is not a directory")
        return cls(path, diverge)


#: Where the registrar stores the :class:`Settings`.
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()


class TracePlugin:
    """Records the call phase of every marked test into a trace file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Trace the test body of a ``@pytest.mark.backends`` test."""
        if item.get_closest_marker("backends") is None:
            return (yield)
        from pytest_backends.paths.trace import header, trace_file, tracing

        config = item.stash.get(CONFIG_KEY, None)
        config_id = config.id if config is not None else "default"
        flags = dict(config.flags) if config is not None else {}
        device = str(getattr(config, "device", "cpu")) if config is not None else "cpu"
        path = trace_file(self.root, item.nodeid, config_id)
        with tracing(path, header(config_id, flags, device, item.nodeid)):
            return (yield)


class DivergePlugin:
    """Names where a failing configuration's path parts from a passing one's."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Remember which items passed."""
        if report.when == "call":
            self.outcomes[report.nodeid] = report.outcome

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """On a failed call of a matrix test, rerun it recorded under a passing config."""
        report = yield
        if call.when != "call" or not report.failed or hasattr(report, "wasxfail"):
            return report
        config = item.stash.get(CONFIG_KEY, None)
        if config is None or item.get_closest_marker("backends") is None:
            return report
        from pytest_backends.paths.locate import locate

        line = locate(item, config, self._siblings(item, config))
        if line:
            _shared.attach(report, _shared.PROPERTY_DIVERGE, line.splitlines()[0])
            add = getattr(report.longrepr, "addsection", None)
            if callable(add):
                add("backends diverge", line)
            else:
                report.sections.append(("backends diverge", line))
        return report

    def _siblings(self, item: pytest.Item, config: Any) -> list[Any]:
        """The other configurations of the same test: those that passed first."""
        from pytest_backends.matrix.configs import base_test_id

        base = base_test_id(item.nodeid, config.id)
        passed, unrun = [], []
        for other in item.session.items:
            theirs = other.stash.get(CONFIG_KEY, None)
            if other is item or theirs is None or theirs.id == config.id:
                continue
            if base_test_id(other.nodeid, theirs.id) != base:
                continue
            outcome = self.outcomes.get(other.nodeid)
            if outcome == "passed":
                passed.append(theirs)
            elif outcome is None:
                unrun.append(theirs)
        return passed + unrun


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The trace writer with ``--backends-trace``, the locator with ``--backends-diverge``."""
    out: list[tuple[object, str]] = []
    if settings.trace_dir is not None:
        out.append((TracePlugin(settings.trace_dir), "backends-trace"))
    if settings.diverge:
        out.append((DivergePlugin(), "backends-diverge"))
    return out
