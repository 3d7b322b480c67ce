"""Arguments that are not batched tensors, and functions that fail for another batch size."""

from __future__ import annotations

import sys

import pytest
import torch

from pytest_backends import assert_batch_invariant


@pytest.mark.parametrize(
    "extra",
    [3, 0.5, "mean", None, (1, 2), {"scale": 2.0}],
    ids=["int", "float", "str", "None", "tuple", "dict"],
)
def test_a_value_that_is_not_a_tensor_is_passed_whole(extra: object) -> None:
    seen: list[object] = []

    def fn(t: torch.Tensor, e: object) -> torch.Tensor:
        seen.append(e)
        return t * 2

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    result = assert_batch_invariant(fn, x, extra)
    assert result.invariant
    assert seen and all(e is extra for e in seen)


def test_a_value_given_a_batch_dim_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"input 1 \(int\) has no dimension 0"):
        assert_batch_invariant(lambda t, k: t * k, torch.randn(8, 4), 3, dim=[0, 0])


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_an_error_on_a_sub_batch_names_it() -> None:
    # Train-mode BatchNorm1d refuses one row: the full batch runs, row 0 alone does not.
    bn = torch.nn.BatchNorm1d(16).train()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="more than 1 value per channel") as info:
        assert_batch_invariant(bn, x)
    notes = getattr(info.value, "__notes__", [])
    assert any("sub-batch `row 0 alone` (1 of 8 rows)" in n for n in notes), notes
    # The check put the module back as it found it.
    assert int(bn.num_batches_tracked) == 0


def test_an_error_on_the_full_batch_has_no_sub_batch_note() -> None:
    def fn(t: torch.Tensor) -> torch.Tensor:
        raise KeyError("broken")

    with pytest.raises(KeyError) as info:
        assert_batch_invariant(fn, torch.randn(8, 4))
    assert not getattr(info.value, "__notes__", [])
