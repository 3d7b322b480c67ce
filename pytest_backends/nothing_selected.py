"""Options that selected no test: said in the summary, a failed run with ``--backends-strict``.

``--backends-matrix``, ``--backends-verify`` and ``--backends-determinism``
(and the options that imply it) act only on the tests they select: marked
tests, configs that make checkable promises.  A run where such an option
selected nothing would otherwise look like a clean pass ("0 op keys").

Each feature records, once its items are final, how many items its option
selects (:func:`pytest_backends._selected.record`).  The counts travel from xdist workers to the
controller through :mod:`pytest_backends._xdist`; the controller names every option that
selected nothing in the terminal summary, and with ``--backends-strict`` (ini
``backends_strict``) the run exits with :attr:`pytest.ExitCode.USAGE_ERROR`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pytest_backends import _options, _selected, _shared, _xdist
from pytest_backends._selected import Selection

__all__ = ["SETTINGS_KEY", "SelectionPlugin", "Settings", "plugins"]

_CHANNEL = _xdist.channel("selection")


@dataclass(frozen=True)
class Settings:
    """The selection feature's settings: whether ``--backends-strict`` is on."""

    strict: bool = False

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Resolve ``--backends-strict`` (ini ``backends_strict``); bad values stop the run."""
        return cls(bool(_options.lookup(config, "backends_strict").value))


#: Read across features (through :func:`pytest_backends._shared.strict`).
SETTINGS_KEY = _shared.STRICT_KEY


class SelectionPlugin:
    """Reports options that selected nothing; fails the run for them when strict."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def selection(self) -> Selection:
        """Everything recorded in this process (merged worker counts in an xdist controller)."""
        return _selected.selection(self.config)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if _xdist.put(self.config, _CHANNEL, self.selection().to_plain()):
            return
        # A run whose option selected nothing may also have deselected every test
        # (--backends-config): that too fails as a usage error, as the summary says.
        passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        silent = self.selection().empty() or self.selection().skipped
        if _shared.strict(self.config) and silent and session.exitstatus in passing:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
            for option, hint in self.selection().empty():
                _shared.fail_session(self.config, f"{option} selected nothing", hint)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        plain = _xdist.collected(node, _CHANNEL)
        if plain:
            self.selection().merge(plain)

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if _xdist.is_worker(config):
            return
        empty = self.selection().empty()
        skipped = sorted(self.selection().skipped.items())
        if not empty and not skipped:
            return
        is_strict = _shared.strict(config)
        terminalreporter.write_sep(
            "=", "backends: options that selected no test", red=is_strict, yellow=not is_strict
        )
        for option, hint in empty:
            terminalreporter.write_line(f"{option} selected no test: {hint}")
        for what, why in skipped:
            terminalreporter.write_line(f"{what} ran no test: every item it selected was {why}")
        if is_strict:
            terminalreporter.write_line(
                "--backends-strict: the run fails because of the above "
                "(exit code 4, or 1 where tests failed too)",
                red=True,
            )


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The plugin, for every process (workers send their counts to the controller)."""
    return [(SelectionPlugin(config), "backends-selection")]
