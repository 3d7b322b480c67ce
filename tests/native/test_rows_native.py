"""The native row comparison gives the NumPy comparison's figures, bit for bit."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from perturbed import perturbed

from pytest_backends.batch import rows as rows_mod

SPECIAL = [0.0, -0.0, 1.0, -1.5, 1e-30, 3e38, math.inf, -math.inf, math.nan]


def _numpy(ref: torch.Tensor, got: torch.Tensor) -> object:
    """The pure NumPy path of ``compare_rows`` (the native one switched off)."""
    saved = list(rows_mod._NATIVE_ROWS)
    rows_mod._NATIVE_ROWS[:] = [None, True]
    try:
        return rows_mod.compare_rows(ref, got, 0)
    finally:
        rows_mod._NATIVE_ROWS[:] = saved


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (the figures of a row with inf / inf are NaN on both)."""
    if a is None or b is None:
        return a is b
    assert isinstance(a, tuple) and isinstance(b, tuple)
    if a[0] != b[0]:
        return False
    for xs, ys in zip(a[1:], b[1:]):
        for x, y in zip(xs, ys):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
    return True


@st.composite
def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    return perturbed(draw, rows=(1, 9), widths=(1, 5), specials=SPECIAL, marked=4, third="scale")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(pairs())
def test_native_figures_equal_numpys(
    native_module: ModuleType, pair: tuple[torch.Tensor, torch.Tensor]
) -> None:
    ref, got = pair
    native = native_module.compare_rows(ref, got)
    numpy_figures = _numpy(ref, got)
    assert _same(native, numpy_figures), (ref, got, native, numpy_figures)


def test_the_check_compares_through_the_loaded_extension(
    native_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rows_mod, "_NATIVE_ROWS", [])
    assert rows_mod._native_rows() is native_module.compare_rows
    calls: list[int] = []
    real = native_module.compare_rows
    monkeypatch.setattr(
        rows_mod, "_NATIVE_ROWS", [lambda a, b: calls.append(1) or real(a, b), True]
    )
    from pytest_backends import assert_batch_invariant

    # the general path (the one-call path off): identical sub-batches are compared by their
    # bytes alone; differing ones get figures
    monkeypatch.setattr(rows_mod, "_NATIVE_CASES", [None])
    assert_batch_invariant(torch.nn.LayerNorm(8).eval(), torch.randn(8, 8), backward=False)
    assert not calls
    with pytest.raises(AssertionError, match="batch"):
        assert_batch_invariant(lambda t: t * t.shape[0], torch.randn(8, 8), backward=False)
    assert calls, "assert_batch_invariant did not compare through the native function"


def test_a_decision_made_before_the_extension_was_loaded_is_made_again(
    native_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check before the harness loaded the extension does not keep NumPy for the process."""
    monkeypatch.setattr(rows_mod, "_NATIVE_ROWS", [None, False])  # decided: not built yet
    assert rows_mod._native_rows() is native_module.compare_rows


def test_equal_rows_are_none_and_one_differing_row_is_named(native_module: ModuleType) -> None:
    ref = torch.randn(6, 32)
    assert native_module.compare_rows(ref, ref.clone()) is None
    got = ref.clone()
    got[4, 7] = torch.nextafter(got[4, 7], torch.tensor(math.inf))
    differ, abs_rows, rel_rows = native_module.compare_rows(ref, got)
    assert differ == [False, False, False, False, True, False]
    assert abs_rows[4] > 0 and abs_rows[:4] == [0.0] * 4 and rel_rows[4] > 0


def test_refuses_what_the_numpy_path_never_hands_it(native_module: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="shape or dtype"):
        native_module.compare_rows(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="contiguous"):
        native_module.compare_rows(torch.zeros(3, 2).t(), torch.zeros(3, 2).t())
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        native_module.compare_rows(
            torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, 2, dtype=torch.int32)
        )


def test_a_check_never_builds_the_extension(tmp_path: Path) -> None:
    """With an empty build cache, the check compares in NumPy and compiles nothing."""
    code = (
        "import torch\n"
        "from pytest_backends import _native, assert_batch_invariant\n"
        "from pytest_backends.batch import rows\n"
        "_native._jit_build = lambda *a, **k: (_ for _ in ()).throw(AssertionError('built'))\n"
        "assert_batch_invariant(torch.nn.Linear(8, 8).eval(), torch.randn(8, 8),"
        " backward=False, tolerance='report')\n"
        "assert rows._native_rows() is None and not _native.loaded()\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTEST_BACKENDS_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
