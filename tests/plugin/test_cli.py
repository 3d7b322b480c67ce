"""``pytest-backends`` / ``python -m pytest_backends`` as a CI job calls it: real processes on the
reports and censuses of two real pytest jobs that disagree."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# plant::noisy adds a per-call amount to the nonzero elements of its input:
# nondeterministic on job b (ones), identical on every call on job a (zeros).
CONFTEST = """
import itertools

import torch

_calls = itertools.count()


@torch.library.custom_op("plant::noisy", mutates_args=())
def noisy(x: torch.Tensor) -> torch.Tensor:
    return x + (x != 0) * (next(_calls) * 1e-3)


@noisy.register_fake
def _noisy_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
"""

SUITE = """
import os

import pytest
import torch

pytestmark = pytest.mark.backends("mkldnn")
JOB_B = os.environ["JOB"] == "b"


def test_noisy():
    torch.ops.plant.noisy(torch.ones(4) if JOB_B else torch.zeros(4))


def test_flip(backend_config):
    assert not JOB_B or backend_config.axes["mkldnn"] == "on", "differs on job b"
"""

NOISY = "plant::noisy (cpu, float32)"
SCRIPT = Path(sys.executable).with_name("pytest-backends")
NO_TORCH = (
    "import runpy, sys; sys.modules['torch'] = None; sys.argv[0] = 'pytest-backends'; "
    "runpy.run_module('pytest_backends', run_name='__main__')"
)


def _env(**extra: str) -> dict[str, str]:
    # Wide columns: argparse wraps help text to the terminal width.
    return {**os.environ, "COLUMNS": "200", "PYTEST_BACKENDS_NATIVE": "off", **extra}


def _cli(
    *args: str | Path, cwd: Path | None = None, torch: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest_backends ARGS`` (``torch=False``: with ``import torch`` failing)."""
    command = ["-m", "pytest_backends"] if torch else ["-c", NO_TORCH]
    return subprocess.run(
        [sys.executable, *command, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env=_env(),
        cwd=cwd,
    )


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Reports and censuses of two real jobs: ``job-a`` passes, ``job-b`` fails three items."""
    path = tmp_path_factory.mktemp("jobs")
    (path / "pytest.ini").write_text("[pytest]\n")
    (path / "conftest.py").write_text(CONFTEST)
    (path / "test_job.py").write_text(SUITE)
    # The two jobs run side by side, as CI jobs do.
    runs = {
        job: subprocess.Popen(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "no:randomly"),
                *("-p", "no:cacheprovider", "--backends-matrix", "--backends-determinism=2"),
                "--backends-determinism-all",
                f"--backends-report=report-{job}.json",
                f"--backends-census=census-{job}.json",
                f"--backends-label=job-{job}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(JOB=job),
            cwd=path,
        )
        for job in ("a", "b")
    }
    outputs = {job: run.communicate(timeout=300)[0] for job, run in runs.items()}
    assert (runs["a"].returncode, runs["b"].returncode) == (0, 1), outputs
    return path


def test_help_names_each_subcommand_and_its_options() -> None:
    top = _cli("--help")
    assert top.returncode == 0 and top.stderr == ""
    usage = "usage: pytest-backends [-h] {merge,baseline,build-native,diverge,switches}"
    assert usage in top.stdout
    for line in (
        "merge the matrix reports and censuses of several jobs into one",
        "add new and remove fixed ops of a baseline from a whole-suite census",
        "build the native digest/repeat extension for this torch",
        "list torch's switches: managed by the guard, known not to be state, unknown",
    ):
        assert line in top.stdout
    for command, options in (
        ("merge", ("--report OUT.json", "--html OUT.html", "--census OUT.json", "IN [IN ...]")),
        ("baseline", ("--census CENSUS.json", "--check", "BASELINE.json")),
        ("build-native", ("--force", "--verbose", "--inplace")),
        ("switches", ("--names FILE",)),
    ):
        result = _cli(command, "--help")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: pytest-backends {command} ")
        assert all(option in result.stdout for option in options), result.stdout
        assert "building" not in result.stdout  # asking build-native for help builds nothing


@pytest.mark.skipif(not SCRIPT.exists(), reason="the console script is not installed")
def test_the_console_script_is_the_same_command() -> None:
    script = subprocess.run(
        [str(SCRIPT), "--help"], capture_output=True, text=True, check=False, env=_env()
    )
    assert script.returncode == 0
    assert script.stdout == _cli("--help").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "pytest-backends: error: the following arguments are required: command"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("merge", "--report", "out.json"), "the following arguments are required: IN"),
        (("baseline", "baseline.json"), "the following arguments are required: --census"),
        (("merge", "in.json"), "name an output with --report, --html or --census"),
    ],
)
def test_usage_errors_exit_2_with_the_message_on_stderr(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = _cli(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_merge_shows_conflicts_and_never_overwrites_an_outcome(jobs: Path, tmp_path: Path) -> None:
    out, census_out = tmp_path / "merged.json", tmp_path / "merged-census.json"
    inputs = [jobs / f"{kind}-{job}.json" for kind in ("report", "census") for job in "ab"]
    result = _cli("merge", "--report", out, "--census", census_out, *inputs)
    # Disagreeing jobs are what merge is for: it reports them and succeeds.
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    built = f"torch {_torch(jobs)}" + (f", CUDA {_cuda(jobs)}" if _cuda(jobs) else "")
    assert lines[:3] == [
        "merged 2 source(s):",
        f"  [1] job-a: 4 tests from {jobs / 'report-a.json'} ({built})",
        f"  [2] job-b: 4 tests from {jobs / 'report-b.json'} ({built})",
    ]
    grid = lines.index("config      passed  failed  skipped  conflict")
    assert " ".join(lines[grid + 3].split()) == "total 1 0 0 3"
    start = lines.index(
        "3 conflict(s): the same test and config gave different outcomes in different sources:"
    )
    assert lines[start + 1 : start + 4] == [
        "  test_job.py::test_flip[mkldnn-off]",
        "    job-a: passed",
        "    job-b: failed - AssertionError: differs on job b",
    ]
    assert f"report written to {out}" in lines and f"census written to {census_out}" in lines

    merged = _load(out)
    rows = {t["nodeid"]: t for t in merged["tests"]}
    flip_off = rows["test_job.py::test_flip[mkldnn-off]"]
    assert (flip_off["outcome"], flip_off["sources"]) == ("conflict", ["job-a", "job-b"])
    assert rows["test_job.py::test_flip[mkldnn-on]"]["outcome"] == "passed"
    kept = {
        c["nodeid"]: [(o["source"], o["outcome"]) for o in c["outcomes"]]
        for c in merged["conflicts"]
    }
    assert kept == {
        f"test_job.py::{name}": [("job-a", "passed"), ("job-b", "failed")]
        for name in ("test_flip[mkldnn-off]", "test_noisy[mkldnn-off]", "test_noisy[mkldnn-on]")
    }

    # The census: the nondeterministic verdict of job b wins over job a's deterministic one.
    assert "; 1 nondeterministic" in result.stdout
    assert f"  {NOISY}: in 2 test(s), e.g. test_job.py::test_noisy[mkldnn-off]" in lines
    census = _load(census_out)
    assert [s["label"] for s in census["sources"]] == ["job-a", "job-b"]
    noisy = [e for e in census["entries"] if e["op"] == "plant::noisy"]
    assert len(noisy) == 1 and noisy[0]["verdict"] == "nondeterministic"
    assert noisy[0]["observations"] == {"nondeterministic": 2, "deterministic": 2}

    # A directory of artifacts gives the same merge; unrelated JSON in it is passed over.
    artifacts = tmp_path / "artifacts"
    shutil.copytree(jobs, artifacts / "jobs")
    (artifacts / "notes.json").write_text('{"hello": 1}')
    again = tmp_path / "again.json"
    by_dir = _cli("merge", "--report", again, "--census", tmp_path / "c2.json", artifacts)
    assert (by_dir.returncode, by_dir.stderr) == (0, "")
    redone = _load(again)
    assert [(t["nodeid"], t["outcome"], t["sources"]) for t in redone["tests"]] == [
        (t["nodeid"], t["outcome"], t["sources"]) for t in merged["tests"]
    ]
    assert redone["totals"] == merged["totals"]


def _torch(jobs: Path) -> str:
    return str(_load(jobs / "report-a.json")["torch"])


def _cuda(jobs: Path) -> str | None:
    """The CUDA version the jobs' torch was built with (a CUDA build reports one without a GPU)."""
    cuda = _load(jobs / "report-a.json")["cuda"]
    return None if cuda is None else str(cuda)


def test_mixed_versions_are_merged_with_a_warning_on_stderr(jobs: Path, tmp_path: Path) -> None:
    gpu = _load(jobs / "report-b.json")
    gpu.update(torch="2.11.0+cu130", cuda="13.0")
    (tmp_path / "gpu.json").write_text(json.dumps(gpu))
    out = tmp_path / "merged.json"
    result = _cli("merge", "--report", out, jobs / "report-a.json", tmp_path / "gpu.json")
    assert result.returncode == 0
    (warning,) = result.stderr.splitlines()
    assert warning.startswith(
        "pytest-backends merge: warning: the reports come from different torch/CUDA versions"
    )
    assert (
        f"torch {_torch(jobs)} (CUDA {_cuda(jobs) or 'none'}): job-a ({jobs / 'report-a.json'})"
        in warning
    )
    assert f"torch 2.11.0+cu130 (CUDA 13.0): job-b ({tmp_path / 'gpu.json'})" in warning
    assert "warning" not in result.stdout
    assert (
        "job-b: 4 tests from" in result.stdout
        and "(torch 2.11.0+cu130, CUDA 13.0)" in result.stdout
    )
    sources = _load(out)["sources"]
    assert [(s["label"], s["torch"], s["cuda"]) for s in sources] == [
        ("job-a", _torch(jobs), _cuda(jobs)),
        ("job-b", "2.11.0+cu130", "13.0"),
    ]


def test_bad_inputs_and_outputs_fail_with_the_file_named(jobs: Path, tmp_path: Path) -> None:
    report = jobs / "report-a.json"
    out = tmp_path / "out.json"
    missing = tmp_path / "missing.json"
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    text = tmp_path / "notes.txt"
    text.write_text("not json at all\n")
    cases = [
        (("merge", "--report", out, report, missing), f"input file {missing} does not exist"),
        (
            ("merge", "--report", out, other),
            f"{other} is neither a matrix report (--backends-report) nor a census "
            "(--backends-census)",
        ),
        (("merge", "--report", out, text), f"input file {text} is not valid JSON"),
        (("merge", "--census", out, report), f"{report} is a matrix report; to merge it"),
    ]
    for args, message in cases:
        result = _cli(*args)
        assert result.returncode == 1, args
        assert result.stderr.startswith("pytest-backends merge: error: ")
        assert message in result.stderr and result.stdout == ""
        assert not out.exists(), "an output was written by a failed merge"

    # A file the plugin did not write is never overwritten by a merge's output.
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "data"}')
    result = _cli("merge", "--report", mine, report)
    assert result.returncode == 1
    assert f"refusing to overwrite {mine}: it exists and is not a matrix report" in result.stderr
    assert mine.read_text() == '{"my": "data"}'

    baseline = tmp_path / "baseline.json"
    for args, message in (
        (("--census", missing, baseline), f"census file {missing} does not exist"),
        (
            ("--census", report, baseline),
            f"census file {report}: 'format' must be 'pytest-backends-census', got "
            "'pytest-backends-report' (it is a matrix report file)",
        ),
        (("--check", "--census", jobs / "census-b.json", missing), f"baseline file {missing}"),
    ):
        result = _cli("baseline", *args)
        assert result.returncode == 1, args
        assert result.stderr.startswith("pytest-backends baseline: error: ")
        assert message in result.stderr
        assert not baseline.exists() and not missing.exists()


