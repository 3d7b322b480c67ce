"""Torch's C++ switches read in one native call, for the fingerprint.

The guard takes two fingerprints per test. Read through Python, each C++ switch is
one binding call, and between tests (pytest's own code in the caches) those calls
cost several times what they cost in a loop. The native extension's
``read_switches()`` reads the switches it covers from ATen's context and
thread-local states into one bytes object, a *key*: equal whenever every covered
switch is equal.

The rows it covers form one :class:`~pytest_backends.flags.row.ReadGroup`. Its
raw values are each row's own ``read()``, taken when a key is first seen and kept
per key, so the fingerprint holds exactly what the rows read; a key costs one call.

Used only when the extension loads without compiling, on a torch whose CPU build
needs no build tooling to find it, or when the process already loaded it (the
determinism harness); ``PYTEST_BACKENDS_NATIVE=off`` turns it off with the rest of
the extension. Elsewhere every row is read through Python, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_backends.flags.row import Flag, ReadGroup

__all__ = ["native_group"]

#: Keys kept at most; past it the table starts again (fingerprints keep their values).
_KEPT = 4096


def _module(torch: Any) -> Any:
    """The loaded extension, when loading it costs no build; else None."""
    from pytest_backends import _native

    if _native.disabled():
        return None
    # a CUDA build of torch finds its toolkit through the build tooling (a slow import)
    if not _native.loaded() and (getattr(torch.version, "cuda", None) or not _native.built()):
        return None
    return _native.load_cached()


def _values(
    read_key: Callable[[], bytes], readers: tuple[Callable[[], object], ...]
) -> Callable[[], tuple[object, ...]]:
    """The group's reader: the rows' raw values, looked up by the key the switches make."""
    seen: dict[bytes, tuple[object, ...]] = {}

    def fresh(key: bytes) -> tuple[object, ...]:
        # Another thread may change a switch while the rows are read: a key is kept
        # only when it is the same before and after its values were read.
        for _ in range(3):
            values = tuple([read() for read in readers])
            after = read_key()
            if after == key:
                if len(seen) >= _KEPT:
                    seen.clear()
                seen[key] = values
                return values
            key = after
        return values

    # the last key and its values: most reads find the switches as the last one did,
    # and comparing two keys costs less than hashing one
    last: list[tuple[bytes, tuple[object, ...]]] = [(b"", ())]

    def read() -> tuple[object, ...]:
        key = read_key()
        known = last[0]
        if key == known[0]:
            return known[1]
        values = seen.get(key)
        if values is None:
            values = fresh(key)
            if seen.get(key) is not values:  # not kept: the switches moved while read
                return values
        last[0] = (key, values)
        return values

    return read


def native_group(torch: Any, by_name: Mapping[str, Flag]) -> ReadGroup | None:
    """The rows the native reader covers, read as one group; None where it is not used."""
    try:
        module = _module(torch)
        names = [n for n in module.switch_names() if n in by_name] if module else []
    except Exception:  # an extension without the reader, or one that fails: Python reads
        return None
    if len(names) < 2:
        return None
    readers = tuple(by_name[n].read for n in names)
    return ReadGroup(tuple(names), _values(module.read_switches, readers))
