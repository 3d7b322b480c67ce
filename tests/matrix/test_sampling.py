"""--backends-sample: a reproducible, coverage-first sample of a product."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.expand import sample_configs

REG = builtin_registry()
BIG = REG.product(
    {
        "mkldnn": ["on", "off"],
        "sdpa": ["math", "flash", "efficient", "cudnn"],
        "device": ["cpu", "cuda", "mps"],
        "deterministic": ["on", "off"],
    }
)


def test_same_seed_and_key_give_the_same_sample_in_product_order() -> None:
    a = sample_configs(BIG, 5, seed=7, key="t.py::test_a")
    assert a == sample_configs(BIG, 5, seed=7, key="t.py::test_a")
    assert a == sorted(a, key=BIG.index)
    assert len(a) == len(set(a)) == 5


def test_seed_and_test_change_the_sample() -> None:
    samples = {tuple(sample_configs(BIG, 5, seed=s, key="k")) for s in range(20)}
    samples |= {tuple(sample_configs(BIG, 5, seed=0, key=f"k{i}")) for i in range(20)}
    assert len(samples) > 30


def test_n_at_least_the_product_keeps_everything() -> None:
    assert sample_configs(BIG, len(BIG), seed=1, key="k") == BIG
    assert sample_configs(BIG, 10**6, seed=1, key="k") == BIG


@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    extra=st.integers(0, 3),
    seed=st.integers(0, 2**31),
)
def test_every_value_runs_once_n_reaches_the_largest_axis(
    sizes: list[int], extra: int, seed: int
) -> None:
    combos = [tuple(enumerate(c)) for c in itertools.product(*(range(s) for s in sizes))]
    n = max(sizes) + extra
    chosen = sample_configs(combos, n, seed=seed, key="k")
    assert len(chosen) == min(n, len(combos))
    covered = {pair for combo in chosen for pair in combo}
    assert covered == {pair for combo in combos for pair in combo}
