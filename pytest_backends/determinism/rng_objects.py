"""The RNG objects a test reuses across runs, captured once and put back before every run.

A test reaches ``torch.Generator``, ``numpy.random.Generator``,
``numpy.random.RandomState`` and ``random.Random`` objects through its fixture
values, its module's globals, its class and its instance (their ``__dunder__`` names
excepted: the interpreter's, not the test's), and through the lists,
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


def _state_of(torch: Any, value: object) -> tuple[Any, Any] | None:
    """``(set_state, state)`` of an RNG object the runs restore (None: a global RNG)."""
    if isinstance(value, torch.Generator):
        if value is torch.default_generator:
            return None  # the global RNG: RngState restores it
        return value.set_state, value.get_state()
    if isinstance(value, random.Random):
        return value.setstate, value.getstate()
    bits = getattr(value, "bit_generator", None)
    if bits is not None:  # numpy.random.Generator
        return lambda state: setattr(bits, "state", state), bits.state
    return value.set_state, value.get_state()  # type: ignore[attr-defined]


def _rngs(torch: Any, value: object, depth: int, seen: set[int]) -> Iterator[Any]:
    """The RNG objects in ``value`` (``carried``'s kinds; the Python and NumPy globals not)."""
    from pytest_backends.determinism.carried import attributes, rng_kind

    if id(value) in seen:
        return
    seen.add(id(value))
    if rng_kind(torch, value) is not None:
        yield value
        return
    if depth > 0:
        for _, item in attributes(value, _WIDTH):
            yield from _rngs(torch, item, depth - 1, seen)


class RngObjects:
    """The states of the RNG objects a test can reach, to restore between runs."""

    def __init__(self, states: list[tuple[Any, Any]]) -> None:
        self._states = states

    @classmethod
    def capture(cls, roots: Iterable[object]) -> RngObjects:
        """Capture every RNG object in ``roots`` (and in their containers and attributes)."""
        states: list[tuple[Any, Any]] = []
        torch = sys.modules.get("torch")
        if torch is None:
            return cls(states)
        seen: set[int] = set()
        for root in roots:
            for rng in _rngs(torch, root, _DEPTH, seen):
                try:
                    captured = _state_of(torch, rng)
                except (RuntimeError, TypeError, ValueError):
                    continue  # a generator whose state cannot be read (another device's)
                if captured is not None:
                    states.append(captured)
        return cls(states)

    def restore(self) -> None:
        """Put every captured RNG object back to its captured state."""
        for set_state, state in self._states:
            set_state(state)

    def __len__(self) -> int:
        return len(self._states)


def _dunder(name: object) -> bool:
    return isinstance(name, str) and name.startswith("__") and name.endswith("__")


def roots_of(item: Any) -> list[object]:
    """Where a test's reused RNGs live: fixture values, its module, class and instance."""
    roots: list[object] = []
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        roots.append(dict(funcargs))
    for owner in (getattr(item, "module", None), getattr(item, "cls", None)):
        namespace = getattr(owner, "__dict__", None)
        if namespace is not None:
            # Dunder names hold the interpreter's objects, not the test's: the module's
            # ``__loader__`` reaches pytest's config and plugins (thousands of objects).
            roots.append({k: v for k, v in namespace.items() if not _dunder(k)})
    instance = getattr(item, "instance", None)
    namespace = getattr(instance, "__dict__", None)
    if isinstance(namespace, dict):
        roots.append(dict(namespace))
    return roots


def reached(item: Any) -> list[Any]:
    """The RNG objects :class:`RngObjects` restores for ``item``'s runs."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    seen: set[int] = set()
    return [rng for root in roots_of(item) for rng in _rngs(torch, root, _DEPTH, seen)]
