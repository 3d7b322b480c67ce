"""How many items each option selected: recorded by the features, read by ``nothing_selected``.

``--backends-matrix``, ``--backends-verify`` and ``--backends-determinism``
(and the options that imply it) act only on the tests they select.  Each
feature records, once its items are final, how many items its option
selects (:func:`record`); the ``nothing_selected`` feature sends the counts from
pytest-xdist workers to the controller and names every option that selected
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["Selection", "record", "record_all_skipped", "selection"]


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
        """JSON-ready form, for the controller."""
        return {option: [n, self.hints[option]] for option, n in self.counts.items()}

    def merge(self, plain: dict[str, list[Any]]) -> None:
        """Add the counts of another process (:meth:`to_plain`)."""
        for option, (n, hint) in plain.items():
            self.add(str(option), int(n), str(hint))


_KEY: pytest.StashKey[Selection] = pytest.StashKey()


def selection(config: pytest.Config) -> Selection:
    """Everything recorded in this process (merged worker counts in an xdist controller)."""
    return config.stash.setdefault(_KEY, Selection())


def record(config: pytest.Config, option: str, selected: int, hint: str) -> None:
    """Record that ``option`` selects ``selected`` items; ``hint`` says what to do if none."""
    selection(config).add(option, selected, hint)


def record_all_skipped(config: pytest.Config, what: str, why: str) -> None:
    """Record that every item ``what`` selected was skipped (controller, after the run)."""
    selection(config).skipped.setdefault(what, why)
