"""The leak modes, and ``@pytest.mark.backends_leaks(mode)``: the mode of one test or module."""

from __future__ import annotations

import pytest

from pytest_backends import _options

__all__ = ["LEAK_MODES", "MARKER", "marker_line", "marker_mode", "parse_leak_mode"]

MARKER = "backends_leaks"
#: The leak modes, for ``--backends-leaks`` and the marker alike.
LEAK_MODES = ("fail", "warn", "off")


def parse_leak_mode(value: str, source: str) -> str:
    """Validate a leak mode; ``source`` names where it came from for the error."""
    mode = value.strip().lower()
    if _options.is_off(mode):
        return "off"
    if mode not in LEAK_MODES:
        raise pytest.UsageError(
            f"{source}: invalid value {value!r}; choose one of {', '.join(LEAK_MODES)}"
        )
    return mode


def marker_line() -> str:
    """The marker's ``markers`` ini line."""
    return f"{MARKER}(mode): override --backends-leaks (fail, warn, off) for one test"


def _safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not break the error message
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 120 else text[:117] + "..."


#: Whether a node type reads its markers as pytest's own nodes do (``pytest.Item``'s methods).
_PLAIN_TYPES: dict[type, bool] = {}
_MARKER_METHODS = ("get_closest_marker", "iter_markers", "iter_markers_with_node", "iter_parents")


def _closest(node: pytest.Item | pytest.Collector) -> pytest.Mark | None:
    """``node.get_closest_marker(MARKER)``, read without its generators (once per test).

    The same walk as pytest's: the node's own markers, then each parent's; a
    node type that reads its markers otherwise is asked through its own method.
    """
    kind = type(node)
    plain = _PLAIN_TYPES.get(kind)
    if plain is None:
        plain = _PLAIN_TYPES[kind] = all(
            getattr(kind, name, None) is getattr(pytest.Item, name, None)
            for name in _MARKER_METHODS
        )
    if not plain:
        return node.get_closest_marker(MARKER)
    current: pytest.Item | pytest.Collector | pytest.Session | None = node
    while current is not None:
        for mark in current.own_markers:
            if getattr(mark, "name", None) == MARKER:
                return mark
        current = current.parent
    return None


def marker_mode(node: pytest.Item | pytest.Collector, default: str) -> tuple[str, str | None]:
    """The leak mode for ``node``: its closest ``backends_leaks`` marker, else ``default``.

    Never raises: a malformed marker gives ``(default, message)`` so that the
    caller can fail that one test and let every other test run.
    """
    marker = _closest(node)
    if marker is None:
        return default, None
    args = marker.args
    if (
        not marker.kwargs
        and len(args) == 1
        and isinstance(args[0], str)
        and args[0].strip().lower() in LEAK_MODES
    ):
        return args[0].strip().lower(), None
    given = ", ".join(
        [_safe_repr(a) for a in args] + [f"{k}={_safe_repr(v)}" for k, v in marker.kwargs.items()]
    )
    return default, (
        f"@pytest.mark.backends_leaks takes one mode, one of {', '.join(map(repr, LEAK_MODES))} "
        f'(for example @pytest.mark.backends_leaks("warn")); got backends_leaks({given})'
    )
