"""CPU capability levels end to end: real pytest-xdist workers, one set per level.

Each worker imports torch (about 2 s), so the runs are few and each checks a lot.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from pytest_backends.capability import levels as capability

pytest_plugins = ["pytester"]

LEVELS = ("default", "avx2", "avx512")

needs_x86_levels = pytest.mark.skipif(
    capability.supported_levels()[:3] != LEVELS,
    reason="needs an x86 CPU that can run default, avx2 and avx512",
)

SUITE = """
import json
import os
import unittest
import warnings

import pytest
import torch


def record(request, **extra):
    cap = torch.backends.cpu.get_cpu_capability()
    request.node.user_properties.append(("cpu_capability", cap))
    line = {"nodeid": request.node.nodeid, "cap": cap, "pid": os.getpid(),
            "inductor": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), **extra}
    with open(os.environ["CAP_RECORD"], "a") as f:
        f.write(json.dumps(line) + "\\n")


def test_records(request):
    record(request)
    cap = torch.backends.cpu.get_cpu_capability()
    print(f"stdout of the {cap} process")
    warnings.warn(f"warned under {cap}")


def test_exits_in_avx2(request, backend_config):
    record(request)
    if backend_config.axes["cpu_capability"] == "avx2":
        os._exit(1)


@pytest.mark.backends("mkldnn")
def test_with_mkldnn(request, backend_config):
    record(request, mkldnn=torch.backends.mkldnn.enabled)
    assert torch.backends.mkldnn.enabled is (backend_config.axes["mkldnn"] == "on")


@pytest.mark.backends(cpu_capability=["default", "sve256"])
def test_sve():
    pass


def test_deselected_by_k():
    pass


@pytest.mark.parametrize("n", range(4))
def test_many(request, n):
    record(request)


class Legacy(unittest.TestCase):
    def test_unittest_style(self):
        self.assertTrue(torch.ones(1).item() == 1)
