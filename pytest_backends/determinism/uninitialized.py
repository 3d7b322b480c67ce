"""Uninitialised memory, as the Python recorder tracks it: which storages hold bytes no op wrote.

:class:`~pytest_backends.determinism.record_python.PythonRecorder` keeps a
table from a storage's address to a weak reference to the tensor that made
it uninitialised (``empty``, ``new_empty``, ...) and that op's name and
source line. An op that reads such memory is marked with that origin, so a
differing output that comes from it is reported as an uninitialised read; a
write that covers a whole storage makes it initialised again.

Importing this module imports torch: load it only when the harness runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from pytest_backends.determinism.keys import OpInfo, storage_ptr, tensors_in

__all__ = ["Taints", "clear_taint", "reads_tainted", "taint", "taint_of"]

#: Storage pointer -> (weak reference to a tensor keeping it alive, origin).
Taints = dict[int, tuple[Any, str]]


def taint(taints: Taints, t: torch.Tensor, origin: str, *, replace: bool = True) -> None:
    """Note that ``t``'s storage holds uninitialised memory from ``origin``.

    With ``replace=False`` a live entry for the storage keeps its origin.
    """
    ptr = storage_ptr(t)
    if not ptr:
        return
    if not replace:
        entry = taints.get(ptr)
        if entry is not None and entry[0]() is not None:
            return
    taints[ptr] = (weakref.ref(t), origin)


def taint_of(taints: Taints, t: torch.Tensor) -> str | None:
    """The origin of the uninitialised memory ``t`` is on, if any.

    An entry counts only while the tensor that created it is alive: after
    that, its address may belong to a new storage.
    """
    if not t.numel():
        return None
    ptr = storage_ptr(t)
    entry = taints.get(ptr)
    if entry is None:
        return None
    if entry[0]() is None:
        del taints[ptr]
        return None
    return entry[1]


def _read_tensors(
    info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any]
) -> Iterator[torch.Tensor]:
    skip = set(info.out_positions)
    if info.overwrites:
        skip.update(info.written)
    for i, a in enumerate(args):
        if i not in skip:
            yield from tensors_in(a)
    for name, v in kwargs.items():
        if name not in info.out_names:
            yield from tensors_in(v)


def reads_tainted(
    taints: Taints, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any]
) -> str | None:
    """The origin of the first uninitialised memory the op reads, if any."""
    for t in _read_tensors(info, args, kwargs):
        origin = taint_of(taints, t)
        if origin is not None:
            return origin
    return None


def clear_taint(taints: Taints, info: OpInfo, args: Sequence[Any]) -> None:
    """A write that covers a whole storage makes its memory initialised."""
    written = [args[i] for i in info.written if i < len(args)]
    for t in tensors_in(written):
        try:
            storage = t.untyped_storage()
            whole = t.is_contiguous() and t.numel() * t.element_size() == storage.nbytes()
        except (RuntimeError, NotImplementedError):
            continue
        if whole:
            taints.pop(int(storage.data_ptr()), None)
