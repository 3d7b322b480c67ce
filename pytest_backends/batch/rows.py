"""Rows of two tensors compared: bitwise per row, and the differences of the rows that differ.

Importing this module does not import torch; its functions do.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["differences", "row_differences", "rows_differ", "rows_within", "same_bits"]

_INTS: dict[int, torch.dtype] = {}  # element size -> the integer dtype of that size


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as integers of its element size (no copy), so NaNs and -0.0 compare by bits."""
    import torch

    if not _INTS:
        _INTS.update({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64})
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.view(_INTS[t.element_size()])


# dtype -> the integer dtype its bits are compared as (real dtypes only)
_VIEWS: dict[torch.dtype, torch.dtype] = {}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one shape and dtype are bitwise equal (one op: the fast path)."""
    import torch

    if not _VIEWS:
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64):
            _VIEWS[dt] = _bits(torch.empty(0, dtype=dt)).dtype
        _VIEWS.update({torch.int32: torch.int32, torch.bool: torch.uint8})
    view = _VIEWS.get(a.dtype)
    if view is not None and a.dim() > 0:
        return bool(torch.equal(a.view(view), b.view(view)))
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    return bool(torch.equal(_bits(a), _bits(b)))


def rows_differ(full_rows: torch.Tensor, sub: torch.Tensor, d: int) -> torch.Tensor:
    """A bool per row (along ``d``): whether the two tensors' rows differ bitwise."""
    import torch

    a, b = full_rows.detach(), sub.detach()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    ne = _bits(a) != _bits(b)
    if ne.dim() == 1:
        return ne
    if ne.numel() == 0:
        return torch.zeros(ne.shape[d], dtype=torch.bool, device=ne.device)
    return _per_row(ne, d).any(1)


def differences(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``(max abs, max rel)`` difference of ``a`` from the reference ``b``; NaN vs number is inf."""
    import torch

    if a.numel() == 0 or not (a.is_floating_point() or a.is_complex()):
        if torch.equal(a, b):
            return 0.0, 0.0
        diff = (a.double() - b.double()).abs()
        m = float(diff.max())
        return m, m
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.detach().to(wide), b.detach().to(wide)
    diff = (x - y).abs()
    if not bool(torch.isfinite(diff).all()):
        same_nan = torch.isnan(x) & torch.isnan(y)
        diff = torch.where(same_nan, torch.zeros_like(diff), diff)
        diff = torch.nan_to_num(diff, nan=math.inf)
    scale = y.abs()
    rel = torch.where(scale > 0, diff / scale, diff)
    return float(diff.max()), float(rel.max())


def _per_row(t: torch.Tensor, d: int) -> torch.Tensor:
    """``t`` (non-empty) as one row per index along ``d``: shape ``(rows, elements per row)``."""
    import torch

    if t.dim() == 1:
        return t.reshape(-1, 1)
    if d == 0:
        return t.reshape(t.shape[0], -1)
    return torch.movedim(t, d, 0).reshape(t.shape[d], -1)


def row_differences(a: torch.Tensor, b: torch.Tensor, d: int) -> tuple[list[float], list[float]]:
    """Per row along ``d``: :func:`differences` of that row of ``a`` from that row of ``b``.

    One pass over the tensors for every row at once; the max over a set of
    rows is the :func:`differences` of those rows.
    """
    import torch

    n = a.shape[d]
    if a.numel() == 0:
        return [0.0] * n, [0.0] * n
    if not (a.is_floating_point() or a.is_complex()):
        diff = (a.double() - b.double()).abs()
        m = _per_row(diff, d).amax(1).tolist()
        return m, list(m)
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.detach().to(wide), b.detach().to(wide)
    diff = (x - y).abs()
    scale = y.abs()
    for finite in (True, False):
        if not finite:  # a NaN or infinity somewhere (amax propagates NaN)
            same_nan = torch.isnan(x) & torch.isnan(y)
            diff = torch.where(same_nan, torch.zeros_like(diff), diff)
            diff = torch.nan_to_num(diff, nan=math.inf)
        rel = torch.where(scale > 0, diff / scale, diff)
        both = torch.stack([diff, rel])
        if d != 0:
            both = torch.movedim(both, d + 1, 1)
        abs_rows, rel_rows = both.reshape(2, n, -1).amax(2).tolist()
        if not finite or all(math.isfinite(v) for v in abs_rows):
            break
    return abs_rows, rel_rows


def rows_within(a: torch.Tensor, b: torch.Tensor, d: int, rtol: float, atol: float) -> list[bool]:
    """Per row along ``d``: whether ``|a - b| <= atol + rtol * |b|`` everywhere (NaN equals NaN).

    Integer and bool rows are within only when equal.
    """
    import torch

    n = a.shape[d]
    if a.numel() == 0:
        return [True] * n
    if not (a.is_floating_point() or a.is_complex()):
        return (~rows_differ(b, a, d)).tolist()
    close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if close.dim() == 0:
        close = close.reshape(1)
    return _per_row(close, d).all(1).tolist()