"""


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run_levels(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[pytest.RunResult, list[dict[str, Any]], Path, Path]:
    pytester.makepyfile(test_levels=SUITE)
    record = pytester.path / "record.jsonl"
    junit = pytester.path / "junit.xml"
    report = pytester.path / "matrix.json"
    monkeypatch.setenv("CAP_RECORD", str(record))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    result = pytester.runpytest_subprocess(
        "--backends-cpu-capability=default,avx2,avx512",
        "--backends-matrix",
        "-k",
        "not test_deselected_by_k",
        "-rsP",
        f"--junitxml={junit}",
        f"--backends-report={report}",
        *args,
    )
    return result, _records(record), junit, report


def _check_levels(
    result: pytest.RunResult, rows: list[dict[str, Any]], junit: Path, report: Path
) -> dict[str, set[int]]:
    # per level: records, exits (fails in avx2), mkldnn on/off, 4 many; sve-default;
    # sve256 skipped; the TestCase method once.
    result.assert_outcomes(passed=3 * 8 - 1 + 1 + 1, failed=1, skipped=1, warnings=4)
    result.stdout.fnmatch_lines(
        [
            "*_ test_exits_in_avx2?cap-avx2? _*",
            "crashed the cap-avx2 worker gw* (exit code 1) while running this test. "
            "The level's remaining tests run on a replacement worker.",
        ]
    )
    result.stdout.fnmatch_lines(
        ["SKIPPED*cap-sve256 cannot run on this machine: sve256 is a CPU level of aarch64*"]
    )
    # Captured output and warnings of the level workers reach this run's summaries.
    result.stdout.fnmatch_lines(["*test_records?cap-avx2?*", "*stdout of the AVX2 process"])
    result.stdout.fnmatch_lines(["*warnings summary*", "*UserWarning: warned under AVX512"])
    # The TestCase method cannot be parametrized: one warning says so, naming it.
    result.stdout.fnmatch_lines(
        [
            "*CapabilityWarning: test_levels.py::Legacy::test_unittest_style runs once, at CPU "
            "capability level default, not at avx2, avx512: it is a unittest.TestCase method*"
        ]
    )
    assert result.stdout.str().count("Legacy::test_unittest_style runs once") == 1
    # Every worker deselected the same 3 items (one per level); they are counted once.
    result.stdout.fnmatch_lines(["backends: 3 deselected (the same items in every worker*"])

    ids = [row["nodeid"] for row in rows]
    assert len(ids) == len(set(ids)), "an item ran twice"
    pids: dict[str, set[int]] = defaultdict(set)
    caps_by_pid: dict[int, set[str]] = defaultdict(set)
    inductor: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        level = next(lv for lv in LEVELS if re.search(rf"cap-{lv}\b", row["nodeid"]))
        assert row["cap"] == capability.LEVELS[level].reported, row
        caps_by_pid[row["pid"]].add(row["cap"])
        pids[level].add(row["pid"])
        inductor[level].add(row["inductor"])
    assert all(len(caps) == 1 for caps in caps_by_pid.values()), caps_by_pid
    # Each level has a TORCHINDUCTOR_CACHE_DIR of its own.
    assert all(len(dirs) == 1 for dirs in inductor.values()), inductor
    assert len({next(iter(dirs)) for dirs in inductor.values()}) == 3, inductor

    mkldnn = [row for row in rows if "test_with_mkldnn" in row["nodeid"]]
    assert len(mkldnn) == 6
    for row in mkldnn:
        assert row["mkldnn"] is ("mkldnn-on," in row["nodeid"]), row

    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    for level in LEVELS:
        props = {
            p.get("name"): p.get("value")
            for p in cases[f"test_records[cap-{level}]"].iter("property")
        }
        assert props["cpu_capability"] == level.upper()
        assert props["backend_config"] == f"cap-{level}"
    failure = cases["test_exits_in_avx2[cap-avx2]"].find("failure")
    assert failure is not None and "exit code 1" in (failure.get("message") or "")

    # The matrix report puts the crash in its config's row, with the reason.
    data = json.loads(report.read_text())
    rows_by_id = {row["id"]: row["counts"] for row in data["configs"]}
    assert rows_by_id["cap-avx2"]["failed"] == 1
    assert rows_by_id["cap-default"]["failed"] == 0
    failed = [t for t in data["tests"] if t["outcome"] == "failed"]
    assert [t["config"] for t in failed] == ["cap-avx2"]
    assert "crashed the cap-avx2 worker" in failed[0]["message"]
    return pids


@pytest.mark.slow
@needs_x86_levels
def test_three_levels_one_worker_each(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, rows, junit, report = _run_levels(pytester, monkeypatch, "-p", "no:randomly")
    result.stdout.fnmatch_lines(
        [
            "backends: CPU capability levels default, avx2, avx512; 1 xdist worker per level; "
            "oneDNN ISA per level: default SSE41, avx2 AVX2, avx512 * (this CPU's own)"
        ]
    )
    pids = _check_levels(result, rows, junit, report)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # The avx2 worker died in test_exits_in_avx2; a replacement ran the rest of the level
    # (the suite runs in file order, so items of the level come after the crash).
    assert len(pids["avx2"]) == 2
    assert len(pids["default"]) == len(pids["avx512"]) == 1
    result.stdout.fnmatch_lines(["*replacing crashed worker gw1*"])


FAULTS = """
import ctypes
import os

import pytest
import torch


def test_first():
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"


def test_segfaults_in_default():
    if os.environ["ATEN_CPU_CAPABILITY"] == "default":
        ctypes.string_at(0)


def test_after_the_crash():
    assert torch.ones(4).sum() == 4


def test_skips_in_its_process():
    pytest.skip("skipped inside the level process")


@pytest.mark.backends(cpu_capability=["avx512"])
def test_marker_wins():
    pass
"""

# Simulates a torch that ignored ATEN_CPU_CAPABILITY in the avx2 worker.
IGNORING_TORCH = """
import os

def pytest_configure(config):
    if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2":
        import torch.backends.cpu
        torch.backends.cpu.get_cpu_capability = lambda: "AVX512"
