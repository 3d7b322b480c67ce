"""State a test keeps between its runs that the harness cannot reset, in words.

Before each run the harness resets the global RNGs and the RNG objects
(``torch.Generator``, ``numpy.random.Generator`` and ``RandomState``,
``random.Random``) it finds in the test's fixture values, module globals,
class and instance, and in their containers and attributes (``holder.gen``,
``loader.generator``: :class:`~pytest_backends.determinism.rng_objects.RngObjects`,
which walks them with :func:`attributes`). Some state outlives the runs all
the same: a ``DataLoader`` with persistent workers keeps its worker processes
(and their RNG states) and its iterator from one run to the next; an iterator
(``iter(loader)``, a generator, ``itertools.cycle``) that is a fixture value
or an instance attribute gives each run the items after those the previous
run took; an RNG object out of the harness's reach (deeper inside another
object) is never reset; a module global the runs rebind (``global
seed; seed += 1``) and a container that grows (a fixture list each run appends
to) start each run from what the previous one left. When a test is not
checked because its inputs differ between runs, :func:`carried_state` names
such state among the places the harness searches, as the likely cause. What
the places held when the call phase began is noted (:func:`note_start`, ids
and sizes only) so that a rebinding or a growth is named only when it
happened; an RNG object in a module global or class attribute is named only
when the test's code (or a module function it calls) names it.

Importing this module does not import torch.
"""

from __future__ import annotations

import collections
import itertools
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["attributes", "carried_state", "note_start", "places_of", "rng_kind"]

# How deep attributes are followed, and how many items of each object are looked at.
_DEPTH = 3
_WIDTH = 200
_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
# Containers whose size is noted when the call phase begins, and values shown as they are.
_SIZED = (list, dict, set, bytearray, collections.deque)
_SHOWN = (int, float, str, bool, type(None))
_SHARED = ("module global", "class attribute")

# What the places of the test whose call phase began last held then:
# (id of the item, {place: (id of its value, the value if shown, its size if sized)}).
_start: tuple[int, dict[str, tuple[int, object, int | None]]] | None = None


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


