"""The leaves of ``fn``'s result that :func:`assert_paths_agree` compares, and how.

Tensors are compared numerically (a Python float or complex as a float32 or
complex64 tensor, a NumPy array or scalar of a numeric or bool dtype as the
tensor it converts to); other values (ints, bools, strings, None, dtypes, sizes,
devices, the result's structure) by equality.  A leaf whose type has identity
equality only (a ``torch.Generator``, a module, a plain ``object()``) is not a
numeric result: each run returns a new object, so identity would always
"differ".  It is replaced by an :class:`Identity` that keeps its type, so
only the type is compared and the leaf is listed as not compared.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["Identity", "identity_only", "results_of", "same_value"]


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


def identity_only(leaf: object) -> bool:
    """Whether ``leaf``'s type inherits ``object``'s identity equality (and is no singleton).

    A TorchScript object (``torch.ScriptObject``: a profiler range's handle, a
    custom class instance) counts too: it is a handle to an object each run makes anew.
    """
    if isinstance(leaf, torch.ScriptObject):
        return True
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
        elif (array := _numpy_tensor(leaf)) is not None:  # ``.numpy()`` of a result
            results.append((f"output {i}", array))
        elif identity_only(leaf):
            kind = type(leaf)
            results.append((f"output {i}", Identity(f"{kind.__module__}.{kind.__qualname__}")))
        else:
            results.append((f"output {i}", leaf))
    return results, diff


def _numpy_tensor(leaf: object) -> torch.Tensor | None:
    """A NumPy array or scalar of a numeric or bool dtype as a tensor (a copy), else None."""
    np = sys.modules.get("numpy")
    if (
        np is None
        or not isinstance(leaf, (np.ndarray, np.generic))
        or leaf.dtype.kind not in "biufc"
    ):
        return None
    try:
        return torch.from_numpy(np.array(leaf, copy=True))
    except (TypeError, ValueError, RuntimeError):  # a dtype torch has no tensor of
        return None


def same_value(a: object, b: object) -> bool:
    """Whether two results that are not tensors (nor Python floats) are equal.

    A value whose ``==`` gives no truth value (an array of a dtype no tensor
    holds) is compared as an array, element for element, where NumPy reads it:
    never by its text, which NumPy shortens for large arrays.
    """
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:
        np = sys.modules.get("numpy")
        if np is not None and isinstance(a, np.ndarray):
            return a.dtype == b.dtype and bool(np.array_equal(a, b))  # type: ignore[attr-defined]
        return repr(a) == repr(b)
