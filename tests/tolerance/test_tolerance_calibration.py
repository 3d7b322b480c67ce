"""A small run of benchmarks/calibrate_tolerance.py (the full one runs in make bench)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate_tolerance.py"


@pytest.fixture(scope="module")
def calibration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate_tolerance", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("calibrate_tolerance", module)
    spec.loader.exec_module(module)
    return module


def test_small_calibration_has_no_violation_and_is_tight(calibration: ModuleType) -> None:
    rows = calibration.run_calibration(
        trials=20,
        mode_names=["fp32 ieee", "fp32 oneDNN bf16", "bf16"],
        case_names=["mm 64x256", "mm const 64x64", "conv 1x64"],
    )
    assert len(rows) == 9
    assert all(row.trials == 20 for row in rows)
    assert calibration.failures(rows) == []
    text = "\n".join(calibration.report(rows, 0.0, 20))
    assert "result: PASS" in text
    ieee = [row for row in rows if row.mode == "fp32 ieee"]
    assert all(0 < row.max_abs < row.atol + row.rtol * 1e3 for row in ieee)
    assert all(0.1 < row.worst_use <= 1 for row in rows if row.ran)
    # the hardware that decides the oneDNN paths is recorded with the figures
    assert re.search(
        r"^cpu: .+; AMX: (yes|no) \(amx_fp16: (yes|no)\), AVX512-BF16: (yes|no), "
        r"AVX512-FP16: (yes|no)$",
        text,
        re.M,
    )
    # the oneDNN bf16 bounds followed the kernel each case ran (log) or the probe; a
    # matmul names its oneDNN kernel wherever its bound came from the log (a CPU without
    # oneDNN's bf16 matmul path runs it in BLAS: no primitive, and the probe decides)
    flagged = [row for row in rows if row.mode == "fp32 oneDNN bf16"]
    assert all(row.bound.split()[-1] in ("log", "probe") for row in flagged)
    assert all(row.kernel for row in flagged if row.op == "matmul" and row.bound.endswith("log"))


def test_reduced_path_detection_agrees_with_bitwise_difference(calibration: ModuleType) -> None:
    rows = calibration.run_calibration(
        trials=5, mode_names=["fp32 oneDNN bf16"], case_names=["mm 64x256"]
    )
    (row,) = rows
    # the reduced path can only have run where the output changed
    assert row.reduced <= row.effect <= row.trials
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen)
    with torch.no_grad():
        assert torch.equal(calibration.round_mantissa(7)(x), x.bfloat16().float())


def test_checks_flag_violations_and_loose_bounds(calibration: ModuleType) -> None:
    row = calibration.Row
    ok = row("m", "c", "matmul", 8, trials=10, worst_use=0.5)
    violated = row("m", "c", "matmul", 8, trials=10, worst_use=1.5, violations=2)
    loose = row("m", "c", "matmul", 8, trials=10, worst_use=0.01)
    # the bound assumed the reduced path and no trial took it: not held to 10x
    idle = row(
        "m",
        "c",
        "matmul",
        8,
        trials=10,
        worst_use=0.0001,
        baseline=True,
        emulated=True,
        bound_reduced=True,
    )
    # the bound followed the kernel to fp32: held to 10x like any other
    followed = row("m", "c", "matmul", 8, trials=10, worst_use=0.01, baseline=True, emulated=True)
    worst_case = row("m", "c", "matmul", 8, trials=10, worst_use=0.01, tight=False)
    assert calibration.failures([ok, idle, worst_case]) == []
    assert "2 violations" in calibration.failures([violated])[0]
    assert "100.0x" in calibration.failures([loose])[0]
    assert "100.0x" in calibration.failures([followed])[0]
    report = "\n".join(calibration.report([idle], 0.0, 10))
    assert "no case took it" in report
