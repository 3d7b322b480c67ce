"""Coverage across CI jobs: which collected tests and configs ran in no job.

Every matrix report (``--backends-report``) lists, under ``coverage``, each
item its run collected (deselected ones included) with its config id, the
items it deselected, the items that ran and the items that were skipped with
the reason.
``pytest-backends merge`` joins the lists of all jobs and names every test,
configuration and item that ran nowhere; with ``--strict`` those that no job
even ran (deselected everywhere, or selected and never reached because a job
stopped early), and configurations that every job skipped, fail the merge.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_backends import _xdist
from pytest_backends.matrix.configs import base_test_id

__all__ = [
    "COLLECTED_CHANNEL",
    "DESELECTED_CHANNEL",
    "Coverage",
    "CoverageGaps",
    "collected",
    "deselected",
    "find_gaps",
    "missing_note",
    "parse_coverage",
    "send_to_controller",
]

_COLLECTED_KEY: pytest.StashKey[dict[str, str]] = pytest.StashKey()
#: What a pytest-xdist worker leaves for the controller: its :func:`collected` items.
COLLECTED_CHANNEL = _xdist.channel("collected")
_DESELECTED_KEY: pytest.StashKey[set[str]] = pytest.StashKey()
#: What a pytest-xdist worker leaves for the controller: its :func:`deselected` items.
DESELECTED_CHANNEL = _xdist.channel("deselected")


def collected(config: pytest.Config) -> dict[str, str]:
    """Every item this process collected, deselected ones included: node id -> config id.

    The matrix's collection hooks fill it in; the report lists it under
    ``coverage`` (with the items the xdist workers collected).
    """
    return config.stash.setdefault(_COLLECTED_KEY, {})


def deselected(config: pytest.Config) -> set[str]:
    """The node ids of the items this process collected and deselected (``-k``, ``-m``, ...)."""
    return config.stash.setdefault(_DESELECTED_KEY, set())


def send_to_controller(config: pytest.Config, items: dict[str, str]) -> None:
    """On a pytest-xdist worker: leave the collected ``items`` and :func:`deselected` ones."""
    _xdist.put(config, COLLECTED_CHANNEL, dict(items))
    _xdist.put(config, DESELECTED_CHANNEL, sorted(deselected(config)))


@dataclass
class Coverage:
    """One job's (or a merge's) collected items and what became of them."""

    #: node id -> config id ("" for an item without a backend config).
    collected: dict[str, str] = field(default_factory=dict)
    ran: set[str] = field(default_factory=set)
    #: node id -> skip reason (items that never ran).
    skipped: dict[str, str] = field(default_factory=dict)
    #: Items some job selected (collected and did not deselect), from the jobs whose
    #: report lists what they deselected (``lists_selection``); older reports do not.
    selected: set[str] = field(default_factory=set)
    lists_selection: bool = False

    def update(self, other: Coverage) -> None:
        """Join ``other`` into this coverage."""
        self.collected.update(other.collected)
        self.ran |= other.ran
        for nodeid, reason in other.skipped.items():
            self.skipped.setdefault(nodeid, reason)
        self.selected |= other.selected
        self.lists_selection |= other.lists_selection

    def to_plain(self) -> dict[str, Any]:
        """The JSON form written under ``coverage``."""
        plain: dict[str, Any] = {"collected": dict(sorted(self.collected.items()))}
        if self.lists_selection:
            plain["deselected"] = sorted(n for n in self.collected if n not in self.selected)
        plain["ran"] = sorted(self.ran)
        plain["skipped"] = {k: v for k, v in sorted(self.skipped.items()) if k not in self.ran}
        return plain


def parse_coverage(value: object) -> Coverage | str:
    """A :class:`Coverage` from its JSON form, or the message naming the bad field."""
    if not isinstance(value, dict):
        return "'coverage' must be an object"
    collected = value.get("collected", {})
    if not isinstance(collected, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in collected.items()
    ):
        return "'coverage.collected' must map node ids to config ids (strings)"
    ran = value.get("ran", [])
    if not isinstance(ran, list) or not all(isinstance(n, str) for n in ran):
        return "'coverage.ran' must be a list of node ids"
    skipped = value.get("skipped", {})
    if not isinstance(skipped, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in skipped.items()
    ):
        return "'coverage.skipped' must map node ids to skip reasons (strings)"
    if "deselected" not in value:  # written by an older pytest-backends
        return Coverage(dict(collected), set(ran), dict(skipped))
    dropped = value["deselected"]
    if not isinstance(dropped, list) or not all(isinstance(n, str) for n in dropped):
        return "'coverage.deselected' must be a list of node ids"
    selected = set(collected).difference(dropped)
    return Coverage(dict(collected), set(ran), dict(skipped), selected, lists_selection=True)


@dataclass
class CoverageGaps:
    """What ran in no job, by test, by configuration and by item."""

    #: base test id -> reason (deselected in every job, or a skip reason).
    tests: dict[str, str] = field(default_factory=dict)
    #: config id -> reason.
    configs: dict[str, str] = field(default_factory=dict)
    #: node ids of items whose test and config ran elsewhere, but not together.
    items: list[str] = field(default_factory=list)
    #: The subset of ``items`` that a job selected and never reached (it stopped early).
    unreached: list[str] = field(default_factory=list)
    #: The subset that fails a strict merge (never reported, or a config every job skipped).
    strict: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tests or self.configs or self.items)

    def lines(self) -> list[str]:
        """Warning lines for the terminal."""
        out: list[str] = []
        if self.tests:
            out.append(f"{len(self.tests)} collected test(s) ran in no job:")
            out += [f"  {test} ({why})" for test, why in sorted(self.tests.items())]
        if self.configs:
            out.append(f"{len(self.configs)} configuration(s) ran in no job:")
            out += [f"  {config} ({why})" for config, why in sorted(self.configs.items())]
        dropped = [n for n in self.items if n not in self.unreached]
        if dropped:
            out.append(
                f"{len(dropped)} item(s) were deselected in every job (their test and "
                "configuration ran elsewhere, not together):"
            )
            out += [f"  {nodeid}" for nodeid in dropped]
        if self.unreached:
            out.append(f"{len(self.unreached)} item(s) ran in no job: {UNREACHED}:")
            out += [f"  {nodeid}" for nodeid in self.unreached]
        return out


#: Why a selected item that was neither run nor skipped ran nowhere.
UNREACHED = (
    "selected, but never reached (the job stopped before it: -x, --maxfail, a crash or an "
    "interruption)"
)


def _base(nodeid: str, config: str) -> str:
    return base_test_id(nodeid, config) if config else nodeid


def _why(nodeids: Iterable[str], coverage: Coverage) -> tuple[str, bool]:
    """Why none of ``nodeids`` ran, and whether no job even reported them."""
    reasons = [coverage.skipped[n] for n in nodeids if n in coverage.skipped]
    if not reasons:
        if any(n in coverage.selected for n in nodeids):
            return UNREACHED, True
        return "deselected in every job", True
    first = reasons[0]
    return f"skipped in every job that ran it: {first}" if first else "skipped", False


def find_gaps(coverage: Coverage) -> CoverageGaps:
    """Every test, configuration and item of ``coverage`` that ran in no job."""
    gaps = CoverageGaps()
    by_test: dict[str, list[str]] = {}
    by_config: dict[str, list[str]] = {}
    for nodeid, config in coverage.collected.items():
        by_test.setdefault(_base(nodeid, config), []).append(nodeid)
        if config:
            by_config.setdefault(config, []).append(nodeid)
    ran = coverage.ran
    dead_tests = {t for t, ids in by_test.items() if not any(n in ran for n in ids)}
    dead_configs = {c for c, ids in by_config.items() if not any(n in ran for n in ids)}
    for test in sorted(dead_tests):
        why, never = _why(by_test[test], coverage)
        gaps.tests[test] = why
        if never:
            gaps.strict.append(test)
    for config in sorted(dead_configs):
        why, _never = _why(by_config[config], coverage)
        gaps.configs[config] = why
        gaps.strict.append(config)
    for nodeid, config in sorted(coverage.collected.items()):
        if nodeid in ran or _base(nodeid, config) in dead_tests or config in dead_configs:
            continue
        if nodeid not in coverage.skipped:  # a skip of its own is listed in the grid
            gaps.items.append(nodeid)
            gaps.strict.append(nodeid)
            if nodeid in coverage.selected:
                gaps.unreached.append(nodeid)
    return gaps


def missing_note(sources: Mapping[str, bool]) -> str | None:
    """A warning naming the sources whose report has no coverage lists."""
    without = [label for label, has in sources.items() if not has]
    if not without:
        return None
    return (
        f"coverage is not checked for {', '.join(without)}: the report lists no collected "
        "tests (written by an older pytest-backends)"
    )
