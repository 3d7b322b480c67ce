"""The leaves of ``fn``'s result that :func:`assert_paths_agree` compares, and how.

Tensors are compared numerically (a Python float or complex as a float32 or
complex64 tensor); other values (ints, bools, strings, None, dtypes, sizes,
devices, the result's structure) by equality.  A leaf whose type has identity
equality only (a ``torch.Generator``, a module, a plain ``object()``) is not a
numeric result: each run returns a new object, so identity would always
"differ".  It is replaced by an :class:`Identity` that keeps its type, so
only the type is compared and the leaf is listed as not compared.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["Identity", "results_of", "same_value"]


@dataclass(frozen=True)
class Identity:
    """Stands for a result leaf whose type compares by identity only; equal by type."""

    type_name: str

    def __repr__(self) -> str:
        return f"<a {self.type_name}: identity equality only>"


# Types compared by identity, and rightly: each of their values is one object.
_SINGLETONS = (
    type(None),
    type(Ellipsis),
    type,
    enum.Enum,
    torch.dtype,
    torch.layout,
    torch.memory_format,
    torch.qscheme,
)


def _identity_only(leaf: object) -> bool:
    """Whether ``leaf``'s type inherits ``object``'s identity equality (and is no singleton)."""
    eq: object = type(leaf).__eq__
    return eq is object.__eq__ and not isinstance(leaf, _SINGLETONS)


def results_of(out: Any) -> tuple[list[tuple[str, object]], list[torch.Tensor]]:
    """Every leaf of ``fn``'s result, copied (tensors of every dtype, and Python values),
    with the structure first; and the differentiable float tensors, for the backward.
    """
    leaves, spec = tree_flatten(out)
    results: list[tuple[str, object]] = [("output structure", spec)]
    diff = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            results.append((f"output {i}", leaf.detach().clone()))
            if leaf.requires_grad and (leaf.is_floating_point() or leaf.is_complex()):
                diff.append(leaf)
        elif isinstance(leaf, (float, complex)):  # a float32 loss's .item(), most often
            dtype = torch.complex64 if isinstance(leaf, complex) else torch.float32
            results.append((f"output {i}", torch.tensor(leaf, dtype=dtype)))
        elif _identity_only(leaf):
            kind = type(leaf)
            results.append((f"output {i}", Identity(f"{kind.__module__}.{kind.__qualname__}")))
        else:
            results.append((f"output {i}", leaf))
    return results, diff


def same_value(a: object, b: object) -> bool:
    """Whether two results that are not tensors (nor Python floats) are equal."""
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # no boolean equality (an array): compared by its text
        return type(a) is type(b) and repr(a) == repr(b)
