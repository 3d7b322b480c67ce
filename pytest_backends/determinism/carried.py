"""State a test keeps between its runs that the harness cannot reset, in words.

Before each run the harness resets the global RNGs and the ``torch.Generator``
objects it finds in the test's fixture values, module globals, class and
instance (:class:`~pytest_backends.determinism.runs.GeneratorStates`). Some
state outlives the runs all the same: a ``DataLoader`` with persistent workers
keeps its worker processes (and their RNG states) and its iterator from one
run to the next; a generator held in an object's attributes
(``loader.generator``, ``loader.sampler.generator``) is never reset, nor is a
``numpy.random.Generator``, ``RandomState`` or ``random.Random`` instance (only
NumPy's and :mod:`random`'s global RNGs are). When a
test is not checked because its inputs differ between runs, :func:`carried_state`
names such state among the places the harness searches, as the likely cause.

Importing this module does not import torch.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["carried_state", "places_of"]

# How deep attributes are followed, and how many items of each object are looked at.
_DEPTH = 3
_WIDTH = 200
_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def places_of(item: Any) -> list[tuple[str, object]]:
    """``(what, value)`` for each place the harness searches for generators."""
    places: list[tuple[str, object]] = []
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        places += [(f"fixture {name!r}", value) for name, value in funcargs.items()]
    module = getattr(getattr(item, "module", None), "__dict__", None)
    if isinstance(module, dict):
        places += [(f"module global {name!r}", v) for name, v in module.items()]
    cls = getattr(getattr(item, "cls", None), "__dict__", None)
    if isinstance(cls, dict):
        places += [(f"class attribute {name!r}", v) for name, v in cls.items()]
    instance = getattr(getattr(item, "instance", None), "__dict__", None)
    if isinstance(instance, dict):
        places += [(f"attribute 'self.{name}'", v) for name, v in instance.items()]
    return places


def _attributes(value: object) -> Iterator[tuple[str, object]]:
    if isinstance(value, dict):
        pairs: Any = ((f"[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        pairs = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        namespace = getattr(value, "__dict__", None)
        if not isinstance(namespace, dict):
            return
        pairs = ((f".{k}", v) for k, v in namespace.items() if not k.startswith("__"))
    yield from itertools.islice(pairs, _WIDTH)


def _rng_kind(torch: Any, value: object) -> str | None:
    """``"torch.Generator"``, ``"numpy.random.Generator"``, ...: the RNG ``value`` is, if any."""
    if isinstance(value, torch.Generator):
        return "torch.Generator"
    import random

    if isinstance(value, random.Random) and value is not getattr(random, "_inst", None):
        return f"{type(value).__module__}.{type(value).__qualname__}"
    nprandom: Any = getattr(sys.modules.get("numpy"), "random", None)
    if nprandom is not None and isinstance(value, (nprandom.Generator, nprandom.RandomState)):
        if value is getattr(nprandom.mtrand, "_rand", None):
            return None  # NumPy's global RNG: the runs reset it
        return f"numpy.random.{type(value).__name__}"
    return None


def _held_rngs(
    torch: Any, path: str, value: object, depth: int, seen: set[int]
) -> Iterator[tuple[int, str, str]]:
    """``(id, path, kind)`` of the RNGs in ``value`` not in ``seen`` (restored ones are)."""
    if id(value) in seen:
        return
    kind = _rng_kind(torch, value)
    if kind is not None:
        yield id(value), path, kind
        return
    if depth <= 0 or isinstance(value, (*_SKIP, torch.Tensor)):
        return
    seen.add(id(value))
    for name, inner in _attributes(value):
        yield from _held_rngs(torch, f"{path}{name}", inner, depth - 1, seen)


def _persistent_loader(torch: Any, value: object) -> bool:
    data = sys.modules.get("torch.utils.data")
    loader = getattr(data, "DataLoader", None)
    return (
        loader is not None
        and isinstance(value, loader)
        and bool(getattr(value, "persistent_workers", False))
        and getattr(value, "_iterator", None) is not None
    )


def carried_state(item: Any) -> list[str]:
    """What ``item`` keeps between runs that the harness cannot reset (phrases), if any."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    from pytest_backends.determinism.runs import reached_generators

    found: list[str] = []
    # The generators the runs restore (and the default one) are not carried state.
    seen = {id(torch.default_generator), *map(id, reached_generators(item))}
    for what, value in places_of(item):
        if isinstance(value, _SKIP) or id(value) in seen:
            continue
        parts: list[str] = []
        if _persistent_loader(torch, value):
            parts.append(
                "a DataLoader with persistent workers (its worker processes, with their RNG "
                "states, and its iterator carry over from one run to the next)"
            )
        short = what.split(" ", 1)[1].strip("'")
        paths: dict[int, tuple[str, str]] = {}
        for rng, path, kind in _held_rngs(torch, short, value, _DEPTH, set(seen)):
            if rng not in paths or len(path) < len(paths[rng][0]):
                paths[rng] = (path, kind)  # the shortest path to each RNG
        seen.add(id(value))
        held = [f"{path}: a {kind}" for path, kind in paths.values()]
        if held:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            parts.append(f"RNG state the runs do not reset ({shown})")
        if parts:
            found.append(f"{what}: {', '.join(parts)}")
    return found
