"""Where two paths run different code, when no op parts from the other on its own.

:func:`~pytest_backends.paths.api.first_divergence` replays each op of one path
on the other's inputs. Code that reads a flag in Python escapes it: an op that
runs under one configuration only (``if torch.backends.mkldnn.enabled: y += 1``),
or an op whose tensor inputs agree but whose non-tensor argument was computed
from a flag (``h * (1.01 if flag else 1.0)``). Such an op is named here, rather
than calling the difference one that built up across ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["path_difference"]


def _scalars(record: Any) -> list[object] | None:
    """The non-tensor leaves of an op call's arguments (None where they were not kept)."""
    if record.args is None:
        return None
    leaves, _ = tree_flatten((record.args, record.kwargs))
    # A device differs between configurations of the device axis by design.
    return [x for x in leaves if not isinstance(x, (torch.Tensor, torch.device))]


def _equal(a: Sequence[object], b: Sequence[object]) -> bool:
    try:
        return len(a) == len(b) and all(x is y or bool(x == y) for x, y in zip(a, b))
    except Exception:  # a value without a truth value: by its text
        return repr(a) == repr(b)


def _short(values: Sequence[object]) -> str:
    text = ", ".join(repr(v) for v in values)
    return text if len(text) <= 80 else text[:77] + "..."


def path_difference(ref: Any, other: Any, skipped: Sequence[str] = ()) -> str | None:
    """The first op that only one path ran, or that got other non-tensor arguments; or None.

    ``ref`` and ``other`` are :class:`~pytest_backends.paths.api.ConfigRun`;
    ops whose names start with one of ``skipped`` (random ops) are not named.
    """
    by_identity = {r.identity: r for r in ref.records}
    seen = set()
    for record in other.records:
        seen.add(record.identity)
        if record.name.startswith(tuple(skipped)):
            continue
        ref_record = by_identity.get(record.identity)
        if ref_record is None:
            return _only(record, other.config_id)
        mine, theirs = _scalars(record), _scalars(ref_record)
        if mine is not None and theirs is not None and not _equal(mine, theirs):
            return (
                f"{record.name} at {record.site} got other non-tensor arguments under "
                f"{other.config_id} ({_short(mine)}) than under {ref.config_id} "
                f"({_short(theirs)}): a Python value that differs between the paths "
                "(computed from a flag, or read from a tensor with .item()), not a kernel"
            )
    for record in ref.records:
        if record.identity not in seen and not record.name.startswith(tuple(skipped)):
            return _only(record, ref.config_id)
    return None


def _only(record: Any, config_id: str) -> str:
    return (
        f"{record.name} at {record.site} ran under {config_id} only: the paths ran different "
        "ops, so the code branches on a flag in Python (occurrence "
        f"{record.identity[3]} of that op at that call site), not a kernel"
    )
