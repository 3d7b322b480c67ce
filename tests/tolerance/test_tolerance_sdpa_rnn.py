"""fp16/bf16 attention and recurrent cells: the bound covers what their kernels round.

Fused attention rounds the softmax probabilities to the result dtype before
``P @ V``; an LSTM, GRU or RNN cell rounds its gates and state every step.
Both leave an absolute error that does not shrink where outputs cancel, so the
honest results below must pass, and results 1% (fp16) or a few % (bf16) off
must still fail.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from pytest_backends import assert_close, override_flags, reference, tolerance_for

HALF = (torch.bfloat16, torch.float16)
KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}


def _qkv(
    dtype: torch.dtype, b: int, h: int, lq: int, lk: int, d: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen).to(dtype)
    k = torch.randn(b, h, lk, d, generator=gen).to(dtype)
    v = torch.randn(b, h, lk, d, generator=gen).to(dtype)
    return q, k, v


def _sdpa(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel(KERNELS[kernel]):
        return F.scaled_dot_product_attention(q, k, v)


def test_the_reported_flash_case_passes() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32, dtype=torch.bfloat16) for _ in range(3))
    y = F.scaled_dot_product_attention(q, k, v)  # default flags: the CPU flash kernel
    assert_close(y, reference(F.scaled_dot_product_attention, q, k, v), k=32, op="sdpa")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize(
    "shape", [(2, 4, 16, 16, 32), (2, 4, 128, 128, 64), (1, 2, 8, 512, 16), (2, 1, 1, 5, 8)]
)
def test_sdpa_passes_at_several_shapes(
    dtype: torch.dtype, kernel: str, shape: tuple[int, int, int, int, int]
) -> None:
    for seed in range(3):
        q, k, v = _qkv(dtype, *shape, seed)
        y = _sdpa(kernel, q, k, v)
        expected = reference(F.scaled_dot_product_attention, q, k, v)
        assert_close(y, expected, k=shape[-1], op="sdpa")


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    dtype=st.sampled_from(HALF),
    kernel=st.sampled_from(sorted(KERNELS)),
    b=st.integers(1, 2),
    h=st.integers(1, 4),
    lq=st.integers(1, 64),
    lk=st.integers(1, 256),
    d=st.sampled_from([8, 16, 32, 64]),
    seed=st.integers(0, 2**16),
)
def test_sdpa_corpus_passes(
    dtype: torch.dtype, kernel: str, b: int, h: int, lq: int, lk: int, d: int, seed: int
) -> None:
    q, k, v = _qkv(dtype, b, h, lq, lk, d, seed)
    y = _sdpa(kernel, q, k, v)
    assert_close(y, reference(F.scaled_dot_product_attention, q, k, v), k=d, op="sdpa")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("shape", [(2, 4, 16, 16, 32), (2, 4, 128, 128, 64)])
def test_sdpa_one_percent_off_fails(
    dtype: torch.dtype, kernel: str, shape: tuple[int, int, int, int, int]
) -> None:
    q, k, v = _qkv(dtype, *shape, seed=7)
    y = _sdpa(kernel, q, k, v)
    expected = reference(F.scaled_dot_product_attention, q, k, v)
    wrong = (y.double() * 1.01).to(dtype)
    with pytest.raises(AssertionError, match="attention probabilities rounded"):
        assert_close(wrong, expected, k=shape[-1], op="sdpa")


def test_fp32_sdpa_rounded_to_bf16_fails() -> None:
    q, k, v = _qkv(torch.float32, 2, 4, 64, 64, 32, seed=3)
    y = F.scaled_dot_product_attention(q, k, v)
    expected = reference(F.scaled_dot_product_attention, q, k, v)
    assert_close(y, expected, k=32, op="sdpa")
    with pytest.raises(AssertionError):
        assert_close(y.bfloat16().float(), expected, k=32, op="sdpa")


def test_sdpa_probability_term_follows_the_kernels_allowed() -> None:
    fused = tolerance_for(torch.bfloat16, op="sdpa", k=32)
    assert any("attention probabilities rounded" in line for line in fused.path)
    assert ("sdp.flash", True) in fused.flags
    off = {"sdp.flash": False, "sdp.mem_efficient": False, "sdp.cudnn": False, "sdp.fa3": False}
    math_only = tolerance_for(torch.bfloat16, op="sdpa", k=32, flags=off)
    assert not any("attention probabilities" in line for line in math_only.path)
    assert math_only.atol < fused.atol / 100
    # the term is u * s: the rms of v
    assert tolerance_for(torch.bfloat16, op="sdpa", k=32, scale=2.0).atol == pytest.approx(
        2 * fused.atol, rel=1e-6
    )
    # fp32 attention does not round P
    assert tolerance_for(torch.float32, op="sdpa", k=32).atol < 1e-5


# ------------------------------------------------------------------- rnn

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}


def _rnn(
    cell: str, dtype: torch.dtype, steps: int, seed: int, size: int = 32, batch: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = CELLS[cell](size, size, batch_first=True).to(dtype)
    x = torch.randn(batch, steps, size, generator=gen).to(dtype)
    return module(x)[0], reference(module, x)[0]


def test_the_reported_lstm_case_passes() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(32, 32, batch_first=True).bfloat16()
    x = torch.randn(4, 1, 32, dtype=torch.bfloat16)
    assert_close(lstm(x)[0], reference(lstm, x)[0], k=64, op="rnn")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("steps", [1, 8, 32])
def test_rnn_passes_over_sequence_lengths(dtype: torch.dtype, cell: str, steps: int) -> None:
    for seed in range(3):
        actual, expected = _rnn(cell, dtype, steps, seed)
        assert_close(actual, expected, k=64, op="rnn")


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    dtype=st.sampled_from(HALF),
    cell=st.sampled_from(sorted(CELLS)),
    steps=st.integers(1, 64),
    size=st.sampled_from([8, 16, 32, 64]),
    batch=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_rnn_corpus_passes(
    dtype: torch.dtype, cell: str, steps: int, size: int, batch: int, seed: int
) -> None:
    actual, expected = _rnn(cell, dtype, steps, seed, size=size, batch=batch)
    assert_close(actual, expected, k=2 * size, op="rnn")


# bf16 GRU and RNN cells already err by up to 4 u = 1.6% of |h| <= 1 (measured), and
# the bound (6 u, the same for every cell) cannot tell an LSTM (|h| about 0.3
# after one step) from them: a bf16 result is caught from 10% off, fp16 from 1%.
OFF = {torch.bfloat16: 1.10, torch.float16: 1.01}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("steps", [1, 8, 32])
def test_rnn_perturbed_output_fails(dtype: torch.dtype, cell: str, steps: int) -> None:
    actual, expected = _rnn(cell, dtype, steps, seed=5, batch=8)
    wrong = (actual.double() * OFF[dtype]).to(dtype)
    with pytest.raises(AssertionError, match="cell state rounded"):
        assert_close(wrong, expected, k=64, op="rnn")


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_fp32_rnn_rounded_to_bf16_fails(cell: str) -> None:
    with override_flags({"mkldnn.rnn.fp32_precision": "ieee"}):
        actual, expected = _rnn(cell, torch.float32, 8, seed=2)
        assert_close(actual, expected, k=64, op="rnn")
        with pytest.raises(AssertionError):
            assert_close(actual.bfloat16().float(), expected, k=64, op="rnn")


def test_rnn_cell_term_is_half_precision_only() -> None:
    half = tolerance_for(torch.bfloat16, op="rnn", k=64)
    assert any("cell state rounded" in line for line in half.path)
    assert half.atol == pytest.approx(6 * 2.0**-8, rel=0.01)
    # bounded h: the term does not scale with the inputs
    assert tolerance_for(torch.bfloat16, op="rnn", k=64, scale=4.0).atol < 1.01 * half.atol
    fp32 = tolerance_for(torch.float32, op="rnn", k=64, flags={"mkldnn.rnn.fp32_precision": "ieee"})
    assert fp32.atol < 1e-4 and not any("cell state" in line for line in fp32.path)
    assert tolerance_for(torch.bfloat16, op="matmul", k=64).atol < 1e-4


# --------------------------------------------------------------- autocast


def _autocast_linear() -> tuple[nn.Linear, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        lin = nn.Linear(64, 32)
    return lin, torch.randn(16, 64, generator=gen)


def test_autocast_inputs_are_modelled_inside_the_region() -> None:
    lin, x = _autocast_linear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
        assert y.dtype == torch.bfloat16
        tol = tolerance_for(torch.bfloat16, op="matmul", k=64)
        assert any("by autocast.cpu.enabled" in line for line in tol.path)
        # rms of x_i w_i: randn x, weights uniform in +-1/8
        s = 0.125 / 3**0.5
        assert_close(y, reference(lin, x), k=64, op="matmul", scale=s)
        wrong = (y.double() * 1.05).bfloat16()
        with pytest.raises(AssertionError):  # a wrong result still fails
            assert_close(wrong, reference(lin, x), k=64, op="matmul", scale=s)


def test_autocast_result_checked_outside_hints_at_the_rounded_inputs() -> None:
    lin, x = _autocast_linear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    with pytest.raises(AssertionError, match=r"torch\.autocast .* rounded fp32 inputs"):
        assert_close(y, reference(lin, x), k=64, op="matmul")
    # from the rounded inputs the result passes
    with override_flags({"mkldnn.matmul.fp32_precision": "ieee"}):
        rounded = reference(lin.bfloat16(), x.bfloat16())
    assert_close(y, rounded, k=64, op="matmul")
