"""--backends-verify with oneDNN's primitive log, end to end: the repros of the kernel-path issue.

One subprocess run covers: a bf16 ``a @ b`` under ``mkldnn-on`` (exercised),
the same matmul with oneDNN re-enabled inside ``mkldnn-off`` (broken), an
unrelated 1x1 conv beside a conv that takes the slow path (coverage in the
detail), ``mkldnn_precision-bf16`` on whatever CPU runs it (the verdict
agrees with the measured error), a tolerance probe that must not count as
the test's kernel, and output written to fd 1 that still reaches pytest.
The assertions hold on CPUs with and without AMX.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

# Imported before any pytester snapshot (see test_matrix_e2e.py).
import torch

Run = Callable[..., pytest.RunResult]

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch was built without oneDNN"
)

REPROS = """
    import json
    import os

    import pytest
    import torch
    import torch.nn.functional as F

    from pytest_backends import assert_close, reference, tolerance_for

    def bf16_mm():
        a = torch.randn(256, 256, dtype=torch.bfloat16)
        return a @ a

    @pytest.mark.backends(mkldnn="on")
    def test_bf16_mm():
        bf16_mm()

    @pytest.mark.backends(mkldnn="off")
    def test_reenabled():
        with torch.backends.mkldnn.flags(enabled=True):
            bf16_mm()

    @pytest.mark.backends(mkldnn="off")
    def test_honest():
        bf16_mm()

    @pytest.mark.backends(mkldnn="on")
    def test_unrelated_conv():
        F.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3))  # the conv under test
        F.conv2d(torch.randn(8, 16, 32, 32), torch.randn(16, 16, 1, 1))  # an unrelated 1x1

    @pytest.mark.backends(mkldnn_precision="bf16")
    def test_fp32_mm_bf16_flag(backend_tolerance):
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(256, 1024, generator=gen)
        b = torch.randn(1024, 256, generator=gen)
        out = a @ b
        expected = reference(torch.matmul, a, b)
        tol = tolerance_for(torch.float32, op="matmul", k=1024)
        assert backend_tolerance(torch.float32, op="matmul", k=1024) == tol
        rel = float((out.double() - expected).norm() / expected.norm())
        with open("measured.json", "w") as f:
            json.dump({"rel": rel, "source": tol.precision_source, "path": tol.path}, f)
        assert_close(out, expected, op="matmul", k=1024)

    @pytest.mark.backends(mkldnn="on", mkldnn_precision="bf16")
    def test_probe_is_not_the_tests_kernel():
        # the tolerance model probes a matmul here (nothing of the family ran yet)
        tolerance_for(torch.float32, op="matmul", k=256)
        F.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3))

    @pytest.mark.backends(mkldnn="on")
    def test_prints():
        os.write(1, b"from fd 1 before\\n")
        bf16_mm()
        print("from print after")
"""


def _needs_bf16() -> None:
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bf16 kernels on this CPU")


def test_primitive_log_verdicts(pytester: pytest.Pytester, run: Run) -> None:
    _needs_bf16()
    pytester.makepyfile(test_repros=REPROS)
    result = run(
        "--backends-matrix", "--backends-verify=strict", "--backends-report=r.json", "-rfP"
    )
    data = json.loads((pytester.path / "r.json").read_text())
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}

    def verdict(name: str) -> tuple[str, str, str]:
        test = tests[name]
        return test["outcome"], test["verify"], test["verify_detail"]

    # the bf16 matmul: oneDNN computed it, although no op name says so
    outcome, status, detail = verdict("test_bf16_mm[mkldnn-on]")
    assert (outcome, status) == ("passed", "ok")
    assert detail.startswith("mkldnn-on exercised: brg_matmul:") or "(matmul, bf16)" in detail
    assert "for aten::mm" in detail and "exercised by 1 of 1 matmuls" in detail

    # oneDNN re-enabled inside mkldnn-off: broken (no aten::mkldnn_* op name ran)
    outcome, status, detail = verdict("test_reenabled[mkldnn-off]")
    assert (outcome, status) == ("failed", "broken")
    assert detail.startswith("mkldnn-off promised no oneDNN kernels, but oneDNN ran ")
    assert "(matmul, bf16) for aten::mm" in detail
    assert verdict("test_honest[mkldnn-off]")[:2] == ("passed", "ok")

    # the unrelated 1x1 conv does not hide the conv that took the slow path
    outcome, status, detail = verdict("test_unrelated_conv[mkldnn-on]")
    assert (outcome, status) == ("passed", "ok")
    assert (
        "mkldnn-on exercised by 1 of 2 convolutions; aten::_slow_conv2d_forward ran for "
        "input (1, 3, 8, 8)" in detail
    )

    # bf16 precision: the verdict follows the kernel, and agrees with the error measured
    measured = json.loads((pytester.path / "measured.json").read_text())
    assert measured["source"] == "primitive log"
    outcome, status, detail = verdict("test_fp32_mm_bf16_flag[mkldnn_precision-bf16]")
    if status == "ok":  # e.g. AMX: the primitive computed in bf16
        assert outcome == "passed"
        assert "computed in bf16" in detail
        assert measured["rel"] > 1e-4  # a bf16-sized error
    else:  # e.g. AVX512-BF16 without AMX: an f32 kernel under attr-fpmath:bf16
        assert (outcome, status) == ("failed", "not exercised")  # strict
        assert detail.startswith("mkldnn_precision-bf16 not exercised: matmul brg_matmul:")
        assert "computed in f32, not bf16: the flag allowed bf16" in detail
        assert measured["rel"] < 1e-5  # an fp32-sized error
        assert any("computed in f32" in line for line in measured["path"])

    # the tolerance probe's matmul is not the test's kernel
    outcome, status, detail = verdict(
        "test_probe_is_not_the_tests_kernel[mkldnn-on,mkldnn_precision-bf16]"
    )
    assert (outcome, status) == ("failed", "not exercised")
    assert (
        "mkldnn-on not exercised: no oneDNN primitive computed an op of the test; "
        "aten::_slow_conv2d_forward ran for input (1, 3, 8, 8)" in detail
    )
    assert "matmul" not in detail.split("mkldnn_precision-bf16")[0]

    # what the test wrote to fd 1 still reaches pytest's capture (when the call
    # ends, so after what Python printed), without the log's own lines
    assert verdict("test_prints[mkldnn-on]")[:2] == ("passed", "ok")
    result.stdout.fnmatch_lines(
        [
            "*_ test_prints[[]mkldnn-on] _*",
            "*Captured stdout call*",
            "from print after",
            "from fd 1 before",
        ]
    )
    assert "onednn_verbose" not in result.stdout.str()
