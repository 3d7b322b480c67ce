"""``@pytest.mark.batch_invariant``: its signature, its parser and its ini line.

The marker's arguments are bound through :func:`batch_invariant`, whose
signature is the marker's, so the documentation and the parser cannot drift
apart. Nothing here imports torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

__all__ = ["MARKER", "MarkerError", "batch_invariant", "bind", "marker_line"]

#: The marker's name.
MARKER = "batch_invariant"


class MarkerError(ValueError):
    """A ``@pytest.mark.batch_invariant`` marker whose arguments are invalid."""


def batch_invariant(
    *,
    sizes: Sequence[int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    tolerance: object = None,
    permute: bool = True,
) -> dict[str, Any]:
    """The marker's signature: defaults for the test's ``assert_batch_invariant`` calls.

    ``sizes``: sub-batch sizes; ``rtol``/``atol`` or ``tolerance`` (``(rtol,
    atol)`` or ``"report"``): tolerance mode; ``permute``: also compare the
    batch permuted. A value given in the call itself wins.
    """
    if sizes is not None and (
        isinstance(sizes, (str, bytes))
        or not isinstance(sizes, Sequence)
        or not sizes
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)
    ):
        raise MarkerError(f"sizes must be a non-empty list of positive ints, got {sizes!r}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
        ):
            raise MarkerError(f"{name} must be a number >= 0, got {value!r}")
    if tolerance is not None and (rtol is not None or atol is not None):
        raise MarkerError("give tolerance= or rtol/atol, not both")
    if tolerance is not None and tolerance != "report":
        try:
            pair: tuple[Any, ...] = tuple(tolerance)  # type: ignore[arg-type]
            ok = len(pair) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair
            )
        except TypeError:
            ok = False
        if not ok:
            raise MarkerError(f"tolerance must be (rtol, atol) or 'report', got {tolerance!r}")
    if not isinstance(permute, bool):
        raise MarkerError(f"permute must be True or False, got {permute!r}")
    return {"sizes": sizes, "rtol": rtol, "atol": atol, "tolerance": tolerance, "permute": permute}


def bind(args: Sequence[object], kwargs: dict[str, object]) -> dict[str, Any]:
    """Bind one marker's arguments through :func:`batch_invariant` (raises :class:`MarkerError`)."""
    try:
        inspect.signature(batch_invariant).bind(*args, **kwargs)
    except TypeError as exc:
        raise MarkerError(str(exc)) from None
    return batch_invariant(*args, **kwargs)  # type: ignore[arg-type]


def marker_line() -> str:
    """The ``markers`` ini line, built from :func:`batch_invariant`'s signature."""
    params = ", ".join(p.name for p in inspect.signature(batch_invariant).parameters.values())
    return (
        f"{MARKER}(*, {params}): the test's assert_batch_invariant checks are recorded op by "
        "op in the batch-invariance census and gated by --backends-batch-baseline"
    )
