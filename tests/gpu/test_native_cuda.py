"""The CUDA digest kernel and the repeat loop on a GPU (skipped without one).

The CUDA kernel must give the same values as the CPU kernel and the torch-ops
fallback, stay on the device (no host sync), and be deterministic itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from pytest_backends import _native
from pytest_backends.determinism.digest import digest, digest_bytes, digest_many, repeat

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    *[getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)],
]


@pytest.fixture(scope="module")
def native_cuda() -> ModuleType:
    module = _native.load()
    if module is None:
        pytest.fail(f"native extension unavailable: {_native.unavailable_reason()}")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("pytest_backends::digest", "CUDA"):
        pytest.fail("the native extension was built without its CUDA kernel")
    return module


def _random_bits(numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        raw = raw & 1
    return raw.view(dtype)


def _big() -> torch.Tensor:
    return _random_bits(3_000_001, torch.float16, seed=1)  # > one block, odd byte count


# Built inside the test, so that collecting (or skipping) allocates nothing.
CASES: dict[str, Callable[[], torch.Tensor]] = {
    **{f"small-{d}": functools.partial(_random_bits, 37, d) for d in DTYPES},
    "big-fp16": _big,
    "big-offset-2": lambda: _big()[1:],  # not 8-byte aligned: byte loads
    "big-offset-8": lambda: _random_bits(1 << 20, torch.float32, seed=2)[2:],  # 8, not 16
    # many 16-byte loads per thread: the unrolled loop, its remainder and the word tail
    "big-32mb": lambda: _random_bits((8 << 20) + 3, torch.float32, seed=4),
    "transpose": lambda: _random_bits(999 * 77, torch.float32, seed=3).reshape(999, 77).t(),
    "empty": lambda: torch.zeros(0, 5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cuda_digest_equals_cpu_and_fallback(native_cuda: ModuleType, name: str) -> None:
    host = CASES[name]()
    dev = host.cuda()
    d = digest(dev, backend="native")
    assert d.device == dev.device
    cpu = digest_bytes(host, backend="native")
    assert digest_bytes(dev, backend="native") == cpu
    assert digest_bytes(dev, backend="python") == cpu


@pytest.mark.parametrize("backend", ["native", "python"])
def test_digest_does_not_synchronise(native_cuda: ModuleType, backend: str) -> None:
    x = torch.randn(1 << 20, device="cuda")
    digest(x, backend=backend)  # warm up allocations
    torch.cuda.set_sync_debug_mode("error")
    try:
        digest(x, backend=backend)
        digest(x[1:], backend=backend)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_bit_flips_are_detected_on_the_device(native_cuda: ModuleType) -> None:
    x = torch.randn(1 << 22, device="cuda")
    flipped = []
    for byte in (0, 12345, x.numel() * 4 - 1):
        y = x.clone()
        y.view(torch.uint8)[byte] ^= 0x10
        flipped.append(y)
    digests = digest_many([x, *flipped], backend="native")
    assert len(set(digests)) == 4


def test_digest_kernel_is_deterministic(native_cuda: ModuleType) -> None:
    x = torch.randn(1 << 24, device="cuda")
    assert len(set(digest_many([x] * 20, backend="native"))) == 1


def test_repeat_on_cuda_matches_python(native_cuda: ModuleType) -> None:
    a = torch.randn(64, 128, device="cuda")
    b = torch.randn(128, 32, device="cuda")
    native = repeat(torch.ops.aten.mm.default, (a, b), runs=10, backend="native")
    python = repeat(torch.ops.aten.mm.default, (a, b), runs=10, backend="python")
    assert native == python
    assert set(native) == {digest_bytes(a @ b, backend="python")}


def test_index_add_is_reproducible_under_deterministic_mode(native_cuda: ModuleType) -> None:
    from pytest_backends import override_flags

    gen = torch.Generator(device="cuda").manual_seed(0)
    target = torch.zeros(8, 64, device="cuda")
    index = torch.randint(0, 8, (100_000,), device="cuda", generator=gen)
    source = torch.randn(100_000, 64, device="cuda", generator=gen)
    with override_flags({"deterministic_algorithms": True}):
        runs = repeat(torch.ops.aten.index_add_.default, (target, 0, index, source), runs=10)
    assert len(set(runs)) == 1
