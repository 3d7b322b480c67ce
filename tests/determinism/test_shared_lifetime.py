"""Memory once shared with NumPy is read again at use only while something can still write it.

Found by the generated corpus (a deterministic body got "not checked" from the
Python recorder alone): an earlier test handed a tensor's memory to NumPy and
dropped both; the allocator gave the same address to a tensor of the next
test, and the Python recorder, which kept the dead entry, read that tensor's
whole covered memory at every use and found bytes that differ between runs.
The native recorder drops dead entries when a run starts; both must.
"""

from __future__ import annotations

import weakref

import pytest
import torch

from pytest_backends.determinism import outside
from pytest_backends.determinism.keys import storage_ptr
from pytest_backends.determinism.record_native import NativeRecorder, native_module
from pytest_backends.determinism.record_python import PythonRecorder


def _recorder(kind: str) -> object:
    if kind == "python":
        return PythonRecorder()
    module = native_module()
    if module is None:
        pytest.skip("the native extension is not built here")
    return NativeRecorder(module, None, True)


def _outside_ops(kind: str, x: torch.Tensor) -> list[int]:
    """The ops of one recorded run over ``x`` that read memory shared outside torch."""
    rec: object = _recorder(kind)
    with rec:  # type: ignore[attr-defined]
        (x * 2).sum()
    rec.finish()  # type: ignore[attr-defined]
    return list(rec.outside)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["python", "native"])
def test_a_dead_shared_entry_at_a_reused_address_is_not_read_again(kind: str) -> None:
    x = torch.ones(64)
    ghost = torch.empty(1)
    dead = weakref.ref(ghost)
    del ghost
    assert dead() is None
    ptr = storage_ptr(x)
    outside.SHARED[ptr] = dead  # what the NumPy-shared tensor that lived here left behind
    try:
        assert _outside_ops(kind, x) == []
        assert ptr not in outside.SHARED
    finally:
        outside.SHARED.pop(ptr, None)


@pytest.mark.parametrize("kind", ["python", "native"])
def test_memory_still_shared_is_read_again(kind: str) -> None:
    x = torch.ones(64)
    array = x.numpy()  # noqa: F841  NumPy can write x as long as this lives
    outside.install()
    outside.mark(x)
    try:
        assert _outside_ops(kind, x) != []
    finally:
        outside.SHARED.pop(storage_ptr(x), None)


def test_a_marked_storage_that_is_freed_leaves_the_shared_set_at_once() -> None:
    """Not at the next run: torch may allocate an op's output at that address meanwhile.

    Read as shared, that output's key would be its bytes in one run and its op in another
    (as the allocator's addresses fall): a false "inputs differ" (seen with the batch
    check's NumPy comparison inside a checked test, under the Python recorder).
    """
    import gc

    from pytest_backends.determinism.keys import storage_ptr

    t = torch.randn(16)
    outside.mark(t)
    ptr = storage_ptr(t)
    assert ptr in outside.SHARED
    del t
    gc.collect()
    assert ptr not in outside.SHARED
    # A temporary view that NumPy wrote (``w.detach().numpy()[:] += 1``) dies at once, but
    # the memory is the weight's: shared while the weight lives.
    weight = torch.randn(16)
    outside.mark(weight.detach())
    gc.collect()
    assert storage_ptr(weight) in outside.SHARED
    ptr = storage_ptr(weight)
    del weight
    gc.collect()
    assert ptr not in outside.SHARED
