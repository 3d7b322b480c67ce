"""Sources of a merged report or census: unique labels and the torch/CUDA version check.

Shared by :mod:`pytest_backends.matrix.merge` and
:mod:`pytest_backends.determinism.census_merge`. A source is a plain dict
with at least ``file``, ``label``, ``torch`` and ``cuda``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_backends._files import FileFormatError, read_json

__all__ = ["MergeInputError", "load_json", "unique_label", "version_warning"]


class MergeInputError(Exception):
    """An input of ``pytest-backends merge`` cannot be used; the message names the file."""


def load_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`MergeInputError` naming the file otherwise.

    Reading goes through :func:`pytest_backends._files.read_json`, so special
    files, bad encodings, ``NaN`` and nesting too deep for the parser are
    refused the same way as the plugin's own inputs.
    """
    try:
        data = read_json(path, f"{what} {path}")
    except FileFormatError as exc:
        raise MergeInputError(str(exc)) from None
    if not isinstance(data, dict):
        raise MergeInputError(
            f"{what} {path}: expected a JSON object at the top level, got {type(data).__name__}"
        )
    return data


def unique_label(label: str, taken: set[str], file: str) -> str:
    """``label``, or ``label (file name)`` (then numbered) when another source has it."""
    if label not in taken:
        taken.add(label)
        return label
    candidate = f"{label} ({Path(file).name})"
    n = 2
    while candidate in taken:
        candidate = f"{label} ({Path(file).name} #{n})"
        n += 1
    taken.add(candidate)
    return candidate


def _describe(torch: object, cuda: object) -> str:
    return f"torch {torch or 'unknown'} (CUDA {cuda or 'none'})"


def version_warning(sources: Sequence[Mapping[str, Any]], what: str) -> str | None:
    """A warning naming each torch/CUDA version and its sources, or None when they agree."""
    groups: dict[str, list[str]] = {}
    for src in sources:
        key = _describe(src.get("torch"), src.get("cuda"))
        groups.setdefault(key, []).append(f"{src.get('label')} ({src.get('file')})")
    if len(groups) < 2:
        return None
    parts = "; ".join(f"{key}: {', '.join(names)}" for key, names in groups.items())
    return (
        f"the {what} come from different torch/CUDA versions ({parts}); they are merged, "
        "but results that differ between them may be version differences"
    )
