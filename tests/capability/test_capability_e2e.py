"""CPU capability levels end to end: one real process per level, merged into one run.

Each child imports torch (about 2 s), so the runs are few and each checks a lot.
"""

from __future__ import annotations

import json
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
import warnings

import pytest
import torch

LEVELS = ["default", "avx2", "avx512"]


def record(request, **extra):
    cap = torch.backends.cpu.get_cpu_capability()
    request.node.user_properties.append(("cpu_capability", cap))
    line = {"nodeid": request.node.nodeid, "cap": cap, "pid": os.getpid(), **extra}
    with open(os.environ["CAP_RECORD"], "a") as f:
        f.write(json.dumps(line) + "\\n")


@pytest.mark.backends(cpu_capability=LEVELS)
def test_records(request):
    record(request)
    cap = torch.backends.cpu.get_cpu_capability()
    print(f"stdout of the {cap} process")
    warnings.warn(f"warned under {cap}")


@pytest.mark.backends(cpu_capability=LEVELS)
def test_exits_in_avx2(request, backend_config):
    record(request)
    if backend_config.axes["cpu_capability"] == "avx2":
        os._exit(1)


@pytest.mark.backends("mkldnn", cpu_capability=LEVELS)
def test_with_mkldnn(request, backend_config):
    record(request, mkldnn=torch.backends.mkldnn.enabled)
    assert torch.backends.mkldnn.enabled is (backend_config.axes["mkldnn"] == "on")


@pytest.mark.backends(cpu_capability=["default", "sve256"])
def test_sve():
    pass


def test_plain(request):
    record(request)
"""


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_matrix_run(result: pytest.RunResult, record: Path, junit: Path) -> bool:
    # 3 records + 2 surviving exit tests + 6 mkldnn x level + sve-default + plain.
    result.assert_outcomes(passed=13, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_exits_in_avx2?cap-avx2? _*",
            "crashed the cap-avx2 process (exit code 1) while running this test.*",
        ]
    )
    result.stdout.fnmatch_lines(["SKIPPED*cap-sve256: sve256 is a CPU level of aarch64*"])
    # Captured output and warnings of the level processes reach this run's summaries.
    result.stdout.fnmatch_lines(["*test_records?cap-avx2?*", "*stdout of the AVX2 process"])
    result.stdout.fnmatch_lines(["*warnings summary*", "*UserWarning: warned under AVX512"])

    rows = _records(record)
    ids = [row["nodeid"] for row in rows]
    assert len(ids) == len(set(ids)), "an item ran twice"
    by_level = {row["nodeid"]: row["cap"] for row in rows if "test_records" in row["nodeid"]}
    assert sorted(by_level.values()) == ["AVX2", "AVX512", "DEFAULT"]
    caps_by_pid: dict[int, set[str]] = defaultdict(set)
    parent_pids = {row["pid"] for row in rows if row["nodeid"].endswith("test_plain")}
    for row in rows:
        if row["nodeid"].endswith("test_plain"):
            continue
        level = next(lv for lv in LEVELS if f"cap-{lv}]" in row["nodeid"])
        assert row["cap"] == capability.LEVELS[level].reported, row
        caps_by_pid[row["pid"]].add(row["cap"])
    assert all(len(caps) == 1 for caps in caps_by_pid.values()), caps_by_pid
    assert not parent_pids & set(caps_by_pid), "a level item ran in a pytest process"

    mkldnn = [row for row in rows if "test_with_mkldnn" in row["nodeid"]]
    assert len(mkldnn) == 6
    for row in mkldnn:
        assert row["mkldnn"] is ("mkldnn-on," in row["nodeid"]), row
    # The avx2 process died in test_exits_in_avx2; a new one ran the rest of the level
    # (unless pytest-randomly put the exiting test last).
    avx2_pids = {row["pid"] for row in rows if "cap-avx2]" in row["nodeid"]}
    restarted = "remaining tests run in a new process" in result.stdout.str()
    assert len(avx2_pids) == (2 if restarted else 1)
    return restarted

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


@needs_x86_levels
def test_three_levels_side_by_side_without_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_levels=SUITE)
    record = pytester.path / "record.jsonl"
    junit = pytester.path / "junit.xml"
    monkeypatch.setenv("CAP_RECORD", str(record))
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
        "--backends-matrix",
        "--backends-cpu-capability-jobs=3",
        "-rsP",
        f"--junitxml={junit}",
    )
    assert _check_matrix_run(result, record, junit), "the avx2 level was not restarted"


@needs_x86_levels
def test_three_levels_under_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_levels=SUITE)
    record = pytester.path / "record.jsonl"
    junit = pytester.path / "junit.xml"
    monkeypatch.setenv("CAP_RECORD", str(record))
    result = pytester.runpytest_subprocess(
        "-n", "2", "--backends-matrix", "-rsP", f"--junitxml={junit}", "-p", "randomly"
    )
    _check_matrix_run(result, record, junit)


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


@pytest.mark.parametrize("seen", [os.environ.get("ATEN_CPU_CAPABILITY", "unset")])
def test_collected_differently(seen):
    pass
"""

# Simulates a torch that ignored ATEN_CPU_CAPABILITY in the avx2 process.
IGNORING_TORCH = """
import os

def pytest_configure(config):
    if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2":
        import torch.backends.cpu
        torch.backends.cpu.get_cpu_capability = lambda: "AVX512"
"""


@needs_x86_levels
def test_unsupported_level_mismatch_segfault_and_collection_drift(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_faults=FAULTS)
    pytester.makeconftest(IGNORING_TORCH)
    monkeypatch.setenv(capability.FAKE_FEATURES_ENV, "-avx512f")
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:xdist", "--backends-cpu-capability=all", "-rs", "-v"
    )
    result.stdout.fnmatch_lines(
        [
            "backends: CPU capability levels default, avx2, one process each (CPU features "
            "edited by PYTEST_BACKENDS_FAKE_CPU_FEATURES=-avx512f)"
        ]
    )
    # all = default and avx2 here; the avx2 process is refused before any test runs.
    result.assert_outcomes(passed=2, failed=1, skipped=2, errors=6)
    result.stdout.fnmatch_lines(
        [
            "*::test_first[[]cap-default[]] PASSED*",
            "*::test_segfaults_in_default[[]cap-default[]] FAILED*",
            "*::test_after_the_crash[[]cap-default[]] PASSED*",
            "*::test_skips_in_its_process[[]cap-default[]] SKIPPED (skip*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "crashed the cap-default process (killed by signal SIGSEGV) while running this test."
            " The level's 3 remaining tests run in a new process.*",
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
        ["SKIPPED*cap-avx512: this CPU lacks avx512f (PYTEST_BACKENDS_FAKE_CPU_FEATURES is set)*"]
    )
    result.stdout.fnmatch_lines(["not run: the cap-default process did not collect this test*"])
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] test_faults.py:*: skipped inside the level process"]
    )
    assert "test_marker_wins[cap-default]" not in result.stdout.str()


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
