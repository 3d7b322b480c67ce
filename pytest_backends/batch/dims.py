"""Batch dimensions: ``dim`` and ``out_dim`` counted from 0, and the errors about them.

A batch dimension is made non-negative once, where it is read (an input's in
:func:`~pytest_backends.batch.api.assert_batch_invariant`, an output leaf's
when its parts are taken): ``-1`` is the last dimension of each tensor, and
the comparisons add dimensions at the end (a complex tensor's real and
imaginary parts) or in front (stacked figures), where a negative one would
name another dimension. Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["axis", "check_out_dim", "unbatched_output"]


def axis(rank: int, d: int) -> int | None:
    """``d`` as a dimension from 0 of a tensor of ``rank`` dimensions; None where it has none."""
    if 0 <= d < rank:
        return d
    if -rank <= d < 0:
        return d + rank
    return None


def check_out_dim(out_dim: object) -> int:
    """``out_dim``, where it is an int (a bool is not)."""
    if isinstance(out_dim, bool) or not isinstance(out_dim, int):
        raise TypeError(
            f"assert_batch_invariant: out_dim must be an int (the batch dimension of every "
            f"output tensor), got {out_dim!r}"
        )
    return out_dim


def unbatched_output(path: str, shape: Sequence[int], out_dim: int, n: int) -> str:
    """The error for an output of the full batch with no dimension ``out_dim`` of ``n`` rows."""
    shape = list(shape)
    d = axis(len(shape), out_dim)
    others = [k for k, s in enumerate(shape) if s == n and k != d]
    head = (
        f"assert_batch_invariant: {path} has shape {shape}, which has no batch dimension "
        f"{out_dim} of size {n}"
    )
    if others and d is not None:
        return (
            f"{head}, but its dimension {others[0]} has {n}: out_dim is the batch dimension "
            "of every output, and this one is batched along another (an RNN's hidden state "
            "is batched along dimension 1 even with batch_first=True); return the outputs "
            "batched along out_dim, and check the others in a call of their own"
        )
    if others:
        return (
            f"{head}: out_dim {out_dim} is out of range for it; its dimension {others[0]} "
            f"has the batch's {n} rows"
        )
    return (
        f"{head}; return per-row results (a loss reduced over the batch cannot be compared "
        "row by row)"
    )
