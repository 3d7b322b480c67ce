"""Crashes are contained, report files are complete or absent, HTML is escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CRASHING_SUITE = """
import ctypes, os, pytest, torch

@pytest.mark.backends("mkldnn")
def test_conv(backend_config):
    x = torch.randn(2, 3, 8, 8)
    assert torch.nn.functional.conv2d(x, torch.randn(4, 3, 3, 3)).shape == (2, 4, 6, 6)

@pytest.mark.backends("mkldnn")
def test_matrix_exits(backend_config):
    os._exit(1)

@pytest.fixture
def exits_in_setup():
    os._exit(1)

@pytest.mark.backends(mkldnn=["off"])
@pytest.mark.parametrize("n", [7])
def test_matrix_setup_exits(n, exits_in_setup, backend_config):
    pass

def test_segfaults():
    ctypes.string_at(0)

@pytest.mark.parametrize("i", range(4))
def test_others(i):
    assert i >= 0
"""


@pytest.mark.slow
def test_worker_crashes_keep_other_results_and_the_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # this run uses no determinism harness, so it must never build (or create) its cache
    cache = pytester.path / "native-cache"
    monkeypatch.setenv("PYTEST_BACKENDS_CACHE_DIR", str(cache))
    pytester.makepyfile(test_crash=CRASHING_SUITE)
    report = pytester.path / "report.json"
    page = pytester.path / "report.html"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-n",
        "2",
        "--backends-matrix",
        f"--backends-report={report}",
        f"--backends-html={page}",
        "--junitxml=junit.xml",
    )
    out = result.stdout.str()
    assert "INTERNALERROR" not in out
    outcomes = result.parseoutcomes()
    # every crash is a failure: 2 + 1 matrix items and the unmarked segfault
    assert outcomes["failed"] == 4, out[-3000:]
    assert outcomes["passed"] == 6
    assert out.count("crashed while running") >= 4
    failed_matrix = {
        line.split()[1]
        for line in result.outlines
        if line.startswith("FAILED") and "mkldnn-" in line
    }
    assert len(failed_matrix) == 3, failed_matrix
    # the grid, the JSON and the HTML count the crashed items as failed, as pytest does
    data = json.loads(report.read_text())
    grid = data["grid_totals"]
    assert grid["failed"] == 3 and grid["passed"] == 2, grid
    # the report's totals are pytest's counts of the whole run
    assert data["totals"]["failed"] == 4 and data["totals"]["passed"] == 6, data["totals"]
    counts = {c["id"]: c["counts"] for c in data["configs"]}
    assert counts["mkldnn-on"]["failed"] == 1 and counts["mkldnn-on"]["passed"] == 1
    assert counts["mkldnn-off"]["failed"] == 2 and counts["mkldnn-off"]["passed"] == 1
    crashed = {t["nodeid"] for t in data["tests"] if t["crashed"]}
    assert crashed == failed_matrix
    assert all(
        t["outcome"] == "failed" and t["message"].startswith("crashed")
        for t in data["tests"]
        if t["crashed"]
    )
    grid = out[out.index("backends matrix") :]
    total = next(line for line in grid.splitlines() if line.startswith("total"))
    assert total.split()[1:3] == ["2", "3"], grid  # passed, failed
    html_text = page.read_text()
    # grid cells: failed, marked crashed, with the crash named in the cell
    assert html_text.count('<td class="failed crashed" title=') == 3
    assert html_text.count('<span class="crash">crashed') == 3
    # the failure list: the three matrix items and the unmarked test that crashed
    assert html_text.count('<td class="failed">failed</td>') == 4
    assert html_text.count("(crashed)") == 3
    assert (pytester.path / "junit.xml").exists()
    assert not cache.exists()


def test_keyboard_interrupt_leaves_report_complete_or_absent(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.backends("mkldnn")
        def test_a(backend_config):
            pass

        def test_interrupt():
            torch.backends.cudnn.benchmark = True
            raise KeyboardInterrupt

        def test_never():
            pass
        """
    )
    report = pytester.path / "report.json"
    html = pytester.path / "report.html"
    previous = '{"format": "pytest-backends-report", "version": 1, "previous": true}\n'
    report.write_text(previous)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "--backends-matrix",
        f"--backends-report={report}",
        f"--backends-html={html}",
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    text = report.read_text()
    # either the previous file or a complete new one, never a truncated mix
    assert text == previous or json.loads(text)
    if html.exists():
        assert html.read_text().rstrip().endswith("</html>")
    assert not list(pytester.path.glob(".report.json.*.tmp"))