def test_check_fails_only_on_new_ops_and_says_how_to_accept_them(
    jobs: Path, tmp_path: Path
) -> None:
    committed = tmp_path / "committed.json"
    empty = '{"format": "pytest-backends-baseline", "version": 1, "accepted": []}\n'
    committed.write_text(empty)
    census = jobs / "census-b.json"
    check = _cli("baseline", "--check", "--census", census, committed)
    assert check.returncode == 1
    lines = check.stdout.splitlines()
    assert lines[0] == (
        f"NEW nondeterministic op, not in {committed}: {NOISY}; in "
        "test_job.py::test_noisy[mkldnn-off], test_job.py::test_noisy[mkldnn-on]"
    )
    assert lines[-1].startswith(f"FAILED: 1 nondeterministic op(s) not in the baseline {committed}")
    assert committed.read_text() == empty, "--check wrote the baseline"

    # The command the failure names accepts the op; the gate then passes.
    suggested = shlex.split(lines[-1].split("accept them with: ", 1)[1])
    assert suggested[0] == "pytest-backends"
    accept = _cli(*suggested[1:])
    assert accept.returncode == 0, accept.stderr
    assert f"added {NOISY}: nondeterministic in test_job.py::test_noisy" in accept.stdout
    assert f"baseline written to {committed} (1 entries)" in accept.stdout
    assert _load(committed)["accepted"] == [
        {"op": "plant::noisy", "device": "cpu", "dtype": "float32"}
    ]
    passed = _cli("baseline", "--check", "--census", census, committed)
    assert passed.returncode == 0
    assert (
        passed.stdout.strip()
        == f"every nondeterministic op of {census} is in the baseline {committed}"
    )

    # An entry no longer needed is reported, but it does not fail the gate or change the file.
    before = committed.read_text()
    stale = _cli("baseline", "--check", "--census", jobs / "census-a.json", committed)
    assert stale.returncode == 0
    assert stale.stdout.startswith("could be removed: plant::noisy (cpu): every key it accepts")
    assert committed.read_text() == before


