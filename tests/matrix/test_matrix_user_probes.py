"""Probes of the matrix as users run it: real sessions, then their reports merged."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_backends.__main__ import main

SUITE = """
import pytest

@pytest.mark.backends("mkldnn")
def test_conv(backend_config):
    assert backend_config.axes["mkldnn"] == "on"

def test_plain():
    pass
"""


def test_the_same_run_given_twice_is_merged_once_with_a_warning(
    pytester: pytest.Pytester,
    run: Callable[..., pytest.RunResult],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = run("--backends-matrix", "--backends-label=cpu", "--backends-report=job.json")
    result.assert_outcomes(passed=2, failed=1)
    job = pytester.path / "job.json"
    # The same artifact downloaded twice (two folders, or a copy beside the original).
    (pytester.path / "again").mkdir()
    shutil.copy(job, pytester.path / "again" / "job.json")
    out = pytester.path / "merged.json"
    capsys.readouterr()

    assert main(["merge", "--report", str(out), str(job), str(pytester.path / "again")]) == 0

    err = capsys.readouterr().err
    assert "holds the same run as" in err and "merged once" in err
    merged = json.loads(out.read_text())
    assert [s["label"] for s in merged["sources"]] == ["cpu"]
    # pytest's counts of the one run, not twice them.
    assert merged["session"]["outcomes"] == {"passed": 2, "failed": 1}
    assert merged["totals"] == {"passed": 2, "failed": 1}
    assert any("holds the same run as" in w for w in merged["warnings"])


def test_two_runs_of_one_job_are_both_merged(
    pytester: pytest.Pytester,
    run: Callable[..., pytest.RunResult],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    for name in ("first.json", "second.json"):
        run("--backends-matrix", "--backends-label=cpu", f"--backends-report={name}")
    out = pytester.path / "merged.json"
    capsys.readouterr()

    paths = [str(pytester.path / n) for n in ("first.json", "second.json")]
    assert main(["merge", "--report", str(out), *paths]) == 0

    assert "holds the same run as" not in capsys.readouterr().err
    merged = json.loads(out.read_text())
    assert len(merged["sources"]) == 2
    assert merged["session"]["outcomes"] == {"passed": 4, "failed": 2}


def test_a_copy_of_a_merged_report_is_merged_once(
    tmp_path: Path,
    pytester: pytest.Pytester,
    run: Callable[..., pytest.RunResult],
    capsys: pytest.CaptureFixture[str],
) -> None:
    stage = tmp_path / "stage.json"
    assert main(["merge", "--report", str(stage), *_jobs(pytester, run, "ab")]) == 0
    shutil.copy(stage, tmp_path / "copy.json")
    out = tmp_path / "out.json"
    capsys.readouterr()

    assert main(["merge", "--report", str(out), str(stage), str(tmp_path / "copy.json")]) == 0

    assert "copy.json holds the same run as" in capsys.readouterr().err
    _assert_jobs_a_and_b_once(out)


def _jobs(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult], labels: str
) -> list[str]:
    """One matrix job of ``SUITE`` per label (one letter each); their reports' paths."""
    pytester.makepyfile(test_suite=SUITE)
    for label in labels:
        run("--backends-matrix", f"--backends-label={label}", f"--backends-report={label}.json")
    return [str(pytester.path / f"{label}.json") for label in labels]


def _assert_jobs_a_and_b_once(out: Path) -> None:
    """The merged report ``out`` holds jobs a and b, each counted once."""
    merged = json.loads(out.read_text())
    assert sorted(s["label"] for s in merged["sources"]) == ["a", "b"]
    assert merged["session"]["outcomes"] == {"passed": 4, "failed": 2}


STOPS = """
import pytest

def test_first():
    assert False

@pytest.mark.backends("mkldnn")
def test_after(backend_config):
    pass

def test_dropped():
    pass
"""


def _job_then_merge(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[pytest.RunResult, str]:
    """Run the matrix job (``-k "not dropped"``), check its deselected list, merge it alone.

    Returns the job's result and the merge's stderr.
    """
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-matrix", *args, "-k", "not dropped",
        "--backends-report=job.json",
    )  # fmt: skip
    report = json.loads((pytester.path / "job.json").read_text())
    assert report["coverage"]["deselected"] == ["test_suite.py::test_dropped"]
    capsys.readouterr()
    assert main(["merge", "--report", str(pytester.path / "m.json"), "job.json"]) == 0
    return result, capsys.readouterr().err


def test_a_test_of_a_stopped_job_never_reached_is_not_called_deselected(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-x`` stops the job before ``test_after``: merge says so, and ``-k`` drops are named."""
    pytester.makepyfile(test_suite=STOPS)
    result, err = _job_then_merge(pytester, capsys, "-x")
    result.assert_outcomes(failed=1, deselected=1)
    assert "test_suite.py::test_after (selected, but never reached (the job stopped" in err
    assert "test_suite.py::test_dropped (deselected in every job)" in err
    assert "test_after (deselected" not in err
    strict = main(["merge", "--strict", "--report", str(pytester.path / "s.json"), "job.json"])
    assert strict == 1


def test_items_deselected_on_xdist_workers_are_still_called_deselected(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workers, which deselect, tell the controller which items they dropped."""
    pytester.makepyfile(test_suite=STOPS.replace("assert False", "pass"))
    result, err = _job_then_merge(pytester, capsys, "-n", "2")
    result.assert_outcomes(passed=3)
    assert "test_suite.py::test_dropped (deselected in every job)" in err
    assert "never reached" not in err


def test_a_run_given_alone_and_inside_a_merged_report_is_merged_once(
    tmp_path: Path,
    pytester: pytest.Pytester,
    run: Callable[..., pytest.RunResult],
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = _jobs(pytester, run, "ab")
    stage = tmp_path / "stage.json"
    assert main(["merge", "--report", str(stage), a, b]) == 0
    capsys.readouterr()
    for order in ([str(stage), a], [a, str(stage)]):
        out = tmp_path / "out.json"
        assert main(["merge", "--report", str(out), *order]) == 0
        err = capsys.readouterr().err
        assert "holds the same run as" in err, err
        _assert_jobs_a_and_b_once(out)


def test_merged_reports_sharing_some_runs_are_refused_naming_both(
    tmp_path: Path,
    pytester: pytest.Pytester,
    run: Callable[..., pytest.RunResult],
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b, c = _jobs(pytester, run, "abc")
    ab, bc = tmp_path / "ab.json", tmp_path / "bc.json"
    assert main(["merge", "--report", str(ab), a, b]) == 0
    assert main(["merge", "--report", str(bc), b, c]) == 0
    capsys.readouterr()
    out = tmp_path / "out.json"
    assert main(["merge", "--report", str(out), str(ab), str(bc)]) != 0
    err = capsys.readouterr().err
    assert "ab.json and " in err and "bc.json both hold the run(s) b" in err, err
    assert not out.exists()
