"""The joined row comparison of all sub-batches against a plain per-sub-batch comparison."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_backends.batch.compare import CaseResult, compare_all
from pytest_backends.batch.rows import differences
from pytest_backends.batch.runs import Case, Run

N = 8
CASES = [
    Case("row 0 alone", (0,)),
    Case("row 3 alone", (3,)),
    Case("row 7 alone", (7,)),
    Case("rows 0..1", (0, 1)),
    Case("rows 3..4", (3, 4)),
    Case("rows 2..5", (2, 3, 4, 5)),
    Case("the batch permuted", (5, 2, 7, 0, 1, 6, 3, 4)),
]


def _full(dtype: torch.dtype, d: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    shape = [3, 5]
    shape.insert(d, N)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(-9, 9, shape, generator=gen, dtype=dtype)
    t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    if dtype.is_floating_point:
        t.select(d, 2)[0, 0] = math.nan
        t.select(d, 6)[0, 1] = 0.0
    return t


def _perturbed(rows: torch.Tensor, case: Case, d: int, k: int) -> torch.Tensor:
    """``rows`` with some rows changed: a last-bit change, a NaN, -0.0, a flipped value."""
    out = rows.clone()
    for j, r in enumerate(case.rows):
        row = out.select(d, j)[0]  # a view: writes land in out
        if (r + k) % 3:
            continue
        if out.dtype == torch.bool:
            row[0] = ~row[0]
        elif not (out.dtype.is_floating_point or out.dtype.is_complex):
            row[1] += 1
        elif r == 6:
            row[1] = -0.0  # equal value, other bits
        elif r == 2 and out.dtype.is_floating_point:
            row[3] = math.nan  # a NaN where the full batch has a number
        else:
            row[2] = row[2] * (1 + 2**-6)
    return out


def _plain(full: torch.Tensor, sub: torch.Tensor, case: Case, d: int, tol: object) -> CaseResult:
    ref = full.index_select(d, torch.tensor(case.rows))
    a, b = ref, sub
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    a = a.to(torch.uint8) if a.dtype == torch.bool else a.view(ints[a.element_size()])
    b = b.to(torch.uint8) if b.dtype == torch.bool else b.view(ints[b.element_size()])
    bad = [r for j, r in enumerate(case.rows) if not torch.equal(a.select(d, j), b.select(d, j))]
    within = None
    if isinstance(tol, tuple):
        if sub.is_floating_point() or sub.is_complex():
            within = bool(torch.isclose(sub, ref, tol[0], tol[1], equal_nan=True).all())
        else:
            within = bool(torch.equal(sub, ref))
    max_abs, max_rel = differences(sub, ref) if bad else (0.0, 0.0)
    if not bad and isinstance(tol, tuple):
        within = True
    return CaseResult(
        case.label,
        case.size,
        case.rows,
        "output",
        bad[0] if bad else None,
        len(bad),
        max_abs,
        max_rel,
        within,
    )


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.float64, torch.complex64, torch.int64, torch.bool],
)
@pytest.mark.parametrize("d", [0, 1])
@pytest.mark.parametrize("tol", [None, (1e-3, 1e-5), "report"])
def test_joined_comparison_equals_the_plain_one(dtype: torch.dtype, d: int, tol: object) -> None:
    full = _full(dtype, d)
    for k in range(3):
        subs = [
            _perturbed(full.index_select(d, torch.tensor(c.rows)), c, d, k)
            if k
            else full.index_select(d, torch.tensor(c.rows))
            for c in CASES
        ]
        if d == 1:  # sub-batches in another layout than the joined tensor
            subs = [s.transpose(0, 2).contiguous().transpose(0, 2) for s in subs]
        runs = [(Run([("output", s, d)]), c) for s, c in zip(subs, CASES)]
        got = compare_all(Run([("output", full, d)]), runs, tol)  # type: ignore[arg-type]
        want = [_plain(full, s, c, d, tol) for s, c in zip(subs, CASES)]
        assert got == want
        assert any(not r.identical for r in got) == bool(k)


def test_a_part_missing_from_one_sub_batch_keeps_the_order() -> None:
    full = torch.arange(16.0).reshape(N, 2)
    other = full * 2
    runs = [
        (Run([("a", full[:1], 0), ("b", other[:1], 0)]), CASES[0]),
        (Run([("b", other[3:4] + 1, 0)]), CASES[1]),
        (Run([("a", full[7:] + 1, 0), ("b", other[7:], 0)]), CASES[2]),
    ]
    got = compare_all(Run([("a", full, 0), ("b", other, 0)]), runs, None)
    assert [(r.case, r.part, r.first_row) for r in got] == [
        ("row 0 alone", "a", None),
        ("row 0 alone", "b", None),
        ("row 3 alone", "b", 3),
        ("row 7 alone", "a", 7),
        ("row 7 alone", "b", None),
    ]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.bool]
)
def test_dense_cpu_paths_equal_the_general_one(dtype: torch.dtype) -> None:
    """Bytes (memcmp) and NumPy give the verdicts and figures of torch's element-wise ops.

    The same rows laid out with a gap (not contiguous) take the general path.
    """
    from pytest_backends.batch.rows import (
        compare_rows,
        row_differences,
        rows_differ,
        rows_differ_list,
        same_bits,
    )

    gen = torch.Generator().manual_seed(3)
    specials = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, 3e38, 1.0]
    cases = 0
    for k in range(40):
        a = torch.randn(6, 5, generator=gen, dtype=torch.float64)
        b = a.clone()
        flat_a, flat_b = a.view(-1), b.view(-1)
        for j in range(k % 4):
            at = (7 * k + 11 * j) % a.numel()
            flat_a[at] = specials[(k + j) % len(specials)]
            flat_b[(at + j) % a.numel()] = specials[(2 * k + j) % len(specials)]
        if k % 3 == 0:
            flat_b[k % a.numel()] *= 1 + 1e-6
        if dtype == torch.bool:
            x, y = a > 0, b > 0
        else:
            x, y = a.to(dtype), b.to(dtype)
        # The same values with a gap after every row: the general path.
        gx = torch.empty(6, 7, dtype=dtype)[:, :5]
        gy = torch.empty(6, 7, dtype=dtype)[:, :5]
        gx.copy_(x)
        gy.copy_(y)
        assert not gx.is_contiguous()
        assert same_bits(x, y) == same_bits(gx, gy)
        assert rows_differ_list(x, y, 0) == rows_differ(gx, gy, 0).tolist()
        if dtype.is_floating_point:
            assert repr(row_differences(y, x, 0)) == repr(row_differences(gy, gx, 0))
        # The one-pass comparison (NumPy for dense rows) against the general one, figures too.
        assert repr(compare_rows(x, y, 0)) == repr(compare_rows(gx, gy, 0))
        cases += 1
    assert cases == 40
