"""docs/howto/ci.rst played as written: each job of its matrix, then its merge step.

The job matrix and the commands are read from the page itself, so the page and
this test cannot drift apart. Every collected test must run in some job; on a
machine without a GPU only the CUDA configurations may be reported as having
run nowhere, and ``merge --strict`` fails for exactly those.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Imported before any pytester snapshot (pytester unloads modules first imported in a test).
import torch

from pytest_backends.capability import levels

CI_RST = Path(__file__).parents[2] / "docs" / "howto" / "ci.rst"

SUITE = """
import pytest
import torch


def test_unmarked_matmul():
    x = torch.arange(6.0).reshape(2, 3)
    assert (x @ x.T).sum() > 0


@pytest.mark.backends("mkldnn")
def test_conv():
    x = torch.ones(1, 1, 4, 4)
    assert torch.nn.functional.conv2d(x, torch.ones(1, 1, 2, 2)).sum() == 36


@pytest.mark.backends(sdpa=["math", "flash"])
def test_sdpa():
    q = torch.ones(1, 2, 4, 8)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert out.shape == q.shape


@pytest.mark.backends("device")
def test_device(backend_config):
    assert torch.ones(2, device=backend_config.device).sum() == 2
"""

# A marker naming levels: each level's item must run in some job.
LEVELS_TEST = """

@pytest.mark.backends(cpu_capability=["default", "avx2"])
def test_levels(backend_config):
    level = backend_config.axes["cpu_capability"]
    assert torch.backends.cpu.get_cpu_capability().lower() == level