"""


@pytest.mark.slow
@needs_x86_levels
def test_two_workers_per_level_unsupported_level_mismatch_and_segfault(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_faults=FAULTS)
    pytester.makeconftest(IGNORING_TORCH)
    monkeypatch.setenv(capability.FAKE_FEATURES_ENV, "-avx512f")
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-cpu-capability=all,avx512", "-rs", "-v", "-n", "2"
    )
    result.stdout.fnmatch_lines(
        [
            "backends: CPU capability levels default, avx2, avx512; 2 xdist workers per level "
            "(no workers for avx512: this CPU cannot run them); oneDNN ISA per level: "
            "default SSE41, avx2 AVX2 (CPU features edited by "
            "PYTEST_BACKENDS_FAKE_CPU_FEATURES=-avx512f)"
        ]
    )
    # The avx2 worker refuses to run anything on the wrong kernels.
    result.assert_outcomes(passed=2, failed=1, skipped=6, errors=4)
    for line in (
        "*PASSED *::test_first[[]cap-default[]]*",
        "*FAILED *::test_segfaults_in_default[[]cap-default[]]*",
        "*PASSED *::test_after_the_crash[[]cap-default[]]*",
        "*SKIPPED *::test_skips_in_its_process[[]cap-default[]]*",
    ):
        result.stdout.fnmatch_lines([line])
    result.stdout.fnmatch_lines(
        [
            "crashed the cap-default worker gw? (killed by signal SIGSEGV) while running this "
            "test. The level's remaining tests run on a replacement worker. The worker's last "
            "output:",
            "*Fatal Python error: Segmentation fault*",
            "*File*test_faults.py*, line * in test_segfaults_in_default",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "cap-avx2: the process started for CPU capability level 'avx2' runs torch's "
            "AVX512 kernels, not AVX2*none of this level's tests were run on the wrong kernels"
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "SKIPPED*cap-avx512 cannot run on this machine: this CPU lacks avx512f "
            "(PYTEST_BACKENDS_FAKE_CPU_FEATURES is set)*"
        ]
    )
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] test_faults.py:*: skipped inside the level process"]
    )
    assert "test_marker_wins[cap-default]" not in result.stdout.str()


STOPS = """
import os
import time

import pytest


@pytest.mark.parametrize("n", range(6))
def test_fails_in_default(n):
    if os.environ["ATEN_CPU_CAPABILITY"] == "default" and n == 1:
        raise AssertionError("fails at default")
    time.sleep(0.2)
"""


@pytest.mark.slow
@needs_x86_levels
def test_exitfirst_and_last_failed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_stops=STOPS)
    first = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-cpu-capability=default", "-x"
    )
    first.stdout.fnmatch_lines(["*stopping after 1 failures*"])
    outcomes = first.parseoutcomes()
    assert outcomes["failed"] == 1
    assert outcomes.get("passed", 0) < 5, "-x did not stop the run"
    assert first.ret == pytest.ExitCode.TESTS_FAILED
    again = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-cpu-capability=default", "--lf", "-v"
    )
    again.stdout.fnmatch_lines(["*FAILED *::test_fails_in_default[[]cap-default-1[]]*"])
    again.assert_outcomes(failed=1)


SLEEPS = """
import os
import time


def test_sleeps():
    path = os.path.join(os.environ["PID_DIR"], os.environ["ATEN_CPU_CAPABILITY"])
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    return not (state.exists() and state.read_text().rsplit(")", 1)[1].split()[0] == "Z")


@needs_x86_levels
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigterm_to_the_controller_leaves_no_worker_behind(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sleeps=SLEEPS)
    pid_dir = pytester.path / "pids"
    pid_dir.mkdir()
    env = {**os.environ, "PID_DIR": str(pid_dir)}
    controller = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "--backends-cpu-capability=default,avx2",
            "-q",
        ],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(pid_dir.iterdir())) < 2 and time.monotonic() < deadline:
            assert controller.poll() is None, controller.stdout.read() if controller.stdout else ""
            time.sleep(0.2)
        workers = [int(p.read_text()) for p in pid_dir.iterdir()]
        assert len(workers) == 2
        controller.send_signal(signal.SIGTERM)
        out, _ = controller.communicate(timeout=60)
        assert controller.returncode == pytest.ExitCode.INTERRUPTED, out
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers if _alive(pid)], "a level worker outlived the run"
        assert b"pytest received SIGTERM" in out
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()


def test_without_xdist_the_levels_are_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "--backends-cpu-capability=default")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--backends-cpu-capability runs each level in pytest-xdist workers, and pytest-xdist "
            "is not active: install it (pip install pytest-xdist)*"
        ]
    )


def test_bad_level_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest("--backends-cpu-capability=default,avx9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--backends-cpu-capability: unknown CPU capability level 'avx9'; choose from*"]
    )


def test_collect_only_lists_the_levels(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.backends("mkldnn")
        def test_a():
            pass

        def test_b():
            pass
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--collect-only", "-q", "--backends-cpu-capability=default,avx2"
    )
    result.stdout.fnmatch_lines(
        [
            "*::test_a[[]cap-default[]]",
            "*::test_a[[]cap-avx2[]]",
            "*::test_b[[]cap-default[]]",
            "*::test_b[[]cap-avx2[]]",
            "4 tests collected*",
        ]
    )
