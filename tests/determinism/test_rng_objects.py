"""The RNG objects a test reuses are found where it keeps them and put back between runs."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from pytest_backends.determinism.rng_objects import RngObjects, reached

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


def _draws(rngs: dict[str, object]) -> dict[str, object]:
    return {
        "torch": torch.randn(3, generator=rngs["torch"]).tolist(),
        "numpy": rngs["numpy"].standard_normal(3).tolist(),
        "legacy": rngs["legacy"].standard_normal(3).tolist(),
        "python": [rngs["python"].random(), rngs["python"].gauss(0, 1)],
    }


def test_every_kind_draws_the_same_numbers_after_a_restore() -> None:
    rngs = {
        "torch": torch.Generator().manual_seed(1),
        "numpy": np.random.default_rng(2),
        "legacy": np.random.RandomState(3),
        "python": random.Random(4),
    }
    holder = SimpleNamespace(inner={"rngs": list(rngs.values())})
    captured = RngObjects.capture([{"holder": holder}])
    assert len(captured) == 4
    first = _draws(rngs)
    assert _draws(rngs) != first  # they moved on
    captured.restore()
    assert _draws(rngs) == first
    captured.restore()
    assert _draws(rngs) == first


def test_the_global_generators_are_left_to_the_rng_state() -> None:
    module = {
        "default": torch.default_generator,
        "legacy_global": np.random.mtrand._rand,
        "python_global": random._inst,  # type: ignore[attr-defined]
    }
    assert len(RngObjects.capture([module])) == 0


def test_reached_follows_fixtures_module_class_and_instance() -> None:
    kept = np.random.default_rng(0)
    in_class = random.Random(0)
    on_instance = torch.Generator()

    class Suite:
        RNG = in_class

    instance = Suite()
    instance.gen = on_instance  # type: ignore[attr-defined]
    module = SimpleNamespace(MODULE_RNG=np.random.RandomState(0))
    item = SimpleNamespace(
        funcargs={"fixture": SimpleNamespace(rng=kept)},
        module=module,
        cls=Suite,
        instance=instance,
    )
    found = reached(item)
    assert {id(r) for r in found} == {
        id(kept),
        id(in_class),
        id(on_instance),
        id(module.MODULE_RNG),
    }


def test_an_rng_deeper_than_the_walk_is_not_reached() -> None:
    deep = random.Random(0)
    nest: object = deep
    for _ in range(6):
        nest = {"level": nest}
    assert len(RngObjects.capture([{"nest": nest}])) == 0


def test_the_module_and_class_dunders_are_not_walked() -> None:
    """``__loader__`` and friends hold pytest's config and plugins, not the test's RNGs.

    Walking them visited about 20,000 objects per checked test (8 ms each).
    """
    kept = random.Random(0)
    behind_the_loader = torch.Generator()
    loader = SimpleNamespace(config=SimpleNamespace(plugin=SimpleNamespace(g=behind_the_loader)))

    class Suite:
        __slots_holder__ = SimpleNamespace(g=torch.Generator())

    module = SimpleNamespace(__loader__=loader, __builtins__={"rng": random.Random(1)}, RNG=kept)
    item = SimpleNamespace(funcargs={}, module=module, cls=Suite, instance=None)
    assert [id(r) for r in reached(item)] == [id(kept)]
