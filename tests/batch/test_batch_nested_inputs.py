"""Containers of tensors as inputs: each tensor is batched, the containers rebuilt per call.

The truth is the hand check: slice row i of every tensor in the container,
rebuild the container, run, compare bits with row i of the full batch.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch

from pytest_backends import BatchInvarianceError, assert_batch_invariant

Pair = namedtuple("Pair", "ids mask")


def _embed() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Embedding(50, 8)


def _hand_check(fn: Any, batch: Any, n: int) -> bool:
    """Row by row: the container's tensors sliced, the container rebuilt, bits compared."""

    def rows(value: Any, i: int) -> Any:
        if isinstance(value, torch.Tensor):
            return value[i : i + 1]
        if isinstance(value, dict):
            return {k: rows(v, i) for k, v in value.items()}
        if hasattr(value, "_fields"):
            return type(value)(*(rows(v, i) for v in value))
        return type(value)(rows(v, i) for v in value)

    with torch.no_grad():
        full = fn(batch)
        return all(torch.equal(fn(rows(batch, i)), full[i : i + 1]) for i in range(n))


def _masked_mean(emb: torch.nn.Module) -> Any:
    def fn(enc: Any) -> torch.Tensor:
        ids, mask = (enc["input_ids"], enc["attention_mask"]) if isinstance(enc, dict) else enc
        h = emb(ids) * mask[..., None]
        return h.sum(1) / mask.sum(1, keepdim=True)

    return fn


@pytest.mark.parametrize("kind", ["dict", "tuple", "list", "namedtuple"])
def test_a_container_of_tensors_is_batched(kind: str) -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (8, 6), generator=gen)
    mask = (torch.rand(8, 6, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    batch: Any = {
        "dict": {"input_ids": ids, "attention_mask": mask},
        "tuple": (ids, mask),
        "list": [ids, mask],
        "namedtuple": Pair(ids, mask),
    }[kind]
    fn = _masked_mean(_embed())
    truth = _hand_check(fn, batch, 8)
    try:
        assert_batch_invariant(fn, batch, backward=False)
        verdict = True
    except BatchInvarianceError:
        verdict = False
    assert verdict == truth


def test_a_container_that_mixes_rows_fails_and_names_the_op() -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(lambda d: d["x"] - d["x"].mean(0), {"x": x, "tag": "t"})
    assert info.value.finding is not None and info.value.finding.kind == "mixed"


def test_gradients_are_named_by_their_place_in_the_container() -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    y = torch.randn(8, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    result = assert_batch_invariant(
        lambda d: d["a"] * 2 + d["b"].softmax(0), {"a": x, "b": y}, tolerance="report"
    )
    parts = {c.part for c in result.cases}
    assert "grad of input 0['a']" in parts and "grad of input 0['b']" in parts, parts
    # The caller's container and tensors are as they were.
    assert x.grad is None and y.grad is None


def test_per_input_dims_apply_to_every_tensor_of_the_container() -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))  # batch along dim 1
    table = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    seen: list[tuple[int, ...]] = []

    def fn(pair: tuple[torch.Tensor, torch.Tensor], t: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(pair[0].shape))
        return (pair[0] + pair[1]).t() @ t

    assert_batch_invariant(fn, (x, x * 2), table, dim=[1, None], tolerance="report")
    assert (4, 1) in seen and (4, 8) in seen
