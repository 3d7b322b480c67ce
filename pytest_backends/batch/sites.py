"""Where in the user's code an op was called: one call, not only one line.

Two runs that call different ops from the same call site (the same frame
outside torch and this plugin, at the same line and the same bytecode
instruction) ran one call of the user's code, inside which torch chose the
ops (its matmul: ``t`` + ``mm`` for eight rows, ``view`` + ``addmm`` for
one). Different call sites are a branch in the user's code, even on one line
(``f(x) if x.shape[0] > 1 else g(x)``, a comprehension over the rows).

Importing this module imports nothing outside this package.
"""

from __future__ import annotations

from typing import Any

from pytest_backends.determinism.record import user_frame

__all__ = ["Site", "call_site"]

#: (file, line, function, bytecode offset) of a call in the user's code.
Site = tuple[str, int, str, int]


def call_site(frame: Any) -> Site | None:
    """The call in the user's code that ``frame`` (a caller of an op) runs under, or None."""
    found = user_frame(frame)
    if found is None:
        return None
    while frame is not None:
        code = frame.f_code
        if (code.co_filename, frame.f_lineno, code.co_name) == found:
            return (*found, frame.f_lasti)
        frame = frame.f_back
    return None
