"""--backends-determinism, census and baseline, end to end in pytest subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# In-process pytester runs import torch through the plugin; importing it here first
# keeps pytester's sys.modules snapshot from unloading (and re-importing) it.
import torch  # noqa: F401

from pytest_backends.determinism.feature import parse_runs

SUITE = """
import pytest
import torch

def _count(name):
    with open(name + ".calls", "a") as f:
        f.write("x\\n")

@pytest.fixture
def state():
    return torch.zeros(3)

@pytest.mark.backends(deterministic="on")
def test_noisy():
    _count("noisy")
    x = torch.ones(4) * 2
    assert torch.ops.pbtest.noisy(x).shape == (4,)

@pytest.mark.backends("deterministic")
def test_clean(state):
    _count("clean")
    x = torch.randn(4, 3)
    assert (x @ x.T).diagonal().min() >= 0
    assert state.sum() == 0

def test_unmarked_noisy():
    _count("unmarked")
    torch.ops.pbtest.noisy(torch.ones(2))

@pytest.mark.backends(deterministic="on")
def test_backward_random_upstream():
    x = torch.randn(32, requires_grad=True)
    y = torch.ops.pbtest.spread(x, 16)
    y.backward(torch.randn_like(y))

@pytest.mark.backends(deterministic="on")
def test_backward_sum_upstream():
    x = torch.randn(32, requires_grad=True)
    torch.ops.pbtest.spread(x, 16).sum().backward()

@pytest.mark.backends(deterministic="on")
def test_mutates_fixture(state):
    state.add_(1)
    state.mul(3)
