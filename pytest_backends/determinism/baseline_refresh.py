"""Refresh a baseline from the census of the whole suite: add new ops, remove fixed ones.

A run's ``--backends-baseline-update`` only adds entries, because the run may
be one shard: an op that came out deterministic in its tests may be
nondeterministic in another shard's. Removing an entry needs the whole suite,
that is a census merged from every job (``pytest-backends merge --census``).
:func:`refresh` compares a baseline with such a census and says, for every
change, why it was made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_backends.determinism.census import (
    Baseline,
    BaselineEntry,
    Census,
    Key,
    device_type,
)

__all__ = ["Change", "Refresh", "describe_entry", "describe_key", "refresh", "unaccepted"]


def describe_key(key: Key) -> str:
    """``aten::index_add_ (cuda, float32)``."""
    op, device, dtype = key
    where = ", ".join(x for x in (device, dtype) if x)
    return f"{op} ({where})" if where else op


def describe_entry(entry: BaselineEntry) -> str:
    """``aten::index_add_ (cuda, every dtype)``."""
    return f"{entry.op} ({entry.device}, {entry.dtype or 'every dtype'})"


@dataclass(frozen=True)
class Change:
    """One entry added, removed or kept on purpose, and why."""

    entry: BaselineEntry
    reason: str


@dataclass
class Refresh:
    """The refreshed baseline and the changes from the old one."""

    baseline: Baseline
    added: list[Change] = field(default_factory=list)
    removed: list[Change] = field(default_factory=list)
    #: Entries kept although the census never settled their ops (not hit, or inconclusive).
    unsettled: list[Change] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The changes, one per line, for the terminal."""
        out = [f"added {describe_entry(c.entry)}: {c.reason}" for c in self.added]
        out += [f"removed {describe_entry(c.entry)}: {c.reason}" for c in self.removed]
        out += [f"kept {describe_entry(c.entry)}: {c.reason}" for c in self.unsettled]
        return out or ["no change: the baseline accepts exactly the census's nondeterministic ops"]


def _tests(tests: list[str]) -> str:
    shown = ", ".join(tests[:3])
    return shown + (f" (+{len(tests) - 3} more)" if len(tests) > 3 else "")


def refresh(baseline: Baseline, census: Census) -> Refresh:
    """Add the census's unaccepted nondeterministic ops; remove entries it shows fixed.

    An entry is removed when the census hit at least one key it matches and
    every such key came out deterministic (or raises under deterministic
    mode, which is reported, not hidden). It is kept, with its note, while one
    of its keys is nondeterministic, and when the census never settled its ops.
    """
    result = Refresh(baseline)
    kept: list[BaselineEntry] = []
    for entry in baseline.entries:
        keys = [k for k in census.op_keys() if entry.matches(k)]
        verdicts = {k: census.verdict(k) for k in keys}
        if any(v == "nondeterministic" for v in verdicts.values()):
            kept.append(entry)
            continue
        settled = {k: v for k, v in verdicts.items() if v != "inconclusive"}
        if not settled:
            why = (
                "no test in the census hit it"
                if not keys
                else "the census has only inconclusive verdicts for it"
            )
            result.unsettled.append(Change(entry, why))
            kept.append(entry)
            continue
        shown = "; ".join(
            f"{describe_key(k)} {(v or '').replace('_', ' ')}" for k, v in list(settled.items())[:3]
        )
        more = f" (+{len(settled) - 3} more)" if len(settled) > 3 else ""
        result.removed.append(
            Change(entry, f"every key it accepts came out without nondeterminism: {shown}{more}")
        )
    added: list[BaselineEntry] = []
    for key, tests in census.nondeterministic().items():
        if any(e.matches(key) for e in (*kept, *added)):
            continue
        op, device, dtype = key
        # A device type: "cuda:1" in a census matches "cuda", and is written so.
        new = BaselineEntry(op, device_type(device) or "none", dtype)
        added.append(new)
        result.added.append(Change(new, f"nondeterministic in {_tests(tests)}"))
    entries = sorted([*kept, *added], key=lambda e: (e.op, e.device, e.dtype or ""))
    result.baseline = Baseline(tuple(entries), baseline.versions)
    return result


def unaccepted(baseline: Baseline, census: Census) -> dict[Key, list[str]]:
    """The census's nondeterministic ops that ``baseline`` does not accept, with their tests."""
    return {k: t for k, t in census.nondeterministic().items() if not baseline.accepts(k)}
