"""Options that selected no test: said in the summary, a failed run with ``--backends-strict``.

``--backends-matrix``, ``--backends-verify`` and ``--backends-determinism``
(and the options that imply it) act only on the tests they select: marked
tests, configs that make checkable promises.  A run where such an option
selected nothing would otherwise look like a clean pass ("0 op keys").

Each feature records, once its items are final, how many items its option
selects (:func:`record`).  The counts travel from xdist workers to the
controller in ``workeroutput``; the controller names every option that
selected nothing in the terminal summary, and with ``--backends-strict`` (ini
``backends_strict``) the run exits with :attr:`pytest.ExitCode.USAGE_ERROR`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_backends import _options
from pytest_backends._keys import SELECTION_KEY, STRICT_KEY

__all__ = [
    "SELECTION_KEY",
    "Selection",
    "SelectionPlugin",
    "configure",
    "record",
    "strict",
]

#: The ``workeroutput`` key carrying a worker's counts to the controller.
WORKEROUTPUT_KEY = "backends_selection"


@dataclass
class Selection:
    """Per option: how many items it selects, and what to do when that is none."""

    counts: dict[str, int] = field(default_factory=dict)
    hints: dict[str, str] = field(default_factory=dict)
    #: What selected items that were all skipped (a CPU level this machine lacks) -> why.
    skipped: dict[str, str] = field(default_factory=dict)

    def add(self, option: str, selected: int, hint: str) -> None:
        """Record ``selected`` items for ``option`` (the largest count wins)."""
        self.counts[option] = max(self.counts.get(option, 0), selected)
        self.hints.setdefault(option, hint)

    def empty(self) -> list[tuple[str, str]]:
        """``(option, hint)`` for every option that selected nothing."""
        return sorted((option, self.hints[option]) for option, n in self.counts.items() if n == 0)

    def to_plain(self) -> dict[str, list[Any]]:
        """JSON-ready form, for ``workeroutput``."""
        return {option: [n, self.hints[option]] for option, n in self.counts.items()}

    def merge(self, plain: dict[str, list[Any]]) -> None:
        """Add the counts of another process (:meth:`to_plain`)."""
        for option, (n, hint) in plain.items():
            self.add(str(option), int(n), str(hint))


def record_all_skipped(config: pytest.Config, what: str, why: str) -> None:
    """Record that every item ``what`` selected was skipped (controller, after the run)."""
    config.stash.setdefault(SELECTION_KEY, Selection()).skipped.setdefault(what, why)


def strict(config: pytest.Config) -> bool:
    """Whether ``--backends-strict`` (or ``backends_strict = true``) is on."""
    if STRICT_KEY not in config.stash:
        config.stash[STRICT_KEY] = bool(_options.lookup(config, "backends_strict").value)
    return config.stash[STRICT_KEY]


def record(config: pytest.Config, option: str, selected: int, hint: str) -> None:
    """Record that ``option`` selects ``selected`` items; ``hint`` says what to do if none."""
    config.stash.setdefault(SELECTION_KEY, Selection()).add(option, selected, hint)


class SelectionPlugin:
    """Reports options that selected nothing; fails the run for them when strict."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def selection(self) -> Selection:
        """Everything recorded in this process (merged worker counts in an xdist controller)."""
        return self.config.stash.setdefault(SELECTION_KEY, Selection())

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKEROUTPUT_KEY] = self.selection().to_plain()
            return
        # A run whose option selected nothing may also have deselected every test
        # (--backends-config): that too fails as a usage error, as the summary says.
        passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        silent = self.selection().empty() or self.selection().skipped
        if strict(self.config) and silent and session.exitstatus in passing:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        plain = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_KEY)
        if plain:
            self.selection().merge(plain)

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if hasattr(config, "workerinput"):
            return
        empty = self.selection().empty()
        skipped = sorted(self.selection().skipped.items())
        if not empty and not skipped:
            return
        is_strict = strict(config)
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


def configure(config: pytest.Config) -> list[tuple[object, str]]:
    """The plugin, for every process (workers send their counts to the controller).

    ``--backends-strict`` is resolved here, so a bad ini value stops the run
    before any test runs.
    """
    strict(config)
    return [(SelectionPlugin(config), "backends-selection")]
