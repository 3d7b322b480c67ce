"""The RNG objects a test reuses across runs, captured once and put back before every run.

A test reaches ``torch.Generator``, ``numpy.random.Generator``,
``numpy.random.RandomState`` and ``random.Random`` objects through its fixture
values, its module's globals, its class and its instance, and through the lists,
tuples, dicts and attributes held there (``holder.gen``, ``loader.generator``).
Each is captured when the call phase begins (:meth:`RngObjects.capture`) and
set back before every later run (:meth:`RngObjects.restore`), as the global
RNGs are, so a test drawing from one draws the same numbers in every run.

This is for coverage, not for the verdict: both recorders key a ``torch``
generator argument by its state at call time, and NumPy or Python draws reach
the recorded ops as tensor data, which is read by content; an RNG the harness
does not reach gives differing inputs in later runs, and the test is "not
checked" with that reason, never blamed. The global generators (torch's
default, NumPy's legacy one, :mod:`random`'s) are reset by
:class:`~pytest_backends.determinism.api.RngState`, not here.

Importing this module imports neither torch nor NumPy.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["RngObjects", "reached", "roots_of"]

# How deep containers and attributes in fixture values and globals are searched (the
# roots are dicts of them: as deep as carried.py names RNGs), how many items of each.
_DEPTH = 4
_WIDTH = 1000


def _state_of(value: object) -> tuple[Any, Any] | None:
    """``(state, set_state)`` of an RNG object the runs restore, or None for anything else."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Generator):
        if value is torch.default_generator:
            return None  # the global RNG: RngState restores it
        return value.get_state(), value.set_state
    if isinstance(value, random.Random):
        if value is getattr(random, "_inst", None):
            return None
        return value.getstate(), value.setstate
    nprandom: Any = getattr(sys.modules.get("numpy"), "random", None)
    if nprandom is None:
        return None
    if isinstance(value, nprandom.RandomState):
        if value is getattr(nprandom.mtrand, "_rand", None):
            return None
        return value.get_state(), value.set_state
    if isinstance(value, nprandom.Generator):
        bits = value.bit_generator
        return bits.state, lambda state: setattr(bits, "state", state)
    return None


def _is_rng(value: object) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Generator):
        return True
    if isinstance(value, random.Random):
        return True
    nprandom: Any = getattr(sys.modules.get("numpy"), "random", None)
    return nprandom is not None and isinstance(value, (nprandom.Generator, nprandom.RandomState))


def _rngs(value: object, depth: int, seen: set[int]) -> Iterator[Any]:
    if id(value) in seen:
        return
    seen.add(id(value))
    if _is_rng(value):
        yield value
        return
    if depth > 0:
        from pytest_backends.determinism.carried import attributes

        for _, item in attributes(value, _WIDTH):
            yield from _rngs(item, depth - 1, seen)


class RngObjects:
    """The states of the RNG objects a test can reach, to restore between runs."""

    def __init__(self, states: list[tuple[Any, Any]]) -> None:
        self._states = states

    @classmethod
    def capture(cls, roots: Iterable[object]) -> RngObjects:
        """Capture every RNG object in ``roots`` (and in their containers and attributes)."""
        states: list[tuple[Any, Any]] = []
        seen: set[int] = set()
        for root in roots:
            for rng in _rngs(root, _DEPTH, seen):
                try:
                    captured = _state_of(rng)
                except (RuntimeError, TypeError, ValueError):
                    continue  # a generator whose state cannot be read (another device's)
                if captured is not None:
                    states.append((captured[1], captured[0]))
        return cls(states)

    def restore(self) -> None:
        """Put every captured RNG object back to its captured state."""
        for set_state, state in self._states:
            set_state(state)

    def __len__(self) -> int:
        return len(self._states)


def roots_of(item: Any) -> list[object]:
    """Where a test's reused RNGs live: fixture values, its module, class and instance."""
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


def reached(item: Any) -> list[Any]:
    """The RNG objects :class:`RngObjects` restores for ``item``'s runs."""
    seen: set[int] = set()
    return [rng for root in roots_of(item) for rng in _rngs(root, _DEPTH, seen)]
