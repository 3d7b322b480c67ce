"""The guard's access to torch's state: the flag registry, fingerprints and diffs.

A fingerprint (:meth:`~pytest_backends.flags.FlagRegistry.fingerprint`) is the
tuple of raw values of every row, cheap to take and to compare; it is turned
into plain values (and a diff) only when two fingerprints differ.  The guard
takes one before a test's setup and one after its teardown.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

__all__ = ["Fingerprint", "diff_lines", "registry"]

#: Raw values of every snapshot row, in the registry's order.
Fingerprint = tuple[object, ...]


@functools.cache
def registry() -> Any:
    """The flag registry of the running torch (imports torch on first use)."""
    # flags imports nothing heavy itself; the registry imports torch on first use
    from pytest_backends.flags import registry as flag_registry

    return flag_registry()


def diff_lines(diff: Mapping[str, tuple[object, object]]) -> str:
    """One ``name: before -> after`` line per changed flag.

    A switch the catalogue does not manage, or one torch cannot put back, says so
    on its line. A change of the torch-function mode stack names the modes: a
    default-device context as the default device it set and how to undo it
    (:func:`~pytest_backends.flags.mode_stack.stack_lines`).
    """
    from pytest_backends.flags import format_diff
    from pytest_backends.flags.mode_stack import stack_lines

    rows = registry().by_name
    named = stack_lines(diff)
    lines = []
    for name, change in diff.items():
        line = named.get(name)
        if line == "":
            continue  # said by another row's line
        if line is None:
            line = format_diff({name: change})
        row = rows.get(name)
        if row is not None and row.unmanaged:
            line = (
                f"  changed an unmanaged switch `{name}` (not restored: unknown to the "
                f"plugin): {change[0]!r} -> {change[1]!r}"
            )
        elif row is not None and row.unrestorable is not None:
            line += f" (cannot be restored: {row.unrestorable})"
        lines.append(line)
    return "\n".join(lines)
