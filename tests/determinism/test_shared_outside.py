"""Writers no recorder sees: other processes, DLPack consumers, threads a fixture started.

A key carried between runs, or reused within one, is proof only while nothing
outside the recorded ops can write the tensor's bytes. Three such writers:

* another process, through memory shared with it (``share_memory_``,
  ``Module.share_memory``, ``torch.multiprocessing``): the storage
  ``is_shared()``, so its bytes are read at every use, like NumPy's;
* a library the tensor was exported to by DLPack (``np.from_dlpack``):
  the export notes the storage, as ``Tensor.numpy`` does;
* another thread, alive during the runs though started before them (in a
  fixture), writing through ``.data`` (an alias with its own version counter):
  no key is carried from such a run.

Each writer that writes makes its test "not checked", never a blamed op; one
that does not leaves the test checked, and a nondeterministic op is still
blamed beside it. Both recorders give the same verdicts.
"""

from __future__ import annotations

import re

import pytest
from sessions import RECORDERS, unchecked

# Imported before any test loads the native extension (which must follow torch).
torch = pytest.importorskip("torch")

_CASES = """
import queue
import threading

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

CACHE = torch.zeros(4).share_memory_()
CALM = torch.zeros(4).share_memory_()
W = torch.zeros(4)
X = torch.ones(2, 4)


def _train(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def _fork(target, *args):
    p = mp.get_context("fork").Process(target=target, args=args)
    p.start()
    p.join()
    assert p.exitcode == 0


@pytest.fixture
def shared_model():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 1)
    m.share_memory()
    return m


@pytest.fixture
def updater():
    q = queue.Queue()

    def serve():
        while True:
            item = q.get()
            if item is None:
                return
            W.data.add_(item)
            q.task_done()

    t = threading.Thread(target=serve, name="updater", daemon=True)
    t.start()
    yield q
    q.put(None)
    t.join()


def test_shared_module_written_by_process(shared_model):
    with torch.no_grad():
        shared_model(X)
    _fork(_train, shared_model)


def test_shared_cache_written_by_process():
    (CACHE * 2).sum()
    _fork(CACHE.add_, 1.0)


def test_shared_memory_unwritten_is_checked():
    (CALM * 2).sum()
    (CALM * 3).sum()


def test_planted_op_on_shared_memory_is_blamed():
    torch.ops.pbtest.noisy(CALM + 1)
    torch.ops.pbtest.noisy(CALM)


def test_dlpack_export_written_by_numpy():
    t = torch.zeros(10)
    a = np.from_dlpack(t)
    # unseeded, made in the test: other numbers in every run (a reused RNG is reset)
    a += np.random.default_rng().random(10).astype(np.float32)
    (t * 2).sum()


def test_thread_from_fixture_writes_through_data(updater):
    (W * 2).sum()
    updater.put(1.0)
    updater.join()


def test_planted_op_beside_a_fixture_thread_is_blamed(updater):
    torch.ops.pbtest.noisy(X)
"""


@pytest.mark.parametrize("recorder", RECORDERS)
def test_writers_outside_the_recorded_ops_are_not_blamed(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared memory, a DLPack export and a fixture's thread: "not checked", by content."""
    pytest.importorskip("numpy")
    planted_conftest.makepyfile(test_writers=_CASES)
    result, out, reasons = unchecked(planted_conftest, recorder, monkeypatch)
    outside = "changed outside torch ops (NumPy, DLPack or another process?)"
    for name, op in (
        ("test_shared_module_written_by_process", "aten::t"),
        ("test_shared_cache_written_by_process", "aten::mul"),
        ("test_dlpack_export_written_by_numpy", "aten::mul"),
    ):
        assert f"of {op} {outside}" in reasons.get(name, ""), (name, out)
    assert "a tensor kept between runs" in reasons.get(
        "test_thread_from_fixture_writes_through_data", ""
    ), out
    assert "test_shared_memory_unwritten_is_checked" not in reasons, out
    # Only the planted op is ever blamed, also on shared memory and beside a thread.
    blamed = set(re.findall(r"nondeterministic op (\S+)", out))
    assert blamed == {"pbtest::noisy"}, out
    failed = set(re.findall(r"FAILED \S+::(\w+)", out))
    assert failed == {
        "test_planted_op_on_shared_memory_is_blamed",
        "test_planted_op_beside_a_fixture_thread_is_blamed",
    }, out
    result.assert_outcomes(passed=5, failed=2)


def test_dlpack_exports_note_the_storage() -> None:
    """``Tensor.__dlpack__`` and ``torch.utils.dlpack.to_dlpack`` mark the memory they export."""
    import torch.utils.dlpack

    from pytest_backends.determinism import outside
    from pytest_backends.determinism.keys import storage_ptr

    outside.install()
    a, b = torch.zeros(3), torch.zeros(3)
    a.__dlpack__()
    torch.utils.dlpack.to_dlpack(b)
    assert storage_ptr(a) in outside.pruned()
    assert storage_ptr(b) in outside.pruned()


def test_threads_of_the_session_machinery_are_not_counted() -> None:
    """A thread running at session start from code outside the rootdir is no writer."""
    import threading
    from pathlib import Path

    from pytest_backends.determinism.runs import note_session, writer_threads

    stop = threading.Event()
    plugin = threading.Thread(target=stop.wait, name="plugin-server", daemon=True)
    project = threading.Thread(target=lambda: stop.wait(), name="project", daemon=True)
    plugin.start()
    project.start()
    try:
        assert {"plugin-server", "project"} <= set(writer_threads())
        note_session(Path(__file__).parent)
        names = writer_threads()
        assert "plugin-server" not in names  # its code (threading.py) is outside the rootdir
        assert "project" in names  # its code is under the rootdir
    finally:
        stop.set()
