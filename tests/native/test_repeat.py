"""The repeat loop: N calls of one op through the dispatcher, one digest per call."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from pytest_backends.determinism.digest import DIGEST_SIZE, digest_bytes, repeat

aten = torch.ops.aten

_calls = itertools.count()


@torch.library.custom_op("pbtest_repeat::drifting", mutates_args=())
def drifting(x: torch.Tensor) -> torch.Tensor:
    """A planted nondeterministic op: the result moves by one ulp-ish step per call."""
    return x + next(_calls) * 1e-3


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(16, 32, generator=gen), torch.randn(32, 8, generator=gen)


def test_deterministic_op_gives_n_identical_digests_equal_to_python_digests(
    backend: str,
) -> None:
    a, b = _inputs()
    digests = repeat(aten.mm.default, (a, b), runs=5, backend=backend)
    assert len(digests) == 5
    assert set(digests) == {digest_bytes(torch.mm(a, b), backend="python")}


def test_native_and_python_loops_return_the_same_bytes(native_module: object) -> None:
    a, b = _inputs()
    cases: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (aten.mm.default, (a, b), {}),
        (aten.add.Tensor, (a, a), {"alpha": 3}),
        (aten.sort.default, (a,), {"dim": 0}),  # two outputs: values, indices
        (aten.unbind.int, (b,), {}),  # a list of tensors
        (aten._local_scalar_dense.default, (torch.tensor(2.5),), {}),  # a Python float
        (aten.max.dim, (a, 1), {"keepdim": True}),
    ]
    for op, args, kwargs in cases:
        native = repeat(op, args, kwargs, runs=3, backend="native")
        python = repeat(op, args, kwargs, runs=3, backend="python")
        assert native == python, op
        assert len(set(native)) == 1, op


def test_each_run_concatenates_the_digests_of_all_outputs(backend: str) -> None:
    a, _ = _inputs()
    (run,) = repeat(aten.sort.default, (a,), {"dim": 1}, runs=1, backend=backend)
    values, indices = torch.sort(a, dim=1)
    assert len(run) == 2 * DIGEST_SIZE
    assert run == digest_bytes(values, backend="python") + digest_bytes(indices, backend="python")
    (scalar,) = repeat(
        aten._local_scalar_dense.default, (torch.tensor(7),), runs=1, backend=backend
    )
    assert scalar == digest_bytes(torch.tensor(7, dtype=torch.int64), backend="python")


def test_planted_nondeterministic_op_gives_distinct_digests(backend: str) -> None:
    x = torch.randn(8)
    digests = repeat(torch.ops.pbtest_repeat.drifting.default, (x,), runs=4, backend=backend)
    assert len(set(digests)) == 4


def test_mutated_arguments_are_cloned_before_each_call(backend: str) -> None:
    gen = torch.Generator().manual_seed(1)
    target = torch.zeros(5, 3)
    index = torch.tensor([0, 2, 2, 4])
    source = torch.randn(4, 3, generator=gen)
    args = (target, 0, index, source)
    before = target.clone()
    same = repeat(aten.index_add_.default, args, runs=3, backend=backend)
    assert len(set(same)) == 1
    assert torch.equal(target, before)
    expected = before.clone().index_add_(0, index, source)
    assert same[0] == digest_bytes(expected, backend="python")
    # Without cloning, the in-place op accumulates into the same tensor.
    drifting_runs = repeat(
        aten.index_add_.default, args, runs=3, clone_mutated=False, backend=backend
    )
    assert len(set(drifting_runs)) == 3
    accumulated = before.clone()
    for _ in range(3):
        accumulated.index_add_(0, index, source)
    assert torch.equal(target, accumulated)


def test_bad_arguments_are_rejected(backend: str) -> None:
    a, b = _inputs()
    with pytest.raises(ValueError, match="runs must be >= 1"):
        repeat(aten.mm.default, (a, b), runs=0, backend=backend)
    with pytest.raises(TypeError, match="OpOverload"):
        repeat(torch.mm, (a, b), runs=2, backend=backend)
    with pytest.raises(RuntimeError):
        repeat(aten.mm.default, (a, a), runs=2, backend=backend)  # shapes do not match
