"""Copies of tensors laid out as others: sizes, strides, storage offset (so alignment too).

A sub-batch is compared as it would be computed alone in the input's own
layout, so the check's private copies keep that layout. Importing this
module does not import torch; its functions do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["check_layout", "copy_into", "same_layout"]


def _blank_like(x: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``x``'s sizes, strides and storage offset (so its alignment too).

    Its storage is zeroed, not left uninitialised: the bytes before the offset and
    between strided elements are never written, and a check inside a test that
    ``--backends-determinism`` runs again must hand every run the same bytes.
    """
    import torch

    if x.numel() == 0:
        return torch.empty_like(x)
    extent = 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))
    buf = torch.zeros(x.storage_offset() + extent, dtype=x.dtype, device=x.device)
    return buf.as_strided(x.shape, x.stride(), x.storage_offset())


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` where ``dst`` may repeat elements along stride-0 dimensions."""
    for k in range(dst.dim()):
        if dst.stride(k) == 0 and dst.shape[k] > 1:
            dst, src = dst.narrow(k, 0, 1), src.narrow(k, 0, 1)
    dst.copy_(src)


def same_layout(x: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of ``x`` laid out as ``like`` (default ``x``): sizes, strides, storage offset."""
    if like is None and x.storage_offset() == 0:
        copy = x.detach().clone()  # keeps the strides of a dense tensor
        if copy.stride() == x.stride():
            return copy
    dst = _blank_like(like if like is not None else x)
    copy_into(dst, x.detach())
    return dst


def check_layout(x: object, what: str) -> None:
    """Raise ``TypeError`` where ``x`` is a nested or non-strided (sparse) tensor."""
    import torch

    if not isinstance(x, torch.Tensor):
        return
    if x.is_nested:
        raise TypeError(f"assert_batch_invariant: not supported: nested {what}")
    if x.layout != torch.strided:
        kind = "sparse" if x.is_sparse or "sparse" in str(x.layout) else str(x.layout)
        raise TypeError(f"assert_batch_invariant: not supported: {kind} {what}")