def test_atomic_write_leaves_previous_file_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_backends import _files

    target = tmp_path / "report.json"
    target.write_text("old")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt  # an interrupt after half of the data was written

    monkeypatch.setattr(_files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _files.atomic_write_text(target, "new" * 100_000)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    monkeypatch.undo()
    _files.atomic_write_text(target, "new")
    assert target.read_text() == "new"


def test_html_report_escapes_ids_params_and_messages(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.backends("mkldnn")
        @pytest.mark.parametrize("x", ["<script>alert(1)</script>"],
                                 ids=["<script>alert(1)</script>"])
        def test_evil(backend_config, x):
            assert False, "<img src=x onerror=alert(2)>"
        """
    )
    html = pytester.path / "grid.html"
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-matrix", f"--backends-html={html}"
    )
    result.assert_outcomes(failed=2)
    page = html.read_text()
    assert "<script>alert(1)</script>" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page


@pytest.mark.slow
def test_crash_under_determinism_mode_keeps_results_and_census(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, pytest, torch

        @pytest.mark.backends(deterministic="on")
        def test_matmul():
            a = torch.randn(16, 16)
            assert (a @ a).shape == (16, 16)

        @pytest.mark.backends(deterministic="on")
        def test_crashes_on_second_run():
            torch.randn(3).sum()
            if os.environ.get("PYTEST_XDIST_WORKER") and os.path.exists("ran_once"):
                os._exit(3)
            open("ran_once", "w").close()

        @pytest.mark.parametrize("i", range(4))
        def test_plain(i):
            assert i >= 0
        """
    )
    census = pytester.path / "census.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-n",
        "2",
        "--backends-determinism=3",
        f"--backends-census={census}",
    )
    out = result.stdout.str()
    assert "INTERNALERROR" not in out
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1, out[-3000:]
    assert outcomes["passed"] == 5
    assert "crashed" in out
    data = json.loads(census.read_text())
    assert "aten::mm" in json.dumps(data)


def test_crash_reports_are_recognised_and_their_config_found_in_the_id() -> None:
    from pytest_backends.matrix import report as matrix_report
    from pytest_backends.matrix.axes import builtin_registry

    parse = builtin_registry().parse_id
    find = matrix_report.config_in_nodeid
    assert find("t.py::test_x[mkldnn-off]", parse) == "mkldnn-off"
    assert find("t.py::test_x[3-mkldnn-on]", parse) == "mkldnn-on"
    assert find("t.py::T::test_x[mkldnn-off,sdpa-math-7]", parse) == "mkldnn-off,sdpa-math"
    assert find("t.py::test_x[default]", parse) is None
    assert find("t.py::test_x[on-off]", parse) is None
    assert find("t.py::test_x", parse) is None
    crash = pytest.TestReport(
        "t.py::test_x[mkldnn-on]",
        ("t.py", None, "t.py"),
        {},
        "failed",
        "worker 'gw0' crashed while running it",
        "???",
    )
    setup = pytest.TestReport(
        "t.py::test_x[mkldnn-on]",
        ("t.py", None, "t.py"),
        {},
        "passed",
        None,
        "setup",
        user_properties=[("backend_config", "mkldnn-on")],
    )
    assert matrix_report.is_crash(crash) and not matrix_report.is_crash(setup)
    result = matrix_report.Result("t.py::test_x[mkldnn-on]", "t.py::test_x", "mkldnn-on")
    matrix_report.update(result, setup)
    assert result.outcome == "passed"
    matrix_report.update(result, crash)
    assert (result.outcome, result.crashed) == ("failed", True)
    assert result.message.startswith("crashed: worker 'gw0' crashed")
