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

from pytest_backends._sources import MergeInputError, unique_label, version_warning
from pytest_backends.determinism.census import Census, Versions, read_census_file

__all__ = ["MergedCensus", "merge_censuses"]


@dataclass
class MergedCensus:
    """The merged census, its sources and any version warning."""

    census: Census
    sources: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)

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
        """Write the merged census file atomically."""
        self.census.write(
            Path(path),
            runs=self.runs,
            versions=self.versions,
            label="merged",
            sources=self.sources,
        )

    def summary_lines(self) -> list[str]:
        """What was merged and the nondeterministic ops, for the terminal."""
        lines = [f"merged {len(self.sources)} census(es):"]
        lines += [
            f"  [{i}] {s['label']}: {s.get('entries', '?')} op keys from {s['file']} "
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
            src["label"] = unique_label(str(src["label"]), taken, str(src.get("file", path)))
            sources.append(src)
        census.merge_data(one.to_data(), source=f"census file {path}")
    warnings = [w for w in [version_warning(sources, "censuses")] if w]
    return MergedCensus(census, sources, warnings)
