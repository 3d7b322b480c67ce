"""Ordinary user code, written as users write it, checked against the oracle (the hand check).

Each probe is what a user of a sequence-first model, a complex or bfloat16
model, or a model with several outputs writes: negative batch dimensions
(``dim=-1``, ``out_dim=-1``: the last dimension of every tensor), an
``out_dim`` that no output has, an RNN with ``batch_first=True`` whose hidden
state is batched along dimension 1. The truth is the brute-force oracle:
every row sliced in its own layout, run alone, compared bitwise.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from batch_oracle import oracle

from pytest_backends import BatchInvarianceError, assert_batch_invariant
from pytest_backends.batch.api import CaseResult


def _verdict(fn: Callable[..., object], *inputs: object, **kw: object) -> bool:
    try:
        assert_batch_invariant(fn, *inputs, **kw)  # type: ignore[arg-type]
    except BatchInvarianceError:
        return False
    return True


def _elementwise(t: torch.Tensor) -> torch.Tensor:
    return torch.tanh(t) * 2 + 1


FNS: list[tuple[str, Callable[[torch.Tensor], object]]] = [
    ("a tuple of two outputs", lambda t: (_elementwise(t), t * 3)),
    ("a dict of outputs", lambda t: {"y": _elementwise(t), "z": t.neg()}),
    ("one output", _elementwise),
]


@pytest.mark.parametrize(("name", "fn"), FNS, ids=[n for n, _ in FNS])
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "backward"])
def test_a_batch_along_the_last_dimension_counted_from_the_end(
    name: str, fn: Callable[[torch.Tensor], object], grad: bool
) -> None:
    """``dim=-1, out_dim=-1`` is the last dimension: the verdict is that of ``dim=1, out_dim=1``."""
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    truth, _ = oracle(fn, [x], [1], 1, [1, 4])
    assert truth
    x.requires_grad_(grad)
    assert _verdict(fn, x, dim=-1, out_dim=-1) == truth
    assert _verdict(fn, x, dim=1, out_dim=1) == truth


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bfloat16])
def test_negative_batch_dimensions_give_the_figures_of_positive_ones(dtype: torch.dtype) -> None:
    """Complex bits and stacked figures add dimensions: ``-1`` still names the batch's."""
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to(dtype)

    def centred(t: torch.Tensor) -> tuple[torch.Tensor]:
        return (t - t.mean(-1, keepdim=True),)  # mixes the rows (the batch is dim 1)

    by_end = assert_batch_invariant(centred, x, dim=-1, out_dim=-1, tolerance="report")
    by_start = assert_batch_invariant(centred, x, dim=1, out_dim=1, tolerance="report")

    def figures(cases: list[CaseResult]) -> list[tuple[object, ...]]:
        return [(c.case, c.part, c.first_row, c.differing, c.max_abs, c.max_rel) for c in cases]

    assert figures(by_end.cases) == figures(by_start.cases)
    # Every row alone differs from the full batch's (the hand check).
    alone = [c for c in by_end.cases if c.size == 1]
    assert alone and all(c.differing == 1 for c in alone)


@pytest.mark.parametrize("out_dim", [3, -4])
def test_an_out_dim_no_output_has_is_a_clear_error(out_dim: int) -> None:
    x = torch.randn(6, 5, 8)
    for fn in (lambda t: t * 2, lambda t: (t * 2,)):
        expected = rf"no batch dimension {out_dim} of size 6: out_dim {out_dim} is out of range"
        with pytest.raises(ValueError, match=expected):
            assert_batch_invariant(fn, x, out_dim=out_dim)


@pytest.mark.parametrize("out_dim", [True, "0", 1.0])
def test_an_out_dim_that_is_not_an_int_is_a_type_error(out_dim: object) -> None:
    with pytest.raises(TypeError, match="out_dim must be an int"):
        assert_batch_invariant(lambda t: t * 2, torch.randn(6, 5), out_dim=out_dim)  # type: ignore[arg-type]


def test_an_rnn_hidden_state_batched_along_another_dimension_is_named() -> None:
    """``nn.LSTM(batch_first=True)`` returns ``h`` batched along dim 1: the error says so."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, batch_first=True).eval()
    with pytest.raises(ValueError) as info:
        assert_batch_invariant(lstm, torch.randn(6, 5, 8))
    message = str(info.value)
    assert "output[1][0] has shape [1, 6, 16]" in message
    assert "its dimension 1 has 6" in message
    assert "loss" not in message


def test_a_sequence_first_lstm_is_checked_along_dimension_1() -> None:
    """``batch_first=False``: ``dim=1, out_dim=1`` covers the output and ``(h, c)``."""
    torch.manual_seed(0)
    lstm = torch.nn.GRU(8, 16).eval()
    x = torch.randn(5, 6, 8)
    truth, _ = oracle(lstm, [x], [1], 1, [1, 3])
    assert _verdict(lstm, x, dim=1, out_dim=1) == truth
    assert _verdict(lstm, x, dim=-2, out_dim=-2) == truth


INTEGER_UNDER_TOLERANCE = """
import torch
from pytest_backends import assert_batch_invariant


def test_counts_under_a_tolerance():
    assert_batch_invariant(
        lambda x: (x.abs() * 10 + x.shape[0]).long(), torch.randn(8, 4), atol=100.0, rtol=1.0
    )
"""


def test_an_integer_output_under_a_tolerance_says_it_was_compared_bitwise(
    pytester: pytest.Pytester,
) -> None:
    """A difference of 7 is not "beyond atol=100": integers are compared bitwise.

    And the failure shows the user's call and the message, not the check's own code.
    """
    pytester.makepyfile(test_ints=INTEGER_UNDER_TOLERANCE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "an integer or bool output: compared bitwise, whatever the tolerance" in out, out
    assert "beyond rtol" not in out, out
    assert "def assert_batch_invariant" not in out and "session = ACTIVE_CHECK" not in out, out
