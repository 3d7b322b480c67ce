"""The ``backends.module_attributes`` row skips its dict comparison while no module was written.

The row reads the version tags of the ``torch.backends`` module dicts (CPython's
``ma_version_tag``, proved once per process by a probe) and returns its last state
while their sum is unchanged; the guard lists the threads again only when the tags
of ``threading``'s registries moved. A write of any kind must still be seen, and
where the probe fails the row compares the dicts as before and the threads are
listed each time.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from pytest_backends import _native
from pytest_backends.flags import module_attributes
from pytest_backends.flags.module_attributes import (
    module_attribute_row,
    probe_offset,
    version_offset,
    version_reader,
)
from pytest_backends.isolation.threads import ThreadOrigins
from pytest_backends.isolation.watch import WATCH

cpython_only = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="the version tag is CPython's"
)


@cpython_only
def test_the_probe_proves_the_tag_on_this_cpython() -> None:
    offset = version_offset()
    assert offset == 2 * ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)


@cpython_only
def test_the_probe_refuses_a_field_that_is_not_the_tag() -> None:
    word = ctypes.sizeof(ctypes.c_void_p)
    assert not probe_offset(word)  # the type pointer: writes never move it
    assert not probe_offset(2 * word)  # the size: replacing a value leaves it


def _native_or_skip() -> None:
    """Load the extension, or skip where it is not built (it sums the tags in C)."""
    if getattr(_native.load_cached(), "version_sum", None) is None:
        pytest.skip("the native extension is not built here")


@pytest.fixture(params=["native", "ctypes"])
def reader_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Either reader of the tags: the extension's C loop, or one memory view from Python."""
    if request.param == "native":
        _native_or_skip()
    else:
        monkeypatch.setattr(_native, "loaded", lambda: False)
    return str(request.param)


@cpython_only
def test_the_native_reader_reads_the_sum_the_memory_view_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _native_or_skip()
    dicts = [vars(types.ModuleType(f"probe{i}")) for i in range(5)]
    native = version_reader(dicts)
    assert isinstance(native, functools.partial)  # the extension's loop
    monkeypatch.setattr(_native, "loaded", lambda: False)
    python = version_reader(dicts)
    assert python is not None and not isinstance(python, functools.partial)
    assert native() == python()
    dicts[3]["x"] = 1
    assert native() == python()


@cpython_only
def test_every_kind_of_write_moves_the_sum_and_reads_do_not(reader_kind: str) -> None:
    modules = [types.ModuleType(f"probe{i}") for i in range(3)]
    read = version_reader([vars(m) for m in modules])
    assert read is not None
    assert isinstance(read, functools.partial) == (reader_kind == "native")
    writes: list[Callable[[], object]] = [
        lambda: setattr(modules[0], "a", 1),
        lambda: setattr(modules[2], "a", object()),
        lambda: setattr(modules[2], "a", object()),  # a new value, same size
        lambda: vars(modules[1]).update(b=2),
        lambda: delattr(modules[0], "a"),
        lambda: vars(modules[1]).pop("b"),
    ]
    last = read()
    for write in writes:
        write()
        now = read()
        assert now > last
        _ = [dict(vars(m)) for m in modules], vars(modules[2]).get("a")
        assert read() == now
        last = now


@pytest.fixture
def row() -> Iterator[tuple[Callable[[], object], Callable[[Any], None], Any]]:
    read, write, (plain, _check) = module_attribute_row(torch)
    yield read, write, plain
    write([])  # torch's own attributes


def _leaks(row: tuple[Callable[[], object], Callable[[Any], None], Any]) -> None:
    read, _write, plain = row
    first = read()
    assert read() is first, "an unchanged state is the same object"
    assert plain(first) == []
    torch.backends.nnpack.pytest_backends_probe = 1  # type: ignore[attr-defined]
    added = read()
    assert added != first
    assert any("nnpack.pytest_backends_probe = 1" in d for d in plain(added))
    torch.backends.nnpack.pytest_backends_probe = 2  # type: ignore[attr-defined]
    replaced = read()  # same size: only the tag (or the comparison) sees it
    assert replaced != added
    assert any("nnpack.pytest_backends_probe = 2" in d for d in plain(replaced))
    original = torch.backends.cpu.get_cpu_capability
    torch.backends.cpu.get_cpu_capability = lambda: "none"  # type: ignore[assignment]
    try:
        swapped = read()
        assert any("cpu.get_cpu_capability = " in d for d in plain(swapped))
    finally:
        torch.backends.cpu.get_cpu_capability = original
    del torch.backends.nnpack.pytest_backends_probe  # type: ignore[attr-defined]
    assert read() == first
    assert plain(read()) == []


@cpython_only
def test_the_row_reads_the_tags_and_sees_every_change(
    row: tuple[Callable[[], object], Callable[[Any], None], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = version_reader

    def counted(dicts: Any) -> Callable[[], int] | None:
        reader = real(dicts)
        assert reader is not None

        def read() -> int:
            calls.append(1)
            return reader()

        return read

    monkeypatch.setattr(module_attributes, "version_reader", counted)
    _leaks(row)
    assert calls, "the row never read the version tags"


def test_without_a_proved_tag_the_row_compares_the_dicts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(module_attributes, "version_offset", lambda: None)
    assert version_reader([{}]) is None
    read, write, (plain, _check) = module_attribute_row(torch)
    try:
        _leaks((read, write, plain))
    finally:
        write([])


def _listings(origins: ThreadOrigins) -> None:
    first = origins.alive()
    assert first == threading.enumerate()
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="pytest-backends-probe")
    thread.start()
    try:
        started = origins.alive()
        assert thread in started and thread not in first
        assert origins.alive() == started
    finally:
        release.set()
        thread.join()
    assert thread not in origins.alive()


@cpython_only
def test_the_thread_listing_is_kept_while_no_thread_starts_or_ends() -> None:
    origins = ThreadOrigins(WATCH)
    listing = origins.alive()
    assert origins.alive() is listing
    _listings(origins)


def test_without_a_proved_tag_the_threads_are_listed_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(module_attributes, "version_offset", lambda: None)
    origins = ThreadOrigins(WATCH)
    assert origins.alive() is not origins.alive()
    _listings(origins)