def test_merge_and_the_gate_run_where_torch_is_not_installed(jobs: Path, tmp_path: Path) -> None:
    # A CI merge job needs only pytest-backends: every ``import torch`` fails here.
    inputs = [jobs / f"{kind}-{job}.json" for kind in ("report", "census") for job in "ab"]
    merged, census, baseline = tmp_path / "m.json", tmp_path / "c.json", tmp_path / "b.json"
    for args in (
        ("merge", "--report", merged, "--census", census, *inputs),
        ("baseline", "--census", census, baseline),
        ("baseline", "--check", "--census", census, baseline),
    ):
        result = _cli(*args, torch=False)
        assert (result.returncode, result.stderr) == (0, ""), args
    assert _load(merged)["conflicts"] != []
    assert [e["op"] for e in _load(baseline)["accepted"]] == ["plant::noisy"]


def test_switches_lists_managed_not_state_and_unknown(tmp_path: Path) -> None:
    result = _cli("switches")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "_get_cudnn_benchmark -> cudnn.benchmark (row)" in out
    assert "\nknown not to be global numeric state (" in out
    assert "_accelerator_getStream: device runtime" in out
    assert "\nunknown (0)\n" in out
    names = tmp_path / "new.names"
    names.write_text("# torch 2.99\n_get_cudnn_benchmark\n\n_get_brand_new_switch\n")
    newer = _cli("switches", "--names", str(names))
    assert newer.returncode == 1
    assert "unknown (1)\n  _get_brand_new_switch" in newer.stdout
    binary = tmp_path / "binary.names"
    binary.write_bytes(b"\xa8\xff\x00")
    empty = tmp_path / "empty.names"
    empty.write_text("# truncated\n\n")
    for bad, reason in (
        (empty, "no names in the file"),
        (tmp_path / "missing.names", "No such file or directory"),
        (tmp_path, "Is a directory"),
        (binary, "can't decode"),
    ):
        failed = _cli("switches", "--names", str(bad))
        assert failed.returncode == 2, failed.stderr
        assert failed.stderr.startswith(f"pytest-backends switches: error: --names {bad}: ")
        assert reason in failed.stderr and "Traceback" not in failed.stderr