def attributes(value: object, width: int = _WIDTH) -> Iterator[tuple[str, object]]:
    """``(".name" or "[key]", inner)`` for the items or attributes of ``value`` (at most ``width``).

    Modules, classes, functions and tensors are not looked into; an object's
    attributes are read from its ``__dict__`` without running its code.
    """
    torch = sys.modules.get("torch")
    if isinstance(value, _SKIP) or (torch is not None and isinstance(value, torch.Tensor)):
        return
    if isinstance(value, dict):
        pairs: Any = ((f"[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        pairs = ((f"[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, (set, frozenset)):
        pairs = (("[...]", v) for v in value)
    else:
        try:
            namespace = object.__getattribute__(value, "__dict__")
        except Exception:
            return
        if not isinstance(namespace, dict):
            return
        pairs = ((f".{k}", v) for k, v in namespace.items() if not k.startswith("__"))
    yield from itertools.islice(pairs, width)


def rng_kind(torch: Any, value: object) -> str | None:
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
    kind = rng_kind(torch, value)
    if kind is not None:
        yield id(value), path, kind
        return
    if depth <= 0:
        return
    seen.add(id(value))
    for name, inner in attributes(value):
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


def _iterator(value: object) -> str | None:
    """What iterator ``value`` is (``"a generator"``, ``"an itertools.cycle"``), if it is one."""
    if not isinstance(value, collections.abc.Iterator) or isinstance(value, _SKIP):
        return None
    if isinstance(value, types.GeneratorType):
        return "a generator"
    kind = type(value)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    return f"an iterator ({module}{kind.__qualname__})"


def _names_in(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for inner in code.co_consts:
        if isinstance(inner, types.CodeType):
            names |= _names_in(inner)
    return names


def _named_by_test(item: Any) -> set[str] | None:
    """The names the test's code uses (and those of the module functions it calls), if known."""
    obj = getattr(item, "obj", None)
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    names = _names_in(code)
    module = getattr(getattr(item, "module", None), "__dict__", None)
    if not isinstance(module, dict):
        return names
    for name in list(names):
        helper = module.get(name)
        if isinstance(helper, types.FunctionType) and helper.__code__ is not code:
            names |= _names_in(helper.__code__)
    return names


def _noted(value: object) -> tuple[int, object, int | None]:
    size = len(value) if isinstance(value, _SIZED) else None
    return id(value), value if isinstance(value, _SHOWN) else None, size


def note_start(item: Any) -> None:
    """Note what ``item``'s places hold now, when its call phase begins (ids and sizes)."""
    global _start
    _start = None  # another test's: no longer of use
    places = places_of(item)
    _start = (id(item), {what: _noted(v) for what, v in places if "'__" not in what})


def _changed(item: Any, what: str, value: object) -> str | None:
    """How the runs changed the place ``what`` (rebound it, resized it), if they did."""
    if _start is None or _start[0] != id(item) or what not in _start[1]:
        return None
    ident, shown, size = _start[1][what]
    now = _noted(value)
    if ident != now[0] and what.startswith((*_SHARED, "attribute")):
        if isinstance(value, _SHOWN) and type(shown) is type(value) and shown == value:
            return None  # an equal number or string again: no state kept
        was = f" ({shown!r} when the call began, {value!r} after the runs)"
        if not isinstance(value, _SHOWN) or not isinstance(shown, _SHOWN):
            was = ""
        return f"rebound during the runs{was}: each run starts from what the previous one left"
    if ident == now[0] and size is not None and now[2] is not None and now[2] != size:
        return (
            f"a {type(value).__name__} whose size changed during the runs ({size} items when "
            f"the call began, {now[2]} after the runs): each run sees what the earlier ones left"
        )
    return None


def carried_state(item: Any, restored: Iterable[object] = ()) -> list[str]:
    """What ``item`` keeps between runs that the harness cannot reset (phrases), if any.

    ``restored``: the generators the runs restore (``runs.reached_generators``).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    found: list[str] = []
    # The generators the runs restore (and the default one) are not carried state.
    seen = {id(torch.default_generator), *map(id, restored)}
    named = _named_by_test(item)
    for what, value in places_of(item):
        parts: list[str] = []
        changed = _changed(item, what, value)
        if changed is not None:
            parts.append(changed)
        short = what[what.index("'") + 1 : what.rindex("'")]
        shared = what.startswith(_SHARED)
        if (
            isinstance(value, _SKIP)
            or id(value) in seen
            or (shared and named is not None and short not in named)
        ):
            if parts:
                found.append(f"{what}: {', '.join(parts)}")
            continue
        if _persistent_loader(torch, value):
            parts.append(
                "a DataLoader with persistent workers (its worker processes, with their RNG "
                "states, and its iterator carry over from one run to the next)"
            )
        iterator = None if shared else _iterator(value)  # a fixture's or the instance's
        if iterator is not None:
            parts.append(
                f"{iterator} that each run advances (a run that takes items from it gets "
                "those after the ones the previous run took)"
            )
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
    drawn = _hypothesis_examples(item)
    if drawn:
        found.append(drawn)
    return found


def _hypothesis_examples(item: Any) -> str | None:
    """hypothesis's example generator, where an ``@given`` test draws other examples each run."""
    fn = getattr(item, "obj", None)
    if not getattr(fn, "is_hypothesis_test", False):
        return None
    settings = getattr(fn, "_hypothesis_internal_use_settings", None)
    if getattr(settings, "derandomize", False) or getattr(
        fn, "_hypothesis_internal_use_seed", None
    ):
        return None  # the same examples in every run
    return (
        "hypothesis's example generator (an @given test draws other examples in each run; "
        "give it @settings(derandomize=True) or @seed(...) to have it checked)"
    )
