"""The digest is bitwise exact, on the native kernel and the torch-ops fallback alike."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_backends import _native
from pytest_backends.determinism import digest as digest_mod
from pytest_backends.determinism.digest import (
    NativeDigestUnavailableWarning,
    digest,
    digest_bytes,
    digest_many,
    use_python_fallback,
)
from pytest_backends.determinism.digest import (
    backend as digest_backend,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:ComplexHalf support is experimental", "ignore:torch.quantize_per_tensor"
)

_NAMES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "bits8",
    "bits16",
]
DTYPES = [getattr(torch, n) for n in _NAMES if hasattr(torch, n)]


def _random_bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A tensor of ``dtype`` whose bytes are random (any bit pattern, NaNs included)."""
    gen = torch.Generator().manual_seed(seed)
    numel = 1
    for s in shape:
        numel *= s
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        raw = raw & 1  # only 0/1 are valid bools
    return raw.view(dtype).reshape(shape)


def _flip(t: torch.Tensor, byte: int, bit: int) -> torch.Tensor:
    out = t.clone()
    flat = out.reshape(-1).view(torch.uint8)
    flat[byte] ^= 1 << bit
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_digest_is_small_int64_on_device_and_stable(
    backend: str, dtype: torch.dtype
) -> None:
    t = _random_bits((5, 7), dtype)
    d = digest(t, backend=backend)
    assert d.dtype == torch.int64
    assert d.shape == (2,)
    assert d.device == t.device
    assert digest_bytes(t.clone(), backend=backend) == digest_bytes(t, backend=backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flipping_any_single_bit_changes_the_digest(backend: str, dtype: torch.dtype) -> None:
    t = _random_bits((3, 5), dtype, seed=1)
    base = digest_bytes(t, backend=backend)
    nbytes = t.numel() * t.element_size()
    bits = range(1) if dtype == torch.bool else range(0, 8, 3)
    positions = sorted({0, 1, nbytes // 2, nbytes - 2, nbytes - 1})
    flipped = [_flip(t, byte, bit) for byte, bit in itertools.product(positions, bits)]
    digests = digest_many(flipped, backend=backend)
    assert base not in digests
    assert len(set(digests)) == len(digests)


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
)
def test_negative_zero_differs_from_zero(backend: str, dtype: torch.dtype) -> None:
    pos = torch.zeros(4, dtype=dtype)
    neg = -pos
    assert torch.equal(pos, neg)  # equal as numbers, not as bits
    assert digest_bytes(pos, backend=backend) != digest_bytes(neg, backend=backend)


def test_nan_payloads_are_distinguished(backend: str) -> None:
    patterns = [0x7FC00000, 0x7FC00001, 0xFFC00000, 0x7F800001]
    nans = [
        torch.tensor([p], dtype=torch.int64).to(torch.int32).view(torch.float32)
        for p in [p - (1 << 32) if p >= 1 << 31 else p for p in patterns]
    ]
    assert all(torch.isnan(n).all() for n in nans)
    digests = digest_many(nans, backend=backend)
    assert len(set(digests)) == len(patterns)
    assert digest_many([n.clone() for n in nans], backend=backend) == digests


def test_equal_values_with_different_strides_give_equal_digests(backend: str) -> None:
    x = torch.randn(6, 8)
    fortran = x.t().contiguous().t()  # same values, column-major storage
    assert fortran.stride() != x.stride()
    assert digest_bytes(fortran, backend=backend) == digest_bytes(x, backend=backend)


def _views() -> Iterator[tuple[str, torch.Tensor]]:
    base = torch.randn(6, 10, generator=torch.Generator().manual_seed(3))
    yield "transpose", base.t()
    yield "step-slice", base[::2, 1::3]
    yield "expand", base[:1].expand(4, 10)
    yield "unaligned-offset", base.reshape(-1)[3:40]
    yield "narrow-column", base[:, 7]
    yield "conj", torch.randn(4, 3, dtype=torch.complex64).conj()
    yield "neg-view", torch._neg_view(torch.randn(4, 3, dtype=torch.complex64))
    yield "int16-transpose", torch.arange(35, dtype=torch.int16).reshape(5, 7).t()
    yield "bool-step", (torch.arange(30) % 3 == 0)[::4]


@pytest.mark.parametrize(("name", "view"), list(_views()), ids=[n for n, _ in _views()])
def test_views_hash_their_logical_elements(backend: str, name: str, view: torch.Tensor) -> None:
    materialised = view.clone(memory_format=torch.contiguous_format).resolve_conj().resolve_neg()
    assert materialised.is_contiguous()
    assert digest_bytes(view, backend=backend) == digest_bytes(materialised, backend=backend)
    changed = _flip(materialised, 0, 0)
    assert digest_bytes(view, backend=backend) != digest_bytes(changed, backend=backend)


def test_zero_size_tensors_differ_by_shape_and_dtype(backend: str) -> None:
    empties = [
        torch.zeros(0),
        torch.zeros(0, 3),
        torch.zeros(3, 0),
        torch.zeros(0, 0),
        torch.zeros(0, dtype=torch.float64),
        torch.zeros(0, dtype=torch.bool),
    ]
    digests = digest_many(empties, backend=backend)
    assert len(set(digests)) == len(empties)
    assert digest_bytes(torch.zeros(0, 3), backend=backend) == digests[1]


def test_shape_and_dtype_are_part_of_the_digest(backend: str) -> None:
    x = torch.arange(12, dtype=torch.int32)
    same_bytes = [
        x,
        x.reshape(3, 4),
        x.reshape(4, 3),
        x.reshape(1, 12),
        x.view(torch.float32),
        x.view(torch.uint32),
        x.view(torch.int16).reshape(2, 12),
        torch.tensor(7),
        torch.tensor([7]),
    ]
    digests = digest_many(same_bytes, backend=backend)
    assert len(set(digests)) == len(same_bytes)
    for a, b in [
        (torch.zeros(4, dtype=torch.uint8), torch.zeros(4, dtype=torch.bool)),
        (torch.zeros(2, dtype=torch.float16), torch.zeros(2, dtype=torch.bfloat16)),
    ]:
        assert digest_bytes(a, backend=backend) != digest_bytes(b, backend=backend)


def test_large_tensor_crosses_threads_and_chunks(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Larger than the native kernel's per-thread grain; the fallback is made
    # to hash it in several chunks. Odd byte count: a zero-padded tail word.
    monkeypatch.setattr(digest_mod, "_CHUNK_WORDS", 40_000)
    t = _random_bits((100_003,), torch.float16, seed=7)
    d = digest_bytes(t, backend=backend)
    assert digest_bytes(t.clone(), backend=backend) == d
    assert digest_bytes(_flip(t, 150_000, 5), backend=backend) != d


def test_requires_grad_and_result_is_detached(backend: str) -> None:
    w = torch.randn(3, requires_grad=True)
    d = digest(w * 2, backend=backend)
    assert not d.requires_grad
    assert digest_bytes(w, backend=backend) == digest_bytes(w.detach().clone(), backend=backend)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (lambda: torch.zeros(3, 3).to_sparse(), "strided"),
        (lambda: torch.empty(3, device="meta"), "meta"),
        (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8), "quantized"),
        (lambda: [1, 2], "torch.Tensor"),
    ],
    ids=["sparse", "meta", "quantized", "list"],
)
def test_unsupported_inputs_raise_type_error(backend: str, bad: object, match: str) -> None:
    assert callable(bad)
    with pytest.raises(TypeError, match=match):
        digest(bad(), backend=backend)


