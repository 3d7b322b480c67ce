"""Memory torch shares with something outside torch ops, which both recorders read again at use.

A tensor's key is reused while its version counter has not moved, but a write
that does not go through a torch op moves no version counter: NumPy writing
the array that ``tensor.numpy()`` (or ``np.asarray(tensor)``) returned, or the
array a ``torch.from_numpy`` tensor views. Such memory is *shared outside
torch*, and an op that reads it proves its input equal only by reading its
bytes at the op. Two ways find it:

* memory torch did not allocate (``from_numpy``, ``frombuffer``, DLPack)
  cannot be resized by torch, and memory shared with other processes
  (``share_memory_``, ``Module.share_memory``, ``torch.multiprocessing``) is
  ``is_shared()``: the recorders check both at a tensor's first use
  (:func:`owned_outside`; the native one in C++, alike);
* memory torch allocated and then handed to NumPy or another library:
  :func:`install` wraps ``torch.Tensor.numpy`` (``__array__`` calls it) and
  the DLPack exports (``Tensor.__dlpack__``, which ``np.from_dlpack`` calls,
  and ``torch.utils.dlpack.to_dlpack``) to note the storage.

Both recorders consult :data:`SHARED` (the native one through ``add_shared``).
Importing this module imports torch.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from pytest_backends.determinism.keys import storage_ptr

__all__ = [
    "SHARED",
    "THREADS",
    "install",
    "listen",
    "live",
    "mark",
    "owned_outside",
    "pruned",
    "started_count",
    "started_since",
    "unlisten",
]

#: Storage data pointer -> weak reference to a tensor on that storage.
SHARED: dict[int, Any] = {}
_LISTENERS: list[Callable[[int], object]] = []
#: Names of the threads started since :func:`install` (the last 64), so that a run can
#: name a thread that drew from a generator it shares, even one that already ended.
THREADS: list[str] = []
_started = 0
_installed = False


def mark(t: torch.Tensor) -> None:
    """Note ``t``'s storage as shared with something outside torch, while the storage lives.

    The entry goes the moment the storage is freed (every tensor on it dead): an
    op output torch later allocates at the same address, in the same run, is the
    op's, never read as shared memory (its key would differ from run to run with
    the allocator's addresses). It stays while any tensor on the storage lives
    (a module's weight that NumPy wrote through a temporary view). Where torch
    does not keep a storage's Python object for the storage's life (older
    releases), the entry follows ``t`` and is dropped when a run starts.
    """
    ptr = storage_ptr(t)
    if not ptr:
        return
    try:
        storage: Any = t.untyped_storage()
        follows = t.untyped_storage() is storage  # one Python object for the storage's life
    except (RuntimeError, TypeError, NotImplementedError):
        storage, follows = None, False

    def dropped(ref: weakref.ref[Any]) -> None:
        if SHARED.get(ptr) is ref:
            del SHARED[ptr]

    try:
        SHARED[ptr] = weakref.ref(storage, dropped) if follows else weakref.ref(t)
    except TypeError:
        return
    for listener in list(_LISTENERS):
        listener(ptr)


def owned_outside(t: torch.Tensor, storage: Any) -> bool:
    """Whether something outside this process's torch ops may write ``t``'s ``storage``.

    Memory torch did not allocate cannot be resized by torch (its owner, NumPy or
    a DLPack producer, writes it); a CPU storage in shared memory can be written by
    another process (``is_shared()``; on CUDA that method says True for every
    storage, so only CPU storages are asked).
    """
    return not storage.resizable() or (t.is_cpu and storage.is_shared())


def live() -> list[int]:
    """The data pointers of shared storages whose tensor is still alive (dead ones dropped)."""
    return list(pruned())


def pruned() -> dict[int, Any]:
    """:data:`SHARED` without the entries whose tensor died (dropped before each run).

    A dead entry's memory may since hold another tensor, which nothing outside
    torch can write; read as shared, its bytes would be compared where its key
    should be.
    """
    for ptr in [p for p, ref in SHARED.items() if ref() is None]:
        del SHARED[ptr]
    return SHARED


def listen(callback: Callable[[int], object]) -> None:
    """Call ``callback(ptr)`` for every storage marked from now on (a native recorder)."""
    _LISTENERS.append(callback)


def unlisten(callback: Callable[[int], object]) -> None:
    """Stop calling ``callback``."""
    if callback in _LISTENERS:
        _LISTENERS.remove(callback)


def install() -> None:
    """Wrap ``torch.Tensor.numpy`` once so that the memory it hands to NumPy is noted."""
    global _installed
    if _installed:
        return
    _installed = True
    # Conservative: a copy (``numpy(force=True)`` of a conjugate view) is marked too, and
    # costs only a digest per use.
    torch.Tensor.numpy = _marking(torch.Tensor.numpy)  # type: ignore[method-assign]
    _wrap_dlpack()

    import threading

    start = threading.Thread.start

    def started(self: threading.Thread) -> None:
        global _started
        THREADS.append(self.name)
        del THREADS[:-64]
        _started += 1
        start(self)

    started.__doc__ = start.__doc__
    threading.Thread.start = started  # type: ignore[method-assign]


def _wrap_dlpack() -> None:
    """Note the memory a DLPack export hands to another library (NumPy, CuPy, JAX).

    ``np.from_dlpack(t)`` calls ``t.__dlpack__()``; ``torch.utils.dlpack.to_dlpack``
    (also ``torch.to_dlpack``) makes the capsule directly. A name bound before
    :func:`install` ran (``from torch.utils.dlpack import to_dlpack`` at import)
    keeps the unwrapped function.
    """
    torch.Tensor.__dlpack__ = _marking(torch.Tensor.__dlpack__)  # type: ignore[method-assign]

    import torch.utils.dlpack as dlpack

    exporter: Any = getattr(dlpack, "to_dlpack")  # noqa: B009  (not in its __all__)
    dlpack.to_dlpack = _marking(exporter)  # type: ignore[attr-defined]
    if getattr(torch, "to_dlpack", None) is exporter:
        torch.to_dlpack = dlpack.to_dlpack  # type: ignore[attr-defined]


def _marking(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a function handing a tensor's memory out), marking that tensor."""

    @functools.wraps(original)
    def wrapper(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        handed = original(tensor, *args, **kwargs)
        mark(tensor)
        return handed

    return wrapper


def started_since(count: int) -> list[str]:
    """Names of the threads started after :func:`started_count` returned ``count``."""
    new = _started - count
    return THREADS[-new:] if new > 0 else []


def started_count() -> int:
    """How many threads have been started so far (for :func:`started_since`)."""
    return _started
