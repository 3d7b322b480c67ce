"""The ``@pytest.mark.backends`` marker: its signature, binding and validation.

The marker's arguments are bound by calling :func:`backends`, whose signature
*is* the marker's, so the documentation, the marker help line and the parser
cannot drift apart.  :func:`resolve` then checks the names against the axis
registry and merges markers from the function, its class and its module.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pytest

from pytest_backends.matrix.configs import AxisRegistry

__all__ = [
    "MARKER",
    "BackendsMarkerWarning",
    "MarkerError",
    "MarkerSpec",
    "added_after_expansion",
    "backends",
    "marker_line",
    "resolve",
]

#: The marker's name.
MARKER = "backends"


class MarkerError(ValueError):
    """A ``@pytest.mark.backends`` marker names an unknown axis or value, or repeats one."""


@dataclass(frozen=True)
class MarkerSpec:
    """One bound marker: ``(axis, values)`` pairs; ``values`` is ``None`` for "all values"."""

    axes: tuple[tuple[str, tuple[str, ...] | None], ...]


def backends(*axes: str, **values: str | Sequence[str]) -> MarkerSpec:
    """Run the test once per backend configuration (with ``--backends-matrix``).

    ``axes`` name axes whose every value is used: ``backends("mkldnn", "tf32")``.
    ``values`` pick values of an axis: ``backends(sdpa=["math", "flash"])`` or
    ``backends(device="cuda")``.  Both can be combined; the test runs over
    the product of all axes named.  Without ``--backends-matrix`` a marked test
    runs once, with torch's defaults.
    """
    pairs: list[tuple[str, tuple[str, ...] | None]] = []
    for axis in axes:
        if not isinstance(axis, str):
            raise MarkerError(
                f"axis names are strings, got {axis!r} ({type(axis).__name__}); "
                "pick values with keywords, e.g. backends(sdpa=['math'])"
            )
        pairs.append((axis, None))
    for axis, chosen in values.items():
        if isinstance(chosen, str):
            picked: tuple[str, ...] = (chosen,)
        elif isinstance(chosen, Sequence) and all(isinstance(v, str) for v in chosen):
            picked = tuple(chosen)
        else:
            raise MarkerError(f"{axis}={chosen!r}: values are a string or a list of strings")
        if not picked:
            raise MarkerError(
                f"{axis}=[] selects no value: pick at least one, e.g. backends({axis}=[...]), "
                f"or name the axis for all its values: backends({axis!r})"
            )
        _check_unique(axis, picked)
        pairs.append((axis, picked))
    if not pairs:
        raise MarkerError(
            "the marker names no axis: name one or more, e.g. backends('mkldnn') or "
            "backends(sdpa=['math', 'flash']), or remove the marker"
        )
    names = [axis for axis, _ in pairs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        axis = repeated[0]
        raise MarkerError(
            f"axis {axis!r} is given twice in one marker: name it once, as "
            f"backends({axis!r}) for all its values or backends({axis}=[...]) for some"
        )
    return MarkerSpec(tuple(pairs))


def _check_unique(axis: str, picked: tuple[str, ...]) -> None:
    # A repeated value would silently run once: it is a mistake (a typo for another
    # value, or a copy-paste), so say which, whatever the axis.
    once = list(dict.fromkeys(picked))
    if len(once) == len(picked):
        return
    repeated = [v for v in once if picked.count(v) > 1]
    which = "value" if len(repeated) == 1 else "values"
    raise MarkerError(
        f"axis {axis!r} lists {which} {', '.join(map(repr, repeated))} more than once: name "
        f"each value once, backends({axis}={once!r})"
    )


def marker_line() -> str:
    """The ``markers`` ini line, built from :func:`backends`'s signature."""
    params = inspect.signature(backends).parameters.values()
    shown = ", ".join(
        ("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + p.name
        for p in params
    )
    return (
        f"{MARKER}({shown}): run the test once per backend configuration of the named axes "
        "(with --backends-matrix), e.g. backends('mkldnn', sdpa=['math', 'flash'])"
    )


def _suggest(name: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    # Another spelling of a valid name (torch prints levels as "AVX512") first.
    folded = [c for c in choices if c.casefold() == name.casefold()]
    close = folded or difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check(spec: MarkerSpec, registry: AxisRegistry) -> None:
    for axis, chosen in spec.axes:
        if axis not in registry:
            raise MarkerError(
                f"unknown axis {axis!r}{_suggest(axis, registry.names)}; "
                f"valid axes: {', '.join(registry.names)}"
            )
        valid = registry.axis(axis).value_names
        for value in chosen or ():
            if value not in valid:
                raise MarkerError(
                    f"axis {axis!r} has no value {value!r}{_suggest(value, valid)}; "
                    f"valid values: {', '.join(valid)}"
                )


def bind(args: Sequence[object], kwargs: Mapping[str, object]) -> MarkerSpec:
    """Bind one marker's arguments through :func:`backends` (raises :class:`MarkerError`)."""
    try:
        inspect.signature(backends).bind(*args, **kwargs)
    except TypeError as exc:
        raise MarkerError(str(exc)) from None
    return backends(*args, **kwargs)  # type: ignore[arg-type]


def resolve(
    marks: Sequence[tuple[Sequence[object], Mapping[str, object]]], registry: AxisRegistry
) -> dict[str, tuple[str, ...]]:
    """Merge markers (closest first) into ``{axis: values}`` in registry order.

    Axes from every level (function, class, module) are combined; where two
    levels name the same axis, the closest marker decides its values.
    """
    merged: dict[str, tuple[str, ...]] = {}
    for args, kwargs in marks:
        spec = bind(args, kwargs)
        _check(spec, registry)
        for axis, chosen in spec.axes:
            if axis in merged:
                continue
            values = registry.axis(axis).value_names
            merged[axis] = values if chosen is None else tuple(v for v in values if v in chosen)
    return {name: merged[name] for name in registry.names if name in merged}


class BackendsMarkerWarning(pytest.PytestWarning):
    """A ``@pytest.mark.backends`` marker that the matrix could not honour, and why."""


def added_after_expansion(item: pytest.Item) -> str:
    """Why markers added to an expanded test are ignored, naming ``pytest.param`` when so."""
    callspec = getattr(item, "callspec", None)
    if any(m.name == "backends" for m in getattr(callspec, "marks", ())):
        return (
            "a backends marker given to pytest.param(..., marks=...) is not combined with "
            "the test's own: the matrix expands a test's markers once, for all its "
            "parameters. Put the axes on the test, or make that parameter a test of its own"
        )
    return (
        "its markers changed after the matrix expanded it, so the added ones "
        "are ignored. Put every backends marker on the test (decorator, class "
        "or module pytestmark), or add them all in the same hook"
    )
