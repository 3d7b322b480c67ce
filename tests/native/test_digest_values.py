"""The digest's values are pinned, order-sensitive and equal on every kernel path.

A pure-Python oracle (Python integers, written from the documented algorithm)
computes the digest of small tensors; the native kernel on every instruction
set path this CPU has (AVX-512, AVX2, scalar) and the torch-ops fallback must
agree with it and with the pinned constants below. The constants change only
with the digest's format version.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_backends.determinism import digest as digest_mod
from pytest_backends.determinism.digest import digest_bytes, digest_many

M64 = (1 << 64) - 1
KEYS = ((0x9E3779B97F4A7C15, 0x243F6A8885A308D3), (0xD6E8FEB86659FD93, 0x13198A2E03707344))
MIXERS = (
    (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33),
    (30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31),
)
PATHS = ("avx512", "avx2", "scalar")


def _mix(x: int, lane: int) -> int:
    s1, m1, s2, m2, s3 = MIXERS[lane]
    x ^= x >> s1
    x = (x * m1) & M64
    x ^= x >> s2
    x = (x * m2) & M64
    return x ^ (x >> s3)


def oracle(t: torch.Tensor) -> bytes:
    """The digest computed word by word with Python integers."""
    data = bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).tolist())
    nbytes = len(data)
    padded = data + bytes(-nbytes % 8)
    words = [int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8)]
    header = [2, digest_mod.dtype_code(t.dtype), t.dim(), *t.shape, nbytes]
    lanes = []
    for lane, (key, seed) in enumerate(KEYS):
        total = 0
        for i, w in enumerate(words):
            x = w ^ ((i * key + seed) & M64)
            lo, hi = x & 0xFFFFFFFF, x >> 32
            r = x if lane == 0 else (lo << 32) | hi
            total = (total + r + lo * hi) & M64
        h = seed
        for v in header:
            h = _mix(h ^ (v & M64), lane)
        lanes.append(_mix(h ^ total, lane))
    return b"".join(v.to_bytes(8, "little") for v in lanes)


def _pattern(n: int) -> torch.Tensor:
    """``n`` bytes of a fixed, RNG-free pattern."""
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 2654435761 + (i >> 7) * 40503) % 251).to(torch.uint8)


def _fixed() -> dict[str, torch.Tensor]:
    return {
        "arange-int64-10": torch.arange(10, dtype=torch.int64),
        "float32-3x5": torch.linspace(-1.0, 1.0, 15, dtype=torch.float32).reshape(3, 5),
        "bf16-odd-7": torch.arange(7, dtype=torch.float32).to(torch.bfloat16),
        "uint8-1027": _pattern(1027),
        "float64-scalar": torch.tensor(-0.0, dtype=torch.float64),
        "uint8-300001": _pattern(300_001),  # crosses the kernel's per-thread grain
    }


PINNED = {
    "arange-int64-10": "ee634ec9539b9a4a94a77fd39a1119c1",
    "float32-3x5": "6f5f5d26142bf4757f1d5d293835a322",
    "bf16-odd-7": "3cfefb6578c0c418c4101e901f676872",
    "uint8-1027": "b19a64f6f2da771178e5092ff074933c",
    "float64-scalar": "572abe151f5065c5e78a06650ed9b2cd",
    "uint8-300001": "67dd60f9c2a634833eb98298530d57c1",
}


@pytest.fixture
def isa_paths(native_module: ModuleType) -> Iterator[list[str]]:
    """The kernel paths this CPU supports (the selection is restored afterwards)."""
    before = native_module.digest_isa()
    try:
        yield [p for p in PATHS if native_module.set_digest_isa(p) == p]
    finally:
        native_module.set_digest_isa(before)


def _digests_by_path(
    native_module: ModuleType, paths: list[str], cases: list[torch.Tensor]
) -> dict[str, list[bytes]]:
    out = {}
    for path in paths:
        assert native_module.set_digest_isa(path) == path
        out[path] = digest_many(cases, backend="native")
    out["python"] = digest_many(cases, backend="python")
    return out


def test_pinned_values_on_every_path(native_module: ModuleType, isa_paths: list[str]) -> None:
    fixed = _fixed()
    small = {k: v for k, v in fixed.items() if v.numel() * v.element_size() < 4096}
    assert {k: oracle(v).hex() for k, v in small.items()} == {k: PINNED[k] for k in small}
    for path, values in _digests_by_path(native_module, isa_paths, list(fixed.values())).items():
        assert dict(zip(fixed, (v.hex() for v in values))) == PINNED, path


def test_scalar_path_is_always_available_and_unknown_path_is_rejected(
    native_module: ModuleType, isa_paths: list[str]
) -> None:
    assert "scalar" in isa_paths
    assert native_module.set_digest_isa("auto") == isa_paths[0]
    with pytest.raises(RuntimeError, match="unknown digest ISA 'sse9'"):
        native_module.set_digest_isa("sse9")


def _tails_and_views() -> list[torch.Tensor]:
    base = _pattern(4096 + 77)
    cases: list[torch.Tensor] = []
    # Every length from 0 to 70 bytes and a few past the 128/256-byte unrolled
    # steps: vector body, word tail and zero-padded byte tail in all mixes.
    cases += [base[:n] for n in range(71)]
    cases += [base[:n] for n in (127, 128, 129, 255, 256, 257, 513, 1031)]
    # Storage offsets that are not word-aligned.
    cases += [base[off : off + 300] for off in range(1, 9)]
    floats = base[:4096].view(torch.float32).reshape(32, 32)
    cases += [
        floats.t(),  # non-contiguous
        floats[::3, 1::2],  # strided, odd sizes
        floats[5:, 7:],  # offset, not contiguous
        floats.reshape(-1)[1:1000],  # 4-byte offset, odd word count
        floats.expand(2, 32, 32),
        torch.view_as_complex(floats.reshape(32, 16, 2))[:, 1::2].conj(),
    ]
    return cases


def test_tails_offsets_and_views_equal_the_oracle_on_every_path(
    native_module: ModuleType, isa_paths: list[str]
) -> None:
    cases = _tails_and_views()
    expected = [oracle(t.resolve_conj()) for t in cases]
    for path, values in _digests_by_path(native_module, isa_paths, cases).items():
        disagreements = [i for i, (v, e) in enumerate(zip(values, expected)) if v != e]
        assert disagreements == [], (path, len(cases))


def _permutations(n: int) -> Iterator[torch.Tensor]:
    yield torch.arange(n).flip(0)
    yield torch.arange(n).roll(1)
    for a, b in ((0, 1), (0, n - 1), (2, 3), (n // 2, n // 2 + 1), (5, 37)):
        p = torch.arange(n)
        p[a], p[b] = b, a
        yield p


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.float64])
def test_a_permutation_of_elements_changes_the_digest(backend: str, dtype: torch.dtype) -> None:
    # Distinct elements, and equal ones: swapping equal elements is no change.
    x = torch.arange(64).to(dtype)
    d = digest_bytes(x, backend=backend)
    permuted = [digest_bytes(x[p], backend=backend) for p in _permutations(x.numel())]
    assert d not in permuted
    assert len(set(permuted)) == len(permuted)
    # Swapping elements inside one 64-bit word, and whole words, of a float32
    # tensor whose words share their other half.
    y = torch.ones(16, dtype=torch.float32)
    y[4], y[9] = 2.0, 3.0
    swapped_in_word = y.clone()
    swapped_in_word[4], swapped_in_word[5] = y[5], y[4]
    swapped_words = y.clone()
    swapped_words[4], swapped_words[6] = y[6], y[4]
    digests = {digest_bytes(t, backend=backend) for t in (y, swapped_in_word, swapped_words)}
    assert len(digests) == 3


@settings(max_examples=40, derandomize=True, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=700),
    offset=st.integers(0, 15),
    itemsize=st.sampled_from([1, 2, 4, 8]),
)
def test_hypothesis_every_path_equals_the_oracle(
    native_module: ModuleType, data: bytes, offset: int, itemsize: int
) -> None:
    dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]
    raw = torch.tensor(list(bytes(offset) + data), dtype=torch.uint8)[offset:]
    usable = len(data) // itemsize * itemsize
    t = raw[:usable].clone().view(dtype) if itemsize > 1 else raw
    expected = oracle(t)
    before = native_module.digest_isa()
    try:
        for path in PATHS:
            taken = native_module.set_digest_isa(path)
            assert digest_bytes(t, backend="native") == expected, taken
    finally:
        native_module.set_digest_isa(before)
    assert digest_bytes(t, backend="python") == expected


def test_environment_variable_caps_the_path_for_the_process(
    native_module: ModuleType, isa_paths: list[str]
) -> None:
    # One child process per setting: the variable is read once, at first use.
    code = (
        "import sys, torch; from pytest_backends import _native; "
        "from pytest_backends.determinism.digest import digest_bytes; "
        "m = _native.load(); d = digest_bytes(torch.arange(1000)); "
        "print(m.digest_isa(), d.hex())"
    )
    expected = digest_bytes(torch.arange(1000), backend="native").hex()
    env = {**os.environ, "PYTEST_BACKENDS_DIGEST_ISA": "avx2"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["avx2" if "avx2" in isa_paths else "scalar", expected]
