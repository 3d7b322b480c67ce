"""Explicit ``torch.Generator`` objects that a test reuses across determinism runs.

The global RNGs are put back to their state at the start of the call phase
before every run (:class:`~pytest_backends.determinism.api.RngState`). A
``torch.Generator`` the test receives from a fixture, a module global, its
class or its instance is treated the same way: its state is captured when
the call phase begins and restored before each later run, so
``torch.randn(8, generator=gen)`` draws the same numbers in every run.

This restoring is for coverage only, not for the verdict: both recorders key
a generator argument by its state at call time, so a generator the harness
does not reach (one kept deeper inside an object) simply gives differing
inputs in later runs, and the test is "not checked" with that reason, never
blamed.

Importing this module imports nothing heavy; the functions run only when
torch is loaded.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["GeneratorStates", "roots_of"]

# How deep containers in fixture values and globals are searched, and how many items
# of each (a long list of numbers in a module global must not cost every test).
_DEPTH = 2
_WIDTH = 1000


def _generators(value: object, depth: int, seen: set[int]) -> Iterator[Any]:
    torch = sys.modules.get("torch")
    if torch is None or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Generator):
        yield value
        return
    if depth <= 0:
        return
    items: Iterable[object]
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return
    for item in itertools.islice(items, _WIDTH):
        yield from _generators(item, depth - 1, seen)


class GeneratorStates:
    """The states of the explicit generators a test can reach, to restore between runs."""

    def __init__(self, states: list[tuple[Any, Any]]) -> None:
        self._states = states

    @classmethod
    def capture(cls, roots: Iterable[object]) -> GeneratorStates:
        """Capture every ``torch.Generator`` in ``roots`` (and in containers there)."""
        torch = sys.modules.get("torch")
        states: list[tuple[Any, Any]] = []
        if torch is None:
            return cls(states)
        seen: set[int] = set()
        defaults = {id(torch.default_generator)}
        for root in roots:
            for gen in _generators(root, _DEPTH, seen):
                if id(gen) in defaults:
                    continue  # the global RNG: RngState restores it
                try:
                    states.append((gen, gen.get_state()))
                except (RuntimeError, TypeError):
                    continue
        return cls(states)

    def restore(self) -> None:
        """Put every captured generator back to its captured state."""
        for gen, state in self._states:
            gen.set_state(state)

    def __len__(self) -> int:
        return len(self._states)


def roots_of(item: Any) -> list[object]:
    """Where a test's reused generators live: fixture values, its module, class and instance."""
    roots: list[object] = []
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        roots.append(dict(funcargs))
    for owner in (getattr(item, "module", None), getattr(item, "cls", None)):
        namespace = getattr(owner, "__dict__", None)
        if namespace is not None:
            roots.append(dict(namespace))
    instance = getattr(item, "instance", None)
    namespace = getattr(instance, "__dict__", None)
    if isinstance(namespace, dict):
        roots.append(dict(namespace))
    return roots