"""


def _calls(pytester: pytest.Pytester, name: str) -> int:
    return len((pytester.path / f"{name}.calls").read_text().splitlines())


@pytest.mark.parametrize(
    ("value", "runs"),
    [("5", 5), ("2", 2), ("on", 5), ("", 5), ("default", 5), ("off", None), ("0", None)],
)
def test_parse_runs(value: str, runs: int | None) -> None:
    assert parse_runs(value, "--backends-determinism") == runs


@pytest.mark.parametrize(("value", "message"), [("1", "at least 2 runs"), ("tests/", "Write")])
def test_parse_runs_rejects(value: str, message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message) as info:
        parse_runs(value, "--backends-determinism")
    assert "--backends-determinism" in str(info.value)


def test_harness_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import pytest_backends.determinism.api, pytest_backends.determinism.plugin\n"
        "import pytest_backends.determinism.census, pytest_backends.determinism.feature\n"
        "import pytest_backends.determinism.record, pytest_backends.determinism.compare\n"
        "import pytest_backends.determinism.verdict, pytest_backends.determinism.runs\n"
        "import pytest_backends.batch.feature, pytest_backends.batch.plugin\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "extension",
    [
        pytest.param("auto", id="native-recorder"),
        # Without the extension: the Python recorder and digests computed with torch ops.
        pytest.param("off", id="python-fallback"),
    ],
)
def test_suite_run_finds_planted_ops(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, extension: str
) -> None:
    pytester = planted_conftest
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", extension)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("--backends-determinism=5")
    # A test that mutates its fixture is not repeatable: not checked, and it passes.
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines(
        [
            "nondeterministic op pbtest::noisy (cpu, float32) at test_suite.py:*: output 0 "
            "differs between run 0 and run 1 from identical inputs*",
            "nondeterministic op pbtest::spread_backward (cpu, float32) at *: output 0 differs*",
            "*= determinism =*",
            "not checked: test_suite.py::test_mutates_fixture: its inputs differ between runs "
            "(Python state outside torch ops): a tensor kept between runs *"
            "first used here by aten::add_",
            "*short test summary*",
            "FAILED test_suite.py::test_noisy - nondeterministic op*",
            "FAILED test_suite.py::test_backward_random_upstream - nondeterministic op*",
        ]
    )
    # The .sum() variant of the planted backward passes: all-ones gradients hide it.
    assert "test_backward_sum_upstream" not in "\n".join(
        line for line in result.outlines if "FAILED" in line
    )
    # A failing test runs once more to find where its blamed op was called.
    assert (_calls(pytester, "noisy"), _calls(pytester, "clean")) == (6, 5)
    assert _calls(pytester, "unmarked") == 1


def test_determinism_all_selects_unmarked_tests(planted_conftest: pytest.Pytester) -> None:
    planted_conftest.makepyfile(
        test_plain="""
        import torch

        def test_unmarked_noisy():
            torch.ops.pbtest.noisy(torch.ones(2))

        def test_unmarked_clean():
            torch.ones(2).exp()
        """
    )
    result = planted_conftest.runpytest_subprocess("--backends-determinism-all", "-p", "no:xdist")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["nondeterministic op pbtest::noisy (cpu, float32)*"])
    result.stdout.fnmatch_lines(["FAILED test_plain.py::test_unmarked_noisy - *"])


def _census_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_one="""
        import pytest
        import torch
        from pytest_backends import expect_nondeterministic_alert

        @pytest.mark.backends(deterministic="on")
        def test_noisy():
            torch.ops.pbtest.noisy(torch.ones(4, dtype=torch.float64))

        @pytest.mark.backends(deterministic="on")
        def test_alert():
            expect_nondeterministic_alert(
                lambda: torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
            )
        """,
        test_two="""
        import pytest
        import torch

        @pytest.mark.backends(deterministic="on")
        def test_matmul():
            x = torch.randn(4, 4)
            (x @ x).relu()
        """,
    )


@pytest.mark.slow
def test_census_and_baseline_gate_the_run(planted_conftest: pytest.Pytester) -> None:
    pytester = planted_conftest
    _census_suite(pytester)
    # 1. Record a baseline: nothing fails, the planted op is accepted.
    result = pytester.runpytest_subprocess(
        "--backends-census=census.json",
        "--backends-baseline=baseline.json",
        "--backends-baseline-update",
    )
    assert result.ret == 0
    baseline = json.loads((pytester.path / "baseline.json").read_text())
    assert baseline["accepted"] == [{"op": "pbtest::noisy", "device": "cpu", "dtype": "float64"}]
    census = json.loads((pytester.path / "census.json").read_text())
    verdicts = {(e["op"], e["dtype"]): e["verdict"] for e in census["entries"]}
    assert verdicts[("pbtest::noisy", "float64")] == "nondeterministic"
    assert verdicts[("aten::mm", "float32")] == "deterministic"
    assert verdicts[("aten::put_", "float32")] == "raises_under_deterministic_mode"
    noisy = next(e for e in census["entries"] if e["op"] == "pbtest::noisy")
    assert noisy["tests"] == ["test_one.py::test_noisy"]
    assert census["runs"] == 5 and census["torch"]

    # 2. With the planted op in the baseline the run passes.
    result = pytester.runpytest_subprocess("--backends-baseline=baseline.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*pbtest::noisy (cpu, float64): accepted by the baseline*"])

    # 3. Without it the run fails, naming the op.
    baseline["accepted"] = []
    (pytester.path / "baseline.json").write_text(json.dumps(baseline))
    result = pytester.runpytest_subprocess("--backends-baseline=baseline.json")
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            "FAILED: 1 nondeterministic op(s) not in the baseline*: pbtest::noisy (cpu, float64)",
            "accept with: pytest --backends-baseline=*baseline.json --backends-baseline-update "
            "(this job), or across jobs: pytest-backends baseline --census MERGED_CENSUS.json "
            "*baseline.json",
        ]
    )
    # the test's own failure ends with the same command
    result.stdout.fnmatch_lines(["  accept with: pytest --backends-baseline=*baseline.json *"])
    # and the command it names accepts the op: the next run passes
    update = pytester.runpytest_subprocess(
        "--backends-baseline=baseline.json", "--backends-baseline-update"
    )
    assert update.ret == 0, update.stdout.str()[-2000:]
    assert pytester.runpytest_subprocess("--backends-baseline=baseline.json").ret == 0
    (pytester.path / "baseline.json").write_text(json.dumps(baseline))

    # 4. The session fails even when the test's own failure is expected (xfail).
    pytester.makepyfile(
        test_one="""
        import pytest
        import torch

        @pytest.mark.xfail(reason="known")
        @pytest.mark.backends(deterministic="on")
        def test_noisy():
            torch.ops.pbtest.noisy(torch.ones(4, dtype=torch.float64))
        """
    )
    result = pytester.runpytest_subprocess("--backends-baseline=baseline.json", "test_one.py")
    # A finding of the plugin is not the failure the xfail expects: the test fails.
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["FAILED: 1 nondeterministic op(s) not in the baseline*: pbtest::noisy (cpu, float64)"]
    )


@pytest.mark.slow
def test_census_merges_xdist_workers(planted_conftest: pytest.Pytester) -> None:
    pytester = planted_conftest
    _census_suite(pytester)
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "--dist",
        "loadfile",
        "--backends-census=census.json",
        "--backends-determinism=3",
        "--junitxml=junit.xml",
    )
    result.assert_outcomes(passed=2, failed=1)
    census = json.loads((pytester.path / "census.json").read_text())
    tests = {t for e in census["entries"] for t in e["tests"]}
    # loadfile sends each file to its own worker: both workers' entries are merged.
    assert tests == {
        "test_one.py::test_noisy",
        "test_one.py::test_alert",
        "test_two.py::test_matmul",
    }
    assert census["runs"] == 3
    result.stdout.fnmatch_lines(["*pbtest::noisy (cpu, float64): NONDETERMINISTIC*"])
    # The verdicts travel as report properties: JUnit XML carries the same rows.
    properties = {
        (case.get("name"), p.get("name")): json.loads(p.get("value", "null"))
        for case in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
        for p in case.iter("property")
        if p.get("name") in ("backends_census", "backends_determinism_check")
    }
    rows = properties[("test_noisy", "backends_census")]
    assert {"op": "pbtest::noisy", "device": "cpu", "dtype": "float64"} in [
        {k: r[k] for k in ("op", "device", "dtype")} for r in rows
    ]
    assert [r["verdict"] for r in rows if r["op"] == "pbtest::noisy"] == ["nondeterministic"]
    assert properties[("test_matmul", "backends_determinism_check")]["check"] == "checked"


# Runs that never reach a test touch no torch state: they run in-process.


def test_broken_baseline_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    (pytester.path / "baseline.json").write_text('{"format": "pytest-backends-baseline",')
    result = pytester.runpytest("--backends-baseline=baseline.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--backends-baseline: baseline file *baseline.json is not valid JSON*"]
    )
    result = pytester.runpytest("--backends-baseline=missing.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*missing.json does not exist (create it with --backends-baseline-update)*"]
    )


def test_baseline_from_another_torch_warns(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    (pytester.path / "baseline.json").write_text(
        json.dumps(
            {
                "format": "pytest-backends-baseline",
                "version": 1,
                "torch": "2.11.0+cu130",
                "cuda": "13.0",
                "accepted": [],
            }
        )
    )
    result = pytester.runpytest("--backends-baseline=baseline.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*BaselineVersionWarning: baseline *baseline.json was recorded under "
            "torch 2.11.0+cu130 (CUDA 13.0), but this run uses torch*"
        ]
    )


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (["--backends-determinism=1"], "", "--backends-determinism: the determinism check needs"),
        (["--backends-determinism=many"], "", "--backends-determinism: expected a number"),
        ([], "backends_determinism = x", "ini option backends_determinism: expected a number"),
        (["--backends-baseline-update"], "", "--backends-baseline-update: name the file"),
    ],
)
def test_bad_values_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], ini: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_ini_twins(planted_conftest: pytest.Pytester) -> None:
    pytester = planted_conftest
    pytester.makeini(
        "[pytest]\n"
        "addopts = -p no:randomly -p no:cacheprovider -p no:xdist\n"
        "backends_determinism = 3\n"
        "backends_determinism_all = true\n"
        "backends_census = out/census.json\n"
    )
    pytester.makepyfile(test_a="import torch\n\ndef test_a():\n    torch.ones(2).neg()\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == 0
    census = json.loads((Path(pytester.path) / "out" / "census.json").read_text())
    assert census["runs"] == 3
    assert [e["op"] for e in census["entries"]] == ["aten::neg", "aten::ones"]
