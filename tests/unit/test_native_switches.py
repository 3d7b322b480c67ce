"""The native switch key: every switch it covers moves it, and the fingerprint agrees with the rows.

The fingerprint reads the rows the native extension covers through one key and keeps
each row's own ``read()`` per key (:mod:`pytest_backends.flags.native_switches`). The
key is only right if every covered row's change changes it: each covered row is set to
another value here, through the registry's writer, and the key must follow. A corpus of
combined changes (hypothesis) must give the same plain values as every row read alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from fingerprint_corpus import Change, disagreements, oracle
from test_flags import _other_value

from pytest_backends import _native, override_flags
from pytest_backends.flags import Flag, FlagRegistry
from pytest_backends.flags.catalogue import build_catalogue

#: The torch versions whose every covered switch this file moves: the reader covers them.
COVERED_VERSIONS = ((2, 13), (2, 14))


def _extension() -> Any:
    module = _native.load()
    if module is None:
        pytest.skip(f"native extension unavailable: {_native.unavailable_reason()}")
    version = tuple(int(p) for p in torch.__version__.split(".")[:2])
    if version in COVERED_VERSIONS:
        assert len(module.switch_names()) >= 80, "the native switch key covers too few switches"
    elif not module.switch_names():
        pytest.skip(f"the native switch reader covers no switch on torch {torch.__version__}")
    return module


@pytest.fixture(scope="module")
def native() -> Any:
    return _extension()


@pytest.fixture(scope="module")
def fast() -> FlagRegistry:
    _extension()
    return FlagRegistry(torch, *build_catalogue(torch))


def _covered(reg: FlagRegistry) -> list[Flag]:
    group = next(
        (r.group for r in reg.snapshot_rows if r.group and "cudnn.enabled" in r.group.names),
        None,
    )
    assert group is not None, "no row is read through the native key"
    return [reg.by_name[name] for name in group.names]


def _changed(row: Flag) -> Iterator[None] | None:
    """``row`` set to another value (None when this build refuses every other value)."""
    if row.name == "autograd.inference_mode":
        return torch.inference_mode()  # type: ignore[return-value]
    value = _other_value(row, row.plain(row.read()))
    try:
        with override_flags({row.name: value}):
            pass
    except ValueError:  # e.g. MAGMA on a CPU build: the switch cannot move here
        return None
    return override_flags({row.name: value})  # type: ignore[return-value]


def test_every_covered_switch_moves_the_key(native: Any, fast: FlagRegistry) -> None:
    covered = _covered(fast)
    assert {r.name for r in covered} == set(native.switch_names()) & set(fast.by_name)
    before, plain = native.read_switches(), fast.to_plain(fast.fingerprint())
    moved: list[str] = []
    refused: list[str] = []
    for row in covered:
        change = _changed(row)
        if change is None:
            refused.append(row.name)
            continue
        with change:  # type: ignore[attr-defined]
            assert native.read_switches() != before, f"{row.name} changed, the key did not"
            assert fast.to_plain(fast.fingerprint()) == oracle(fast), row.name
        # put back as the rows read it (an unset optional may come back set to its default)
        assert fast.to_plain(fast.fingerprint()) == plain, row.name
        moved.append(row.name)
    assert len(moved) >= 50, (moved, refused)
    assert len(refused) <= 5, refused


def _apply(row: Flag) -> Callable[[], None]:
    """Enter ``row``'s change; its exit is the undo."""
    change: Any = _changed(row)
    change.__enter__()
    return lambda: change.__exit__(None, None, None)


def test_the_fingerprint_is_the_rows_own_values_in_any_combination(fast: FlagRegistry) -> None:
    changes: list[Change] = [
        (row.name, lambda row=row: _apply(row)) for row in _covered(fast) if _changed(row)
    ]
    assert disagreements(fast, changes, max_size=6) == {"cases": 60, "disagreements": 0}


def test_a_thread_reads_its_own_thread_local_switches(fast: FlagRegistry) -> None:
    """Grad mode is per thread: the key a thread reads is its own."""
    got: dict[str, object] = {}

    def worker() -> None:
        with torch.no_grad():
            got["plain"] = fast.to_plain(fast.fingerprint())["autograd.grad_enabled"]

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert got == {"plain": False}
    assert fast.to_plain(fast.fingerprint())["autograd.grad_enabled"] is True


def test_without_the_extension_every_row_is_read_through_python(
    fast: FlagRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    slow = FlagRegistry(torch, *build_catalogue(torch))
    assert not any(r.group and "cudnn.enabled" in r.group.names for r in slow.snapshot_rows)
    assert len(slow.fingerprint()) > len(fast.fingerprint()) + 40
    assert slow.to_plain(slow.fingerprint()) == fast.to_plain(fast.fingerprint()) == oracle(slow)


def test_a_key_is_kept_only_when_no_switch_moved_while_its_rows_were_read() -> None:
    """A switch another thread changes between the key and the rows' reads is read again."""
    from pytest_backends.flags.native_switches import _values

    state = {"switch": 0}
    keys = iter([b"a", b"b", b"b", b"b"])

    def read_key() -> bytes:
        return next(keys)

    def read_row() -> object:
        state["switch"] += 1  # the row moves once, between the first key and its read
        return "moved" if state["switch"] > 1 else "first"

    read: Callable[[], tuple[object, ...]] = _values(read_key, (read_row,))
    assert read() == ("moved",)  # key a, row read, key b: read again under key b
    assert read() == ("moved",)  # key b kept with the values read under it
    assert state["switch"] == 2
