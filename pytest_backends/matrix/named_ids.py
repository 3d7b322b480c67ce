"""Node ids that name a matrix configuration: ``test_x.py::test_conv[mkldnn-off]``.

Such an item exists only once the matrix has expanded the test, so the
argument is collected without its ``[...]`` and narrowed afterwards. An id
that names an item the run does not have (the matrix is off, the sample or
``--backends-config`` left it out, a misspelt configuration) is a usage error
naming it, as pytest's own "not found" is, never a silent "deselected".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MATRIX_OFF", "missing_message", "narrow", "off_message"]

Wanted = Mapping[tuple[Path, str], set[str]]


def _split(nodeid: str) -> tuple[str, str, str]:
    """``(file part, "::" tail, tail without its [...])`` of ``nodeid``."""
    head, _, tail = nodeid.partition("::")
    start = tail.find("[", tail.rfind("::") + 1)
    return head, tail, tail[:start] if start >= 0 else tail


def narrow(
    items: Sequence[Any], wanted: Wanted
) -> tuple[list[Any], list[Any], dict[tuple[Path, str], list[str]]]:
    """``(kept, dropped, missing)``: the items named, the others of those tests, what none is.

    ``missing`` maps each test named with a configuration that no item has to
    the ``"::"`` tails of its items in this run.
    """
    kept: list[Any] = []
    dropped: list[Any] = []
    found: dict[tuple[Path, str], list[str]] = {}
    for item in items:
        _, tail, base = _split(item.nodeid)
        key = (Path(item.path).resolve(), base)
        names = wanted.get(key)
        if names is None:
            kept.append(item)
            continue
        found.setdefault(key, []).append(tail)
        (kept if tail in names else dropped).append(item)
    missing = {
        key: found.get(key, []) for key, names in wanted.items() if names - set(found.get(key, []))
    }
    return kept, dropped, missing


MATRIX_OFF = (
    "A configuration id in brackets names an item of the backends matrix, which is off: "
    "a marked test runs once, under the flags as they are. Add --backends-matrix to run "
    "its configurations, or give the test without the brackets."
)


def off_message(named: Sequence[str]) -> str:
    """The usage error for node ids that name configurations while the matrix is off."""
    return "\n".join(f"{arg}: not in this run" for arg in named) + "\n" + MATRIX_OFF


def missing_message(wanted: Wanted, missing: Mapping[tuple[Path, str], list[str]]) -> str:
    """The usage error for the named configurations no item of the matrix has."""
    lines = []
    for key, present in missing.items():
        path, _ = key
        absent = sorted(wanted[key] - set(present))
        have = ", ".join(present) if present else "none"
        lines.append(f"{path.name}::{', '.join(absent)}: not in this run (its items: {have})")
    return (
        "\n".join(lines) + "\n--backends-matrix=AXES, --backends-config or --backends-sample "
        "may leave a configuration out; the configuration ids are in the matrix report."
    )
