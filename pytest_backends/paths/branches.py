"""Where two paths run different code, when no op parts from the other on its own.

:func:`~pytest_backends.paths.api.first_divergence` replays each op of one path
on the other's inputs. Code that reads a flag in Python escapes it: an op that
runs under one configuration only (``if torch.backends.mkldnn.enabled: y += 1``),
or an op whose tensor inputs agree but whose non-tensor argument was computed
from a flag (``h * (1.01 if flag else 1.0)``), or an op whose tensor input no
op of the run made and which differs between the paths (``torch.tensor(flag)``,
a NumPy array computed from a flag). Such an op is named here, rather than
calling the difference one that built up across ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from pytest_backends.paths.results import Identity, identity_only

__all__ = ["one_sided", "path_difference"]


def _scalars(record: Any) -> list[object] | None:
    """The non-tensor leaves of an op call's arguments (None where they were not kept)."""
    if record.args is None:
        return None
    leaves, _ = tree_flatten((record.args, record.kwargs))
    # A device differs between configurations of the device axis by design; an object
    # that compares by identity (a profiler's ScriptObject handle) is new in every run,
    # so only its type can be compared.
    return [
        Identity(f"{type(x).__module__}.{type(x).__qualname__}") if identity_only(x) else x
        for x in leaves
        if not isinstance(x, (torch.Tensor, torch.device))
    ]


def _outside_difference(record: Any, ref_record: Any) -> int | None:
    """The first tensor input no op of either run made that differs between them, or None."""
    pairs = zip(record.made, ref_record.made, record.inputs, ref_record.inputs)
    for i, (made, ref_made, a, b) in enumerate(pairs):
        if not (made or ref_made) and not _same_tensor(a, b):
            return i
    return None


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and values (a NaN equals a NaN at the same place)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def _equal(a: Sequence[object], b: Sequence[object]) -> bool:
    try:
        return len(a) == len(b) and all(x is y or bool(x == y) for x, y in zip(a, b))
    except Exception:  # a value without a truth value: by its text
        return repr(a) == repr(b)


def _short(values: Sequence[object]) -> str:
    text = ", ".join(repr(v) for v in values)
    return text if len(text) <= 80 else text[:77] + "..."


def path_difference(ref: Any, other: Any, skipped: Sequence[str] = ()) -> str | None:
    """The first op that only one path ran, or that got other arguments from outside the ops.

    Other non-tensor arguments, or another tensor input that no op of the run made;
    None where there is no such op. "First" is by the ops both paths ran before it:
    where a branch on one path comes before a value that differs on the other, the
    branch is named.

    ``ref`` and ``other`` are :class:`~pytest_backends.paths.api.ConfigRun`;
    ops whose names start with one of ``skipped`` (random ops) are not named.
    """
    skip = tuple(skipped)
    by_identity = {r.identity: r for r in ref.records}
    mine_ids = {r.identity for r in other.records}
    # (ops both paths ran before it, which comes first at a tie, the message)
    found: list[tuple[int, int, str]] = []
    before = 0
    for record in other.records:
        if record.name.startswith(skip):
            continue
        ref_record = by_identity.get(record.identity)
        if ref_record is None:
            alone = _alone_at(ref, mine_ids, record)
            found.append(
                (before, 0, one_sided(record.identity, other.config_id, ref.config_id, alone))
            )
            break
        differs = _argument_difference(record, ref_record, ref.config_id, other.config_id)
        if differs is not None:
            found.append((before, 2, differs))  # an op both ran: after a one-sided op
            break
        before += 1
    before = 0
    for record in ref.records:
        if record.name.startswith(skip):
            continue
        if record.identity not in mine_ids:
            alone = _alone_at(other, set(by_identity), record)
            found.append(
                (before, 1, one_sided(record.identity, ref.config_id, other.config_id, alone))
            )
            break
        before += 1
    return min(found)[2] if found else None


def _argument_difference(record: Any, ref_record: Any, ref_id: str, other_id: str) -> str | None:
    """Why an op both paths ran got other arguments from outside the ops; None if it did not."""
    outside = _outside_difference(record, ref_record)
    if outside is not None:
        return (
            f"{record.name} at {record.site} got another tensor input {outside} under "
            f"{other_id} than under {ref_id}, and no op of the run made it: a value from "
            "outside torch's ops that differs between the paths (a tensor made from a flag, "
            "torch.tensor(flag), or from a value read with .item(), or memory NumPy or Python "
            "wrote), not a kernel"
        )
    mine, theirs = _scalars(record), _scalars(ref_record)
    if mine is not None and theirs is not None and not _equal(mine, theirs):
        return (
            f"{record.name} at {record.site} got other non-tensor arguments under "
            f"{other_id} ({_short(mine)}) than under {ref_id} "
            f"({_short(theirs)}): a Python value that differs between the paths "
            "(computed from a flag, or read from a tensor with .item()), not a kernel"
        )
    return None


def _alone_at(run: Any, others: set[Any], record: Any) -> list[str]:
    """The ops of ``run`` not in ``others`` run from ``record``'s call site and module."""
    return [
        r.name
        for r in run.records
        if r.identity not in others and r.identity[1:3] == record.identity[1:3]
    ]


def one_sided(identity: Sequence[Any], side: str, other_side: str, theirs: Sequence[str]) -> str:
    """Why an op ran on one path only.

    ``identity`` is the op's ``(name, module, site, occurrence)``, ``side`` the
    path that ran it, ``theirs`` the ops only ``other_side`` ran from the same
    call site and module.  Ops on both sides from one call are torch choosing
    other ops for that call; only ops from a call one path alone made are a
    branch in the user's code.
    """
    name, _module, site, occurrence = identity[:4]
    if theirs:
        shown = ", ".join(dict.fromkeys(theirs))
        return (
            f"{name} at {site} ran under {side} only, where {other_side} ran {shown}: "
            "torch chose other ops for the same call under each path (its dispatcher "
            "picked another kernel or decomposition), not a branch in the user's code"
        )
    return (
        f"{name} at {site} ran under {side} only: the paths ran different ops, so the code "
        f"branches on a flag in Python (occurrence {occurrence} of that op at that call "
        "site), not a kernel"
    )
