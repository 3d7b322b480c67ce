"""What the guard reports outside a test's own report, and how it reaches the controller.

Leaks found in a test fail (or warn in) that test.  Everything else (flags
set while test modules were imported, fixtures whose leak outlived their
scope, changes made after the last test, the session's baseline) is gathered
here by section, printed in the terminal summary, and may fail the run.  A
pytest-xdist worker leaves its findings for the controller through the one
xdist channel (:mod:`pytest_backends._xdist`); the controller prints them.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from pytest_backends import _xdist

__all__ = ["BackendsLeakWarning", "Findings", "drift_message", "warn_leak"]

#: The name of the findings a worker leaves for the controller.
_CHANNEL = _xdist.channel("isolation")


class BackendsLeakWarning(pytest.PytestWarning):
    """A torch backend flag was left changed (``--backends-leaks=warn``)."""


def warn_leak(message: str) -> None:
    """Warn; where warnings are errors (-W error), fail the current phase cleanly."""
    try:
        warnings.warn(BackendsLeakWarning(message), stacklevel=1)
    except Warning as exc:
        error = f"{type(exc).__name__} (warnings are errors here): {exc}"
    else:
        return
    pytest.fail(error, pytrace=False)


def drift_message(nodeid: str, text: str) -> str:
    """The report of flags found changed between tests, before ``nodeid`` started."""
    return (
        f"torch backend flags changed between tests (before {nodeid} started):\n{text}\n"
        "No test was running, so the change came from another thread (for example "
        "one an earlier test started and did not join) or from a plugin hook. "
        "The flags were restored. Flags are process-global: join threads that "
        "change them before the test ends."
    )


class Findings:
    """Messages by summary section, and whether any of them fails the run."""

    def __init__(self) -> None:
        self.sections: dict[str, list[str]] = {}
        self.fails_run = False
        #: The ``(title, message)`` pairs that fail the run.
        self.failing: list[tuple[str, str]] = []

    def add(self, title: str, message: str, fails: bool) -> None:
        """Add ``message`` under ``title`` once; ``fails`` makes the run fail."""
        messages = self.sections.setdefault(title, [])
        if message not in messages:
            messages.append(message)
        if fails and (title, message) not in self.failing:
            self.failing.append((title, message))
        self.fails_run = self.fails_run or fails

    def leave_for_controller(self, config: pytest.Config, baseline: list[str]) -> bool:
        """Worker: leave the findings and the baseline lines for the controller.

        Returns False (and leaves nothing) outside a pytest-xdist worker.
        """
        data = {
            "sections": {k: list(v) for k, v in self.sections.items()},
            "baseline": baseline,
            "fails": self.fails_run,
            "failing": [list(pair) for pair in self.failing],
        }
        return _xdist.put(config, _CHANNEL, data)

    def gather(self, node: Any) -> None:
        """Controller: add what the worker ``node`` found outside its tests."""
        data = _xdist.collected(node, _CHANNEL)
        if not isinstance(data, dict):
            return
        failing = {tuple(map(str, pair)) for pair in data.get("failing", [])}
        for title, messages in dict(data.get("sections", {})).items():
            for message in messages:
                self.add(str(title), str(message), fails=(str(title), str(message)) in failing)
        for line in data.get("baseline", []):
            self.add("torch backend flags: session baseline", str(line), fails=False)
        self.fails_run = self.fails_run or bool(data.get("fails"))

    def write(self, terminalreporter: Any) -> None:
        """One summary section per title, and why the run fails if it does."""
        for title, messages in self.sections.items():
            terminalreporter.section(title, sep="=")
            for message in messages:
                terminalreporter.line(message)
        if self.fails_run:
            terminalreporter.line(
                "pytest-backends: the run fails because of the torch backend flag changes "
                "above (--backends-leaks=fail)."
            )
