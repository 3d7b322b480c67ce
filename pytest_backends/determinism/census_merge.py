"""Merge the censuses of several jobs (CI shards, machines) into the census of the whole suite.

Every input's observations are added up per ``(op, device, dtype)``, so the
merged verdict follows the same rule as within one run: nondeterministic in
any source wins, then "raises under deterministic mode", then deterministic;
an op is inconclusive only where no source settled it. The test lists are
joined. The merged file lists its inputs under ``sources``. Merging a merged
census again gives the same result as merging its inputs.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_backends._files import CENSUS, read_json
from pytest_backends._sources import MergeInputError, unique_label, version_warning
from pytest_backends.batch.census import SECTION as BATCH_SECTION
from pytest_backends.batch.census import BatchCensus
from pytest_backends.determinism.census import (
    Census,
    CensusFileError,
    Versions,
    atomic_write_json,
    read_census_file,
)

__all__ = ["MergedCensus", "merge_censuses"]


@dataclass
class MergedCensus:
    """The merged census, its sources and any version warning."""

    census: Census
    sources: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    #: Top-level fields of the inputs that this version does not know, joined.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        """The fewest runs per test of any source (what every verdict rests on at least)."""
        runs = [s["runs"] for s in self.sources if isinstance(s.get("runs"), int)]
        return min(runs) if runs else 0

    @property
    def versions(self) -> Versions:
        """The sources' torch and CUDA versions (comma-separated where they differ)."""
        torch = list(dict.fromkeys(str(s.get("torch")) for s in self.sources))
        cuda = list(dict.fromkeys(str(s["cuda"]) for s in self.sources if s.get("cuda")))
        return Versions(", ".join(torch), ", ".join(cuda) or None)

    def write(self, path: Path) -> None:
        """Write the merged census file atomically (with the inputs' unknown fields)."""
        self.census.write(
            Path(path),
            runs=self.runs,
            versions=self.versions,
            label="merged",
            sources=self.sources,
        )
        if self.extra:
            data = read_json(Path(path), f"census file {path}")
            assert isinstance(data, dict)
            missing = {k: v for k, v in self.extra.items() if k not in data}
            if missing:
                atomic_write_json(Path(path), {**data, **missing}, CENSUS)

    def summary_lines(self) -> list[str]:
        """What was merged and the nondeterministic ops, for the terminal."""
        lines = [f"merged {len(self.sources)} census(es):"]
        lines += [
            f"  [{i}] {s['label']}: {s.get('entries', '?')} op keys from {s.get('file')} "
            f"(torch {s.get('torch')}, {s.get('runs')} runs)"
            for i, s in enumerate(self.sources, 1)
        ]
        nondet = self.census.nondeterministic()
        lines.append(f"{len(self.census)} op keys; {len(nondet)} nondeterministic")
        for (op, device, dtype), tests in nondet.items():
            where = ", ".join(x for x in (device, dtype) if x)
            lines.append(f"  {op} ({where}): in {len(tests)} test(s), e.g. {tests[0]}")
        return lines


def merge_censuses(paths: Sequence[Path]) -> MergedCensus:
    """Merge the census files ``paths``; a bad file raises an error that names it."""
    if not paths:
        raise MergeInputError("no census files to merge")
    census = Census()
    sources: list[dict[str, Any]] = []
    taken: set[str] = set()
    extra: dict[str, Any] = {}
    batch: BatchCensus | None = None
    for path in map(Path, paths):
        data, versions, one = read_census_file(path)
        nested = data.get("sources")
        if (
            isinstance(nested, list)
            and nested
            and all(isinstance(s, dict) and isinstance(s.get("label"), str) for s in nested)
        ):
            found = [dict(s) for s in nested]
        else:
            label = data.get("label")
            found = [
                {
                    "file": str(path),
                    "label": label if isinstance(label, str) and label else path.stem,
                    "torch": versions.torch,
                    "cuda": versions.cuda,
                    "runs": data.get("runs"),
                    "entries": len(one),
                }
            ]
        for src in found:
            src.setdefault("file", str(path))
            src["label"] = unique_label(str(src["label"]), taken, str(src["file"]))
            sources.append(src)
        _check_counts(path, data)
        census.merge_data(one.to_data(), source=f"census file {path}")
        _merge_checks(path, data, census)
        _merge_extra(path, data, extra)
        if BATCH_SECTION in data:
            batch = batch or BatchCensus()
            try:
                batch.merge_data(data[BATCH_SECTION], f"census file {path}")
            except CensusFileError as exc:
                raise MergeInputError(str(exc)) from None
    if batch is not None:
        extra[BATCH_SECTION] = batch.to_data()
    warnings = [w for w in [version_warning(sources, "censuses")] if w]
    return MergedCensus(census, sources, warnings, extra)


#: Top-level census fields this module reads or :meth:`Census.write` writes.
_KNOWN = frozenset(
    ("format", "version", "torch", "cuda", "runs", "label", "sources", "entries")
) | {"not_checked", "boundary", BATCH_SECTION}


def _fail(path: Path, message: str) -> MergeInputError:
    return MergeInputError(f"census file {path}: {message}")


def _check_counts(path: Path, data: dict[str, Any]) -> None:
    """Observation counts are non-negative: a negative one would cancel another input's."""
    for i, row in enumerate(data.get("entries") or []):
        counts = row.get("observations", {}) if isinstance(row, dict) else {}
        if not isinstance(counts, dict):
            continue  # Census.merge_data names the field
        for verdict, n in counts.items():
            if isinstance(n, int) and n < 0:
                raise _fail(
                    path, f"entries[{i}].observations.{verdict} must not be negative, got {n}"
                )
    runs = data.get("runs")
    if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 0):
        raise _fail(path, f"'runs' must be a non-negative integer, got {runs!r}")


def _merge_checks(path: Path, data: dict[str, Any], census: Census) -> None:
    """Join the inputs' "not checked" tests and boundary notes (nothing is dropped)."""
    not_checked = data.get("not_checked", {})
    if not isinstance(not_checked, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in not_checked.items()
    ):
        raise _fail(path, "'not_checked' must map test ids to reasons (strings)")
    boundary = data.get("boundary", {})
    if not isinstance(boundary, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v)
        for k, v in boundary.items()
    ):
        raise _fail(path, "'boundary' must map test ids to lists of notes (strings)")
    for nodeid, reason in not_checked.items():
        census.not_checked.setdefault(nodeid, reason)
    for nodeid, notes in boundary.items():
        known = census.boundary.setdefault(nodeid, [])
        known += [n for n in notes if n not in known]


def _merge_extra(path: Path, data: dict[str, Any], extra: dict[str, Any]) -> None:
    """Keep fields a newer pytest-backends wrote: objects and lists are joined, else the first."""
    for key, value in data.items():
        if key in _KNOWN:
            continue
        if key not in extra:
            extra[key] = value
        elif isinstance(value, dict) and isinstance(extra[key], dict):
            extra[key] = {**value, **extra[key]}
        elif isinstance(value, list) and isinstance(extra[key], list):
            extra[key] = extra[key] + [v for v in value if v not in extra[key]]
