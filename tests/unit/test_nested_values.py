"""Nested results: every public comparison opens the same containers and names the same paths.

``assert_close``, ``assert_reproducible`` and ``flag_effect`` accept results
made of dicts, lists, tuples, named tuples and dataclasses. A difference deep
inside is reported at its path (``output['stats'].mean``), with the same
spelling in every API, and a container whose shape changed never passes.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import pytest
import torch

from pytest_backends import assert_close, assert_reproducible, flag_effect
from pytest_backends.determinism.api import NotReproducibleError


class Stats(NamedTuple):
    mean: torch.Tensor
    count: int


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    stats: Stats


def _result(shift: float = 0.0) -> Result:
    base = torch.linspace(-1, 1, 8)
    return Result(base + shift, Stats(base.mean() + shift, 8))


def test_assert_close_names_the_field_path_of_a_dataclass() -> None:
    assert_close(_result(), _result())
    with pytest.raises(AssertionError, match=r"\.logits"):
        assert_close(_result(1e-2), _result())


def test_assert_close_opens_named_tuples_by_field() -> None:
    good = {"stats": Stats(torch.tensor(1.0), 3)}
    bad = {"stats": Stats(torch.tensor(1.5), 3)}
    assert_close(good, good)
    with pytest.raises(AssertionError, match=r"\['stats'\]\.mean"):
        assert_close(bad, good)


def test_assert_close_refuses_different_keys_and_lengths_with_the_path() -> None:
    with pytest.raises(AssertionError, match=r"keys differ at \['a'\]: \['x'\] != \['y'\]"):
        assert_close({"a": {"x": torch.ones(1)}}, {"a": {"y": torch.ones(1)}})
    with pytest.raises(AssertionError, match=r"lengths differ at \[1\]: 2 != 1"):
        assert_close([torch.ones(1), [1, 2]], [torch.ones(1), [1]])


def test_assert_reproducible_names_the_same_path_for_a_noisy_field() -> None:
    calls = itertools.count()

    def noisy() -> Result:
        out = _result()
        out.stats = Stats(out.stats.mean + next(calls) * 1e-3, 8)
        return out

    with pytest.raises(NotReproducibleError, match=r"output\.stats\.mean differs"):
        assert_reproducible(noisy, runs=2)
    assert_reproducible(_result, runs=2)


def test_assert_reproducible_refuses_a_leaf_it_cannot_compare_by_path() -> None:
    with pytest.raises(TypeError, match=r"output\['ids'\] of type set"):
        assert_reproducible(lambda: {"ids": {1, 2}}, runs=2)
    with pytest.raises(TypeError, match=r"output\[1\] of type generator"):
        assert_reproducible(lambda: [torch.ones(2), (x for x in range(2))], runs=2)


def test_flag_effect_compares_dataclass_results_leaf_by_leaf() -> None:
    x = torch.randn(16, 16, dtype=torch.float64)

    def fn() -> Result:
        y = x @ x
        return Result(y, Stats(y.mean(), 16))

    effect = flag_effect(fn, "deterministic_algorithms", [False, True])
    assert not effect and effect.groups == ((False, True),)
    # equal bits say nothing about which kernels ran: never claim the same path
    assert "bit-identical outputs here" in str(effect)
    assert "same path ran" not in str(effect)


def test_flag_effect_sees_a_changed_container_as_a_difference() -> None:
    from pytest_backends.flags import registry

    def fn() -> object:
        if registry().by_name["deterministic_algorithms"].read():
            return {"out": torch.ones(2), "extra": []}
        return {"out": torch.ones(2), "extra": [[]]}

    effect = flag_effect(fn, "deterministic_algorithms", [False, True])
    assert effect and effect.groups == ((False,), (True,))