"""

BASELINE = {"format": "pytest-backends-baseline", "version": 1, "accepted": []}


def _recipe() -> tuple[list[tuple[str, str]], str, str]:
    """(job name, select) pairs, the test command and the merge command of ci.rst."""
    text = CI_RST.read_text()
    yaml = text[text.index("name: tests") :]
    jobs = re.findall(r'- \{name: ([\w-]+),.*?select: "([^"]*)"\}', yaml, re.DOTALL)
    test = re.search(r"- name: pytest\n\s+run: >\n(.*?)\n\s+- uses", yaml, re.DOTALL)
    merge = re.search(r"run: >\n\s+(pytest-backends merge.*?)\n\s+- uses", yaml, re.DOTALL)
    assert jobs and test and merge, "ci.rst no longer has the workflow this test plays"
    return jobs, " ".join(test.group(1).split()), " ".join(merge.group(1).split())


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.mark.slow
def test_the_ci_recipe_runs_every_test_in_some_job(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs, command, merge_command = _recipe()
    assert [name for name, _ in jobs] == ["linux-full", "linux-avx2", "macos", "gpu"]
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "2")
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makepyfile(test_suite=SUITE + LEVELS_TEST)
    (pytester.path / "determinism-baseline.json").write_text(json.dumps(BASELINE))
    artifacts = pytester.path / "artifacts"
    for name, select in jobs:
        line = command.replace("${{ matrix.select }}", select).replace("${{ matrix.name }}", name)
        argv = shlex.split(line)
        assert argv[0] == "pytest"
        result = pytester.runpytest_subprocess("-p", "no:randomly", *argv[1:])
        # Every job selects tests: none exits 5 or 4 ("selected nothing").
        assert result.ret == 0, f"job {name}: {line}\n{result.stdout.str()}"
        shutil.move(pytester.path / "out", artifacts / f"backends-{name}")

    argv = shlex.split(merge_command)
    assert argv[:3] == ["pytest-backends", "merge", "--strict"]
    script = Path(sys.executable).with_name("pytest-backends")
    merged = subprocess.run(
        [str(script), *argv[1:]], cwd=pytester.path, capture_output=True, text=True, check=False
    )
    report = _load(pytester.path / "merged.json")
    coverage = report["coverage"]
    collected = coverage["collected"]
    ran = set(coverage["ran"])
    # Every test of the suite ran in some job, the unmarked one included.
    for test in ("test_unmarked_matmul", "test_conv", "test_sdpa", "test_device", "test_levels"):
        ids = [n for n in collected if n.split("::")[1].split("[")[0] == test]
        assert any(n in ran for n in ids), (test, merged.stderr)
    assert "collected test(s) ran in no job" not in merged.stderr
    # The avx2 job ran its mkldnn-off configurations at that level, and the unmarked test.
    avx2 = _load(artifacts / "backends-linux-avx2" / "report.json")["coverage"]
    avx2_ran = set(avx2["ran"])
    if levels.unsupported_reason("avx2") is None:
        assert "test_suite.py::test_conv[mkldnn-off,cap-avx2]" in avx2_ran
        assert "test_suite.py::test_unmarked_matmul[cap-avx2]" in avx2_ran
        # A marker keeps its own levels: the avx2 job starts a default worker for it.
        assert "test_suite.py::test_levels[cap-default]" in avx2_ran
        assert "test_suite.py::test_unmarked_matmul[cap-default]" not in set(avx2["collected"])
    # Only configurations this machine cannot run are reported as having run nowhere.
    dead = re.findall(r"^  (\S+) \((?:deselected|skipped)[^\n]*", merged.stderr, re.MULTILINE)
    expected_dead = {
        config
        for config in set(collected.values())
        if ("device-cuda" in config and not torch.cuda.is_available())
        or ("device-mps" in config and not torch.backends.mps.is_available())
        or ("cap-avx2" in config and levels.unsupported_reason("avx2") is not None)
    }
    assert "(deselected in every job)" not in merged.stderr
    assert set(dead) == expected_dead, merged.stderr
    assert merged.returncode == (1 if expected_dead else 0), merged.stderr
    if expected_dead:
        assert "--strict: " in merged.stderr


def test_a_recipe_that_leaves_configs_out_is_named_by_merge(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The former recipe (every job narrowed with --backends-config) left gaps; merge names them."""
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makepyfile(test_suite=SUITE)
    for name, select in (("a", "mkldnn-on"), ("b", "mkldnn-off")):
        result = pytester.runpytest_subprocess(
            "-p",
            "no:randomly",
            f"--backends-config={select}",
            f"--backends-label={name}",
            f"--backends-report={name}.json",
        )
        # --backends-config narrows only the tests marked with its axis: the others run.
        missing = [not torch.cuda.is_available(), not torch.backends.mps.is_available()]
        result.assert_outcomes(passed=7 - sum(missing), skipped=sum(missing))
    script = Path(sys.executable).with_name("pytest-backends")
    merged = subprocess.run(
        [str(script), "merge", "--strict", "--report", "m.json", "a.json", "b.json"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "collected test(s) ran in no job" not in merged.stderr, merged.stderr
    ran = set(_load(pytester.path / "m.json")["coverage"]["ran"])
    assert "test_suite.py::test_unmarked_matmul" in ran
    assert "test_suite.py::test_sdpa[sdpa-math]" in ran
    if not torch.cuda.is_available():
        assert merged.returncode == 1
        assert re.search(r"^  device-cuda \(skipped in every job", merged.stderr, re.MULTILINE)


def test_backends_config_combines_with_the_cpu_capability_option(
    pytester: pytest.Pytester,
) -> None:
    """The capability option adds its axis; it does not narrow the matrix to it."""
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "--co",
        "-q",
        "--backends-config=mkldnn-off",
        "--backends-cpu-capability=default",
    )
    assert result.ret == 0, result.stdout.str()
    ids = [line for line in result.outlines if line.startswith("test_suite.py::")]
    assert "test_suite.py::test_conv[mkldnn-off,cap-default]" in ids
    assert "test_suite.py::test_conv[mkldnn-on,cap-default]" not in ids
    # Tests not marked with the mkldnn axis run as without --backends-config.
    assert "test_suite.py::test_unmarked_matmul[cap-default]" in ids
    assert "test_suite.py::test_sdpa[sdpa-math,cap-default]" in ids


def test_selected_nothing_names_the_real_cause(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--co", "--backends-strict", "--backends-config=cudnn-on"
    )
    result.stdout.fnmatch_lines(
        [
            "--backends-config selected no test: no collected test is marked "
            "@pytest.mark.backends with the cudnn axis*"
        ]
    )
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "--co",
        "--backends-strict",
        "--backends-matrix=sdpa",
        "--backends-config=mkldnn-off",
    )
    result.stdout.fnmatch_lines(
        [
            "--backends-config selected no test: it names the mkldnn axis, which the matrix "
            "does not expand here (--backends-matrix expands sdpa)*"
        ]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_merge_names_tests_deselected_in_every_job(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    for name, k in (("a", "conv"), ("b", "sdpa")):
        result = pytester.runpytest_subprocess(
            "-p",
            "no:randomly",
            "--backends-matrix",
            "-k",
            k,
            f"--backends-label={name}",
            f"--backends-report={name}.json",
        )
        assert result.ret == 0
    script = Path(sys.executable).with_name("pytest-backends")
    args = [str(script), "merge", "--report", "m.json", "a.json", "b.json"]
    lenient = subprocess.run(args, cwd=pytester.path, capture_output=True, text=True)
    assert lenient.returncode == 0
    assert "2 collected test(s) ran in no job:" in lenient.stderr
    assert "  test_suite.py::test_unmarked_matmul (deselected in every job)" in lenient.stderr
    assert "  test_suite.py::test_device (deselected in every job)" in lenient.stderr
    assert re.search(r"^  device-cpu \(deselected in every job\)", lenient.stderr, re.MULTILINE)
    args.insert(2, "--strict")
    strict = subprocess.run(args, cwd=pytester.path, capture_output=True, text=True)
    assert strict.returncode == 1
    assert "pytest-backends merge: error: --strict:" in strict.stderr


PLANTED_OPS = Path(__file__).parents[1] / "determinism" / "planted_ops.py"

RACY_SUITE = """
import torch


def test_unmarked_noisy():
    torch.ops.pbtest.noisy(torch.ones(4)).sum()
"""


def test_the_recipe_job_fails_on_an_unmarked_nondeterministic_op(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe gates the whole suite: an unmarked test's nondeterministic op fails its job.

    The op is planted (different bits on every call), so the verdict does not
    depend on how a real race falls in this session's runs.
    """
    jobs, command, _ = _recipe()
    name, select = jobs[0]
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "1")
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makeconftest(PLANTED_OPS.read_text(encoding="utf-8"))
    pytester.makepyfile(test_racy=RACY_SUITE)
    (pytester.path / "determinism-baseline.json").write_text(json.dumps(BASELINE))
    line = command.replace("${{ matrix.select }}", select).replace("${{ matrix.name }}", name)
    argv = shlex.split(line)
    result = pytester.runpytest_subprocess("-p", "no:randomly", *argv[1:])
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*nondeterministic op pbtest::noisy*"])
    census = _load(pytester.path / "out" / "census.json")
    verdicts = {row["op"]: row["verdict"] for row in census["entries"]}
    assert verdicts.get("pbtest::noisy") == "nondeterministic", census["entries"]


def test_the_first_baseline_command_makes_the_file_the_recipe_gates_on(
    pytester: pytest.Pytester,
) -> None:
    text = CI_RST.read_text()
    commands = re.findall(r"^\s*\$ (pytest --backends-determinism-all .*)$", text, re.MULTILINE)
    assert commands, "ci.rst no longer says how to make the first baseline"
    argv = shlex.split(commands[0])
    pytester.makepyfile(test_suite=SUITE)
    gated = [a for a in argv[1:] if a != "--backends-baseline-update"]
    # Before the first baseline, the gate is a usage error naming the file.
    missing = pytester.runpytest_subprocess("-p", "no:randomly", *gated)
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    assert "determinism-baseline.json" in missing.stderr.str()
    made = pytester.runpytest_subprocess("-p", "no:randomly", *argv[1:])
    assert made.ret == 0, made.stdout.str()
    baseline = _load(pytester.path / "determinism-baseline.json")
    assert baseline["format"] == "pytest-backends-baseline"
    again = pytester.runpytest_subprocess("-p", "no:randomly", *gated)
    assert again.ret == 0, again.stdout.str()
