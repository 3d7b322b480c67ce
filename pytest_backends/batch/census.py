"""The batch-invariance census section and its baseline.

Tests marked ``@pytest.mark.batch_invariant`` give one verdict per
``(op, device, dtype)`` they ran: ``batch_variant`` (the op's output rows
differed between the full batch and a sub-batch for identical input rows),
``no_difference`` (compared at N sub-batch sizes and never seen to differ:
"no difference in N sizes", not a proof) or ``inconclusive`` (its inputs or
outputs could not be matched row by row). :class:`BatchCensus` adds them up
over tests and configs; its data is written as the ``batch_invariance``
section of the census JSON (:func:`pytest_backends.determinism.census.add_section`).

The baseline of accepted batch-variant ops is a baseline file like the
determinism one (:class:`~pytest_backends.determinism.census.Baseline`),
kept in its own file: CI fails only on a batch-variant op that it does not
accept. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_backends.determinism.census import Baseline, BaselineEntry, CensusFileError, Key

__all__ = ["SECTION", "VERDICTS", "BatchCensus", "updated_baseline"]

#: The census JSON key of the section.
SECTION = "batch_invariance"
#: Verdicts, strongest first.
VERDICTS = ("batch_variant", "no_difference", "inconclusive")


def _stronger(a: str | None, b: str) -> str:
    if a is None or VERDICTS.index(b) < VERDICTS.index(a):
        return b
    return a


@dataclass
class _Entry:
    verdict: str | None = None
    tests: set[str] = field(default_factory=set)
    variant_in: set[str] = field(default_factory=set)
    same_sizes: set[int] = field(default_factory=set)
    variant_sizes: set[int] = field(default_factory=set)
    configs: dict[str, str] = field(default_factory=dict)


def _key_of(row: Mapping[str, Any], where: str) -> Key:
    op = row.get("op")
    if not isinstance(op, str) or not op:
        raise CensusFileError(f"{where}: 'op' must be a non-empty string, got {op!r}")
    device, dtype = row.get("device"), row.get("dtype")
    for name, value in (("device", device), ("dtype", dtype)):
        if value is not None and not isinstance(value, str):
            raise CensusFileError(f"{where}: {name!r} must be a string or null, got {value!r}")
    return (op, device, dtype)


def _sizes(value: object, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise CensusFileError(f"{where} must be a list of integers, got {value!r}")
    return value


class BatchCensus:
    """Batch-invariance verdicts per ``(op, device, dtype)``, over tests and configs."""

    def __init__(self) -> None:
        self._entries: dict[Key, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add_test(self, nodeid: str, config: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Add one test's rows (``op, device, dtype, verdict, sizes``) run under ``config``.

        A batch-variant row's ``sizes`` are where it differed; its ``sizes_same``
        (optional) where it was compared without a difference.
        """
        for i, row in enumerate(rows):
            where = f"batch-invariance rows of {nodeid}[{i}]"
            key = _key_of(row, where)
            verdict = row.get("verdict")
            if verdict not in VERDICTS:
                raise CensusFileError(f"{where}: unknown verdict {verdict!r}")
            sizes = _sizes(row.get("sizes", []), f"{where}: 'sizes'")
            entry = self._entries.setdefault(key, _Entry())
            entry.verdict = _stronger(entry.verdict, verdict)
            entry.tests.add(nodeid)
            entry.configs[config] = _stronger(entry.configs.get(config), verdict)
            if verdict == "batch_variant":
                entry.variant_in.add(nodeid)
                entry.variant_sizes.update(sizes)
                entry.same_sizes.update(_sizes(row.get("sizes_same", []), f"{where}: 'sizes_same'"))
            elif verdict == "no_difference":
                entry.same_sizes.update(sizes)

    def merge_data(self, data: object, source: str) -> None:
        """Add a written section (another job's census) to this one; bad data names ``source``.

        Verdicts combine as within one run (batch-variant anywhere wins), the
        tests, configs and sizes are joined: the result does not depend on the
        order in which sections are merged.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("entries", []), list):
            raise CensusFileError(f"{source}: '{SECTION}' must be an object with an 'entries' list")
        for i, row in enumerate(data.get("entries", [])):
            where = f"{source}: {SECTION}.entries[{i}]"
            if not isinstance(row, Mapping):
                raise CensusFileError(f"{where} must be an object, got {row!r}")
            key = _key_of(row, where)
            verdict = row.get("verdict")
            if verdict not in VERDICTS:
                raise CensusFileError(f"{where}: unknown verdict {verdict!r}")
            configs = row.get("configs", {})
            if not isinstance(configs, Mapping) or not all(
                isinstance(c, str) and v in VERDICTS for c, v in configs.items()
            ):
                raise CensusFileError(f"{where}: 'configs' must map config ids to verdicts")
            lists = {}
            for name in ("tests", "batch_variant_in"):
                value = row.get(name, [])
                if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                    raise CensusFileError(f"{where}: {name!r} must be a list of test ids")
                lists[name] = value
            compared = _sizes(row.get("sizes_compared", []), f"{where}: 'sizes_compared'")
            differing = _sizes(row.get("sizes_differing", []), f"{where}: 'sizes_differing'")
            if verdict == "batch_variant" and not lists["batch_variant_in"]:
                raise CensusFileError(f"{where}: a batch-variant entry names no test")
            entry = self._entries.setdefault(key, _Entry())
            entry.verdict = _stronger(entry.verdict, str(verdict))
            entry.tests.update(lists["tests"])
            entry.variant_in.update(lists["batch_variant_in"])
            entry.variant_sizes.update(differing)
            entry.same_sizes.update(set(compared) - set(differing))
            for config, v in configs.items():
                entry.configs[config] = _stronger(entry.configs.get(config), str(v))

    def verdict(self, key: Key) -> str | None:
        """The verdict for ``key`` (the strongest over tests and configs), or None."""
        entry = self._entries.get(key)
        return entry.verdict if entry else None

    def variant(self) -> dict[Key, list[str]]:
        """Batch-variant keys and the tests in which they were."""
        return {
            key: sorted(entry.variant_in)
            for key, entry in sorted(self._entries.items(), key=lambda kv: _sort(kv[0]))
            if entry.verdict == "batch_variant"
        }

    def configs(self, key: Key) -> dict[str, str]:
        """The verdict for ``key`` under each config it ran in."""
        entry = self._entries.get(key)
        return dict(sorted(entry.configs.items())) if entry else {}

    def describe(self, key: Key) -> str:
        """``"batch-variant at sizes 1, 2"`` or ``"no difference in 3 sizes"``."""
        entry = self._entries[key]
        if entry.verdict == "batch_variant":
            return "batch-variant at sizes " + ", ".join(map(str, sorted(entry.variant_sizes)))
        if entry.verdict == "no_difference":
            n = len(entry.same_sizes)
            return f"no difference in {n} size{'s' if n != 1 else ''}"
        return "inconclusive (rows could not be matched through the op)"

    def to_data(self) -> dict[str, Any]:
        """The census section as JSON-ready data."""
        rows: list[dict[str, Any]] = []
        for key, entry in sorted(self._entries.items(), key=lambda kv: _sort(kv[0])):
            op, device, dtype = key
            row: dict[str, Any] = {
                "op": op,
                "device": device,
                "dtype": dtype,
                "verdict": entry.verdict,
                "description": self.describe(key),
                "sizes_compared": sorted(entry.same_sizes | entry.variant_sizes),
                "sizes_differing": sorted(entry.variant_sizes),
                "configs": dict(sorted(entry.configs.items())),
                "tests": sorted(entry.tests),
            }
            if entry.variant_in:
                row["batch_variant_in"] = sorted(entry.variant_in)
            rows.append(row)
        return {"verdicts": list(VERDICTS), "entries": rows}


def _sort(key: Key) -> tuple[str, str, str]:
    return (key[0], key[1] or "", key[2] or "")


def updated_baseline(baseline: Baseline, census: BatchCensus) -> Baseline:
    """The baseline after a run: the census's batch-variant ops are added, none removed."""
    kept = list(baseline.entries)
    added = [
        BaselineEntry(op, device or "none", dtype)
        for op, device, dtype in census.variant()
        if not any(entry.matches((op, device, dtype)) for entry in kept)
    ]
    entries = sorted([*kept, *added], key=lambda e: (e.op, e.device, e.dtype or ""))
    return Baseline(tuple(entries), baseline.versions)
