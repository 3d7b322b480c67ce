"""Inputs that are containers of tensors: a dict of ``input_ids`` and ``attention_mask``, a tuple.

Each tensor in a list, tuple, named tuple or dict input is an input of its
own to the check, batched along that input's ``dim``; every call gets the
containers rebuilt around its rows. Importing this module does not import
torch; its functions do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Flat", "flatten"]

# A container's rebuild recipe: (its type, its keys or None, its children's recipes); a leaf: its
# index among the flattened inputs.
Spec = Any


def _holds_tensor(value: object, depth: int = 0) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if depth > 8:
        return False
    if isinstance(value, Mapping):
        return any(_holds_tensor(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v, depth + 1) for v in value)
    return False


def _split(value: object, leaves: list[object], names: list[str], name: str) -> Spec:
    if isinstance(value, Mapping) and _holds_tensor(value):
        keys = list(value.keys())
        children = [_split(value[k], leaves, names, f"{name}[{k!r}]") for k in keys]
        return (type(value), keys, children)
    if isinstance(value, (list, tuple)) and _holds_tensor(value):
        children = [_split(v, leaves, names, f"{name}[{i}]") for i, v in enumerate(value)]
        return (type(value), None, children)
    leaves.append(value)
    names.append(name)
    return len(leaves) - 1


def _build(spec: Spec, leaves: Sequence[object]) -> object:
    if isinstance(spec, int):
        return leaves[spec]
    kind, keys, children = spec
    items = [_build(c, leaves) for c in children]
    if keys is not None:
        try:
            return kind(zip(keys, items))
        except Exception:  # a mapping type that cannot be made from pairs
            return dict(zip(keys, items))
    if kind is list:
        return items
    if hasattr(kind, "_fields"):  # a named tuple
        return kind(*items)
    try:
        return kind(items)
    except Exception:
        return tuple(items)


class Flat:
    """The flattened inputs of a check, their batch dims, and ``fn`` taking the leaves.

    ``names[i]`` is where leaf ``i`` sits (``input 0['attention_mask']``).
    """

    def __init__(self, fn: Callable[..., object], inputs: Sequence[object], dim: Any) -> None:
        self.leaves: list[object] = []
        self.names: list[str] = []
        specs = [_split(x, self.leaves, self.names, f"input {i}") for i, x in enumerate(inputs)]
        self.dim: Any = dim
        if isinstance(dim, (list, tuple)) and len(dim) == len(inputs):
            # One entry per input: every leaf of the input takes it (a value that is not a
            # tensor of at least one dimension is passed whole).
            import torch

            owner = [int(n.split("[", 1)[0].split()[1]) for n in self.names]
            self.dim = [
                dim[o] if isinstance(x, torch.Tensor) and x.dim() > 0 else None
                for x, o in zip(self.leaves, owner)
            ]

        def call(*leaves: object) -> object:
            return fn(*(_build(s, leaves) for s in specs))

        call.__wrapped__ = fn  # type: ignore[attr-defined]
        self.fn = call


def flatten(fn: Callable[..., object], inputs: Sequence[object], dim: Any) -> Flat | None:
    """The inputs flattened where one is a container of tensors; None where none is."""
    if not any(isinstance(x, (list, tuple, Mapping)) and _holds_tensor(x) for x in inputs):
        return None
    return Flat(fn, inputs, dim)
