"""Expansion: the configurations one marked test runs over.

A resolved marker names values per axis; the test runs over their product,
restricted to the axes ``--backends-matrix=AXES`` names and sampled with
``--backends-sample``.  The result depends only on the marker and the
options, never on the machine, so every process (xdist workers included)
collects the same items with the same ids.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from pytest_backends.matrix.configs import AxisRegistry, ConfigError
from pytest_backends.matrix.settings import MatrixSettings

__all__ = ["MAX_CONFIGS", "expand", "sample_configs"]

C = TypeVar("C", bound="tuple[Hashable, ...]")

#: The most configurations one marked test may expand to without ``--backends-sample``.
MAX_CONFIGS = 4096


def expand(
    selection: Mapping[str, Sequence[str]],
    registry: AxisRegistry,
    settings: MatrixSettings,
    key: str,
) -> list[tuple[tuple[str, str], ...]]:
    """The value combinations a marked test runs over (empty: it runs once, unparametrized).

    ``selection`` is a resolved marker (:func:`markers.resolve`); the command
    line's axes restrict it and ``--backends-sample`` samples it. Raises
    ``ConfigError`` when the product is too large to be meant.
    """
    if settings.axes is not None:
        selection = {a: v for a, v in selection.items() if a in settings.axes}
    if not selection:
        return []
    size = math.prod(len(values) for values in selection.values())
    if size > MAX_CONFIGS and settings.sample is None:
        raise ConfigError(
            f"the marker expands to {size} configurations (more than {MAX_CONFIGS}); "
            "name fewer axes or values, restrict axes with --backends-matrix=AXES, "
            "or sample with --backends-sample=N"
        )
    combos = registry.product(selection)
    if settings.sample is not None and settings.seed is not None:
        combos = sample_configs(combos, settings.sample, settings.seed, key)
    return combos


def sample_configs(combos: Sequence[C], n: int, seed: int, key: str) -> list[C]:
    """A reproducible sample of ``n`` of ``combos`` (each a tuple of hashable choices).

    The same ``(seed, key)`` always picks the same items, in their original
    order.  Picks are greedy for coverage first: each pick adds as many
    not-yet-seen values as possible (ties broken by a seeded shuffle), so with
    ``n`` at least the size of the largest axis every value runs at least once.
    """
    if n >= len(combos):
        return list(combos)
    rng = random.Random(f"{seed}:{key}")
    order = list(range(len(combos)))
    rng.shuffle(order)
    chosen: list[int] = []
    covered: set[object] = set()
    remaining = order[:]
    while len(chosen) < n:
        best = max(remaining, key=lambda i: len(set(combos[i]) - covered))
        if not set(combos[best]) - covered:
            break
        chosen.append(best)
        covered |= set(combos[best])
        remaining.remove(best)
    for i in remaining:
        if len(chosen) >= n:
            break
        chosen.append(i)
    return [combos[i] for i in sorted(chosen)]