# --- native and fallback agree ----------------------------------------------------------


def _agreement_cases() -> list[torch.Tensor]:
    cases = [_random_bits((3, 5), d, seed=i) for i, d in enumerate(DTYPES)]
    cases += [v for _, v in _views()]
    cases += [torch.zeros(0, 3), torch.tensor(-0.0), torch.tensor(float("nan"))]
    cases += [_random_bits((9, 1001), torch.uint8, seed=11)]
    return cases


def test_native_and_python_digests_are_identical(native_module: object) -> None:
    cases = _agreement_cases()
    native = digest_many(cases, backend="native")
    python = digest_many(cases, backend="python")
    assert native == python
    assert len(set(native)) == len(native)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple),
    seed=st.integers(0, 2**31 - 1),
    flip=st.integers(0, 10_000),
    transpose=st.booleans(),
)
def test_hypothesis_native_equals_python_and_detects_a_flip(
    native_module: object,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    seed: int,
    flip: int,
    transpose: bool,
) -> None:
    t = _random_bits(shape, dtype, seed)
    if transpose and t.dim() >= 2:
        t = t.transpose(0, -1)
    native = digest_bytes(t, backend="native")
    assert native == digest_bytes(t, backend="python")
    nbytes = t.numel() * t.element_size()
    if nbytes:
        bit = 0 if dtype == torch.bool else flip % 8
        changed = _flip(t.contiguous(), (flip // 8) % nbytes, bit)
        assert digest_bytes(changed, backend="native") != native
        assert digest_bytes(changed, backend="python") != native


# --- backend selection ------------------------------------------------------------------


def test_backend_reports_native_and_python_fallback_switch(native_module: object) -> None:
    assert digest_backend() == "native"
    with use_python_fallback():
        assert digest_backend() == "python"
        with use_python_fallback(False):
            assert digest_backend() == "native"
    assert digest_backend() == "native"


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be"):
        digest(torch.zeros(1), backend="fast")


@pytest.fixture
def no_native(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process behaves as if the extension could not be built (state restored after)."""
    saved = (_native._state.tried, _native._state.module, _native._state.reason)
    warned = digest_mod._warned[0]
    cached_op = digest_mod._native_digest[0]
    digest_mod._native_digest[0] = None
    _native._state.tried, _native._state.module = True, None
    _native._state.reason = "no compiler (simulated)"
    digest_mod._warned[0] = False
    try:
        yield
    finally:
        _native._state.tried, _native._state.module, _native._state.reason = saved
        digest_mod._warned[0] = warned
        digest_mod._native_digest[0] = cached_op


def test_fallback_warns_once_when_native_is_unavailable(no_native: None) -> None:
    x = torch.randn(4)
    with pytest.warns(NativeDigestUnavailableWarning, match="no compiler"):
        first = digest_bytes(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert digest_bytes(x) == first
    assert digest_backend() == "python"
    with pytest.raises(RuntimeError, match="no compiler"):
        digest(x, backend="native")


def test_fallback_is_silent_when_disabled_on_purpose(
    no_native: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        digest_bytes(torch.randn(4))


def test_digest_works_under_deterministic_and_inference_modes(backend: str) -> None:
    from pytest_backends import override_flags

    x = torch.randn(1000, 3)
    expected = digest_bytes(x, backend=backend)
    flags = {"deterministic_algorithms": True, "deterministic.fill_uninitialized_memory": True}
    with override_flags(flags):
        assert digest_bytes(x, backend=backend) == expected
    with torch.inference_mode():
        assert digest_bytes(x.clone(), backend=backend) == expected
