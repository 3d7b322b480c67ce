"""Copies among the inputs of ``pytest-backends merge``: one run given twice.

A CI artifact downloaded into two folders, or a report copied next to the
original, holds the same run as another input. Merged as two sources, its
counts would be added twice (``10 passed`` for a job that ran 5 tests) and it
would appear as a second job under an invented label. An input whose
sources, configurations, results, coverage and session all equal an earlier
input's (only the file name differs) is that run again: it is merged once,
and a warning names both files. Two real runs never compare equal, since
each result carries its measured duration.

A report written by this version also names its run (``run``, an id made
when the session starts), and a merged report keeps each source's. A run's
report given beside a merged report that holds it (``merge staged.json
a.json``, where ``staged.json`` merged ``a.json``) is the same run again: the
input whose runs are all in another input is merged once, with a warning.
Two merged reports that share some runs but not all cannot be merged without
counting those runs twice: that is an input error naming both files.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from pytest_backends._sources import MergeInputError

__all__ = ["drop_contained", "drop_copies"]


class ReportInput(Protocol):
    """What is compared of a merge input (``merge.ReportInput``)."""

    sources: list[dict[str, Any]]
    configs: Any
    session: Any
    coverage: Any
    results: Any
    path: Any


_Input = TypeVar("_Input", bound=ReportInput)


def _sources(item: ReportInput) -> list[dict[str, Any]]:
    # A run's report names its own file as the source's file; a copy differs only there.
    return [{k: v for k, v in src.items() if k != "file"} for src in item.sources]


def _same_run(a: ReportInput, b: ReportInput) -> bool:
    return (
        len(a.results) == len(b.results)
        and _sources(a) == _sources(b)
        and a.configs == b.configs
        and a.session == b.session
        and a.coverage == b.coverage
        and a.results == b.results
    )


def drop_copies(inputs: Sequence[_Input]) -> tuple[list[_Input], list[str]]:
    """``inputs`` without those that repeat an earlier input's run, and a warning for each."""
    kept: list[_Input] = []
    warnings: list[str] = []
    for item in inputs:
        original = next((k for k in kept if _same_run(k, item)), None)
        if original is None:
            kept.append(item)
            continue
        why = ": the same results, durations and pytest verdict"
        warnings.append(_merged_once(item, original, why))
    return kept, warnings


def _merged_once(item: ReportInput, holder: ReportInput, why: str) -> str:
    labels = ", ".join(str(src.get("label")) for src in item.sources)
    return (
        f"{item.path} holds the same run as {holder.path} ({labels}{why}); merged once, "
        "so its tests and counts are not added twice"
    )


def _runs(item: ReportInput) -> frozenset[str] | None:
    """The run ids of every source of ``item``; None when a source has none (older reports)."""
    runs = [src.get("run") for src in item.sources]
    if not runs or not all(isinstance(r, str) and r for r in runs):
        return None
    return frozenset(runs)  # type: ignore[arg-type]


def drop_contained(inputs: Sequence[_Input]) -> tuple[list[_Input], list[str]]:
    """``inputs`` without those whose runs another input holds, and a warning for each.

    Raises :class:`MergeInputError` when two inputs share some runs but each
    has runs the other lacks.
    """
    runs = [_runs(item) for item in inputs]
    kept: list[_Input] = []
    warnings: list[str] = []
    for i, item in enumerate(inputs):
        mine = runs[i]
        holder = None
        if mine is not None:
            for j, other in enumerate(runs):
                if j == i or other is None or not mine & other:
                    continue
                if mine < other or (mine == other and j < i):
                    holder = inputs[j]
                    break
                if not mine <= other and not other <= mine:
                    shared = ", ".join(
                        str(src.get("label")) for src in item.sources if src.get("run") in other
                    )
                    raise MergeInputError(
                        f"{item.path} and {inputs[j].path} both hold the run(s) {shared}, "
                        "and each holds runs the other lacks: merged together, those runs "
                        "would be counted twice; give each job's report once (its own "
                        "file, or one merged report that holds it)"
                    )
        if holder is None:
            kept.append(item)
            continue
        warnings.append(_merged_once(item, holder, f", which {holder.path} holds already"))
    return kept, warnings
