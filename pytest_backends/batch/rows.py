"""Rows of two tensors compared: bitwise per row, and the differences of the rows that differ.

Importing this module does not import torch; its functions do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "compare_rows",
    "differences",
    "differing_parts",
    "native_compare_cases",
    "row_differences",
    "row_index",
    "rows_differ",
    "rows_differ_list",
    "rows_within",
    "same_bits",
    "span",
]


def span(rows: Sequence[int]) -> int | None:
    """The first row when ``rows`` are consecutive and ascending, else None."""
    first = rows[0]
    if rows[-1] - first == len(rows) - 1 and tuple(rows) == tuple(range(first, first + len(rows))):
        return first
    return None


def row_index(rows: Sequence[int], device: object) -> torch.Tensor:
    """``rows`` as a long tensor on ``device``.

    Made anew on every call, never cached for the process: a check inside a
    test that ``--backends-determinism`` runs again must make the same ops
    (here ``torch.tensor``'s) in every run, the first included.
    """
    import torch

    return torch.tensor(tuple(rows), dtype=torch.long, device=device)  # type: ignore[arg-type]


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


def _find_memcmp() -> Any:
    """The C library's ``memcmp`` through ctypes, or None where it cannot be loaded.

    Called as a Python API function (``PyDLL``): it keeps the GIL, where a
    ``CDLL`` call releases and takes it back, which costs as much again as
    the call itself on the few rows of a check's sub-batch.
    """
    try:
        import ctypes

        memcmp = ctypes.PyDLL(None).memcmp
        memcmp.restype = ctypes.c_int
        memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError, TypeError):  # no C library in the process (Windows)
        return None
    return memcmp


_MEMCMP: list[Any] = []  # [memcmp or None], found on first use


def _memcmp() -> Any:
    """The C library's ``memcmp`` (found once), or None."""
    if not _MEMCMP:
        _MEMCMP.append(_find_memcmp())
    return _MEMCMP[0]


# [compare_rows or None, whether the extension had been loaded when that was decided]
_NATIVE_ROWS: list[Any] = []


def _native_rows() -> Any:
    """The native extension's ``compare_rows`` where it is built already, or None.

    Never builds: a check must not compile the extension in the middle of a
    test. It is used where ``--backends-determinism`` or ``pytest-backends
    build-native`` built it, and loaded on first use from the build cache.
    Decided once, and once more if the extension is loaded later in the
    process (by the determinism harness, say).
    """
    if not _NATIVE_ROWS:
        _NATIVE_ROWS[:] = _find_native_rows()
    elif _NATIVE_ROWS[0] is None and not _NATIVE_ROWS[1]:
        from pytest_backends import _native

        if _native.loaded():
            _NATIVE_ROWS[:] = _find_native_rows()
    return _NATIVE_ROWS[0]


def _find_native_rows() -> tuple[Any, bool]:
    from pytest_backends import _native

    was_loaded = _native.loaded()
    try:
        if not was_loaded and (_native.needs_build() or not _native.built()):
            return None, False
        module = _native.load()
    except Exception:  # a broken extension leaves the NumPy comparison, as if never built
        return None, True
    _NATIVE_CASES[:] = [getattr(module, "compare_cases", None)]
    return getattr(module, "compare_rows", None), True


# [compare_cases or None]: set with ``_NATIVE_ROWS`` from the same extension
_NATIVE_CASES: list[Any] = []


def native_compare_cases() -> Any:
    """The native extension's ``compare_cases`` where its ``compare_rows`` is in use, or None.

    Every sub-batch of a check compared in one call (``native/rows.cpp``);
    like :func:`compare_rows`'s native path, never built here.
    """
    if _native_rows() is None or not _NATIVE_CASES:
        return None
    return _NATIVE_CASES[0]


def _dense_cpu(t: torch.Tensor, tensor_type: type) -> bool:
    """Whether ``t``'s elements are its ``nbytes`` bytes at ``data_ptr()`` in CPU memory."""
    return (
        type(t) is tensor_type
        and t.is_cpu
        and t.is_contiguous()
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and not t._is_zerotensor()
    )


def differing_parts(
    ref: torch.Tensor, parts: Sequence[tuple[Sequence[int], int | None, torch.Tensor]]
) -> list[int] | None:
    """The indices of the ``parts`` whose rows differ bitwise from those rows of ``ref``.

    A part is ``(rows, first, tensor)``: the rows of ``ref`` (along dimension
    0) that ``tensor`` holds, in order, and :func:`span` of them. Compared by
    their bytes in place (``memcmp``: no tensor made, no torch op) where
    ``ref`` and every part's tensor are dense in CPU memory with ``ref``'s
    dtype and row shape; None where one is not (or ``memcmp`` is missing):
    the caller compares them otherwise.
    """
    import torch

    memcmp = _memcmp()
    tensor_type = torch.Tensor
    if memcmp is None or ref.dim() == 0 or ref.numel() == 0 or not _dense_cpu(ref, tensor_type):
        return None
    # ``_dense_cpu`` of each part, less what its dtype (``ref``'s) settles: not quantized.
    tail = tuple(ref.shape[1:])
    dtype = ref.dtype
    row_bytes = ref.nbytes // ref.shape[0]
    base = ref.data_ptr()
    differing = []
    i = -1
    for rows, first, t in parts:
        i += 1
        k = len(rows)
        if (
            type(t) is not tensor_type
            or t.dtype != dtype
            or t.shape != (k, *tail)
            or not t.is_cpu
            or not t.is_contiguous()
            or t.is_conj()
            or t.is_neg()
            or t._is_zerotensor()
        ):
            return None
        if first is not None:
            if memcmp(base + first * row_bytes, t.data_ptr(), k * row_bytes):
                differing.append(i)
            continue
        at = t.data_ptr()
        for j, r in enumerate(rows):
            if memcmp(base + r * row_bytes, at + j * row_bytes, row_bytes):
                differing.append(i)
                break
    return differing


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one shape and dtype are bitwise equal (one op: the fast path).

    Dense CPU tensors are compared by their bytes (``memcmp``): several times
    faster than ``torch.equal``, which compares element by element.
    """
    import torch

    memcmp = _memcmp()
    if (
        memcmp is not None
        and a.dtype == b.dtype
        and a.shape == b.shape
        and _dense_cpu(a, torch.Tensor)
        and _dense_cpu(b, torch.Tensor)
    ):
        size = a.nbytes
        return size == 0 or memcmp(a.data_ptr(), b.data_ptr(), size) == 0
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


def _numpy_rows(a: torch.Tensor, b: torch.Tensor, d: int) -> Any:
    """NumPy, where the rows of ``a`` and ``b`` along ``d`` can be read as NumPy arrays.

    That is: NumPy already imported, both tensors dense in CPU memory, rows
    along dimension 0. On tensors of a few rows, NumPy's element-wise ops
    cost a fraction of torch's dispatch; their IEEE results are the same.
    """
    import sys

    import torch

    np = sys.modules.get("numpy")
    if (
        np is None
        or d != 0
        or a.dim() == 0
        or a.numel() == 0
        or a.dtype != b.dtype
        or a.shape != b.shape
        or not _dense_cpu(a, torch.Tensor)
        or not _dense_cpu(b, torch.Tensor)
    ):
        return None
    return np


def rows_differ_list(full_rows: torch.Tensor, sub: torch.Tensor, d: int) -> list[bool]:
    """:func:`rows_differ` as a list."""
    np = _numpy_rows(full_rows, sub, d)
    if np is None or full_rows.is_complex():
        return rows_differ(full_rows, sub, d).tolist()
    a, b = _bits(full_rows.detach()).numpy(), _bits(sub.detach()).numpy()
    n = a.shape[0]
    return (a.reshape(n, -1) != b.reshape(n, -1)).any(axis=1).tolist()  # type: ignore[no-any-return]


def _numpy_row_differences(
    np: Any, a: torch.Tensor, b: torch.Tensor
) -> tuple[list[float], list[float]]:
    """:func:`row_differences` along dimension 0 in NumPy, op for op."""
    n = a.shape[0]
    return _numpy_figures(np, a.detach().numpy().reshape(n, -1), b.detach().numpy().reshape(n, -1))


def _numpy_figures(np: Any, a: Any, b: Any) -> tuple[list[float], list[float]]:
    """Per row of two 2-D arrays: the max abs and rel difference of ``a`` from ``b``.

    Finite rows take two widened copies, written in place from then on (a
    check's figures run between the model's calls, where every extra NumPy
    call and temporary costs several times what it costs alone); rows with a
    NaN or an infinity take :func:`_numpy_figures_nonfinite`.
    """
    with np.errstate(all="ignore"):
        x = a.astype(np.float64)
        y = b.astype(np.float64)
        np.subtract(x, y, out=x)
        np.abs(x, out=x)
        abs_rows = x.max(axis=1).tolist()
        if not all(math.isfinite(v) for v in abs_rows):
            return _numpy_figures_nonfinite(np, a, b)
        np.abs(y, out=y)
        np.divide(x, y, out=x, where=y > 0)  # where |b| is 0 the rel figure is the abs one
        return abs_rows, x.max(axis=1).tolist()


def _numpy_figures_nonfinite(np: Any, a: Any, b: Any) -> tuple[list[float], list[float]]:
    """:func:`_numpy_figures` where a row holds a NaN or an infinity (NaN vs number is inf)."""
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    with np.errstate(all="ignore"):
        diff = np.abs(x - y)
        same_nan = np.isnan(x) & np.isnan(y)
        diff = np.where(same_nan, np.zeros_like(diff), diff)
        diff = np.nan_to_num(diff, nan=math.inf, posinf=math.inf)
        scale = np.abs(y)
        rel = np.where(scale > 0, diff / scale, diff)
        return diff.max(axis=1).tolist(), rel.max(axis=1).tolist()


_NUMPY_FLOATS: set[Any] = set()  # the floating dtypes NumPy reads (float16, 32 and 64)


def compare_rows(
    full_rows: torch.Tensor, sub: torch.Tensor, d: int
) -> tuple[list[bool], list[float], list[float]] | None:
    """Rows of ``sub`` against ``full_rows`` (one shape and dtype) along ``d``, in one pass.

    None when every row is bitwise identical; otherwise, per row, whether it
    differs and its :func:`row_differences` figures (0.0 for an identical
    row; only the differing rows are measured). Dense CPU rows along
    dimension 0 of a dtype NumPy reads are compared in one call of the native
    extension where it is built (``compare_rows`` in ``native/rows.cpp``), else
    in NumPy, with one density check and one ``memcmp`` first: on a few rows,
    a NumPy op costs a fraction of a torch op's dispatch, with the same IEEE
    results, and the native call the same results again.
    """
    import torch

    if not _NUMPY_FLOATS:
        _NUMPY_FLOATS.update({torch.float16, torch.float32, torch.float64})
    np = _numpy_rows(full_rows, sub, d) if full_rows.dtype in _NUMPY_FLOATS else None
    native = _native_rows() if np is not None else None
    if native is not None:
        return native(full_rows, sub)  # type: ignore[no-any-return]
    memcmp = _memcmp()
    if np is None or memcmp is None:
        return _compare_rows(full_rows, sub, d)
    size = full_rows.nbytes
    if size == 0 or memcmp(full_rows.data_ptr(), sub.data_ptr(), size) == 0:
        return None
    n = full_rows.shape[0]
    ref = full_rows.detach().numpy().reshape(n, -1)
    got = sub.detach().numpy().reshape(n, -1)
    bits = _NUMPY_BITS[ref.itemsize]
    differ = (ref.view(bits) != got.view(bits)).any(axis=1)
    bad = differ.nonzero()[0]
    abs_rows, rel_rows = [0.0] * n, [0.0] * n
    figures = _numpy_figures(np, got[bad], ref[bad])
    for j, k in enumerate(bad.tolist()):
        abs_rows[k], rel_rows[k] = figures[0][j], figures[1][j]
    return differ.tolist(), abs_rows, rel_rows


_NUMPY_BITS = {2: "i2", 4: "i4", 8: "i8"}  # element size -> the integers its bits are read as


def _compare_rows(
    full_rows: torch.Tensor, sub: torch.Tensor, d: int
) -> tuple[list[bool], list[float], list[float]] | None:
    """:func:`compare_rows` through torch's ops (and NumPy's where they read the rows)."""
    if same_bits(full_rows, sub):
        return None
    differ = rows_differ_list(full_rows, sub, d)
    bad_at = [k for k, x in enumerate(differ) if x]
    a, b = sub, full_rows
    if len(bad_at) < len(differ):
        index = row_index(bad_at, full_rows.device)
        a, b = a.index_select(d, index), b.index_select(d, index)
    figures = row_differences(a, b, d)
    abs_rows, rel_rows = [0.0] * len(differ), [0.0] * len(differ)
    for j, k in enumerate(bad_at):
        abs_rows[k], rel_rows[k] = figures[0][j], figures[1][j]
    return differ, abs_rows, rel_rows


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
        diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)
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
    if a.dtype in (torch.float32, torch.float64, torch.float16):
        np = _numpy_rows(a, b, d)
        if np is not None:
            return _numpy_row_differences(np, a, b)
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.detach().to(wide), b.detach().to(wide)
    diff = (x - y).abs()
    scale = y.abs()
    for finite in (True, False):
        if not finite:  # a NaN or infinity somewhere (amax propagates NaN)
            same_nan = torch.isnan(x) & torch.isnan(y)
            diff = torch.where(same_nan, torch.zeros_like(diff), diff)
            diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)
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
