"""The CI recipe played on one machine: three shard jobs, a merge, a baseline from the whole suite.

Each shard is a separate pytest process with its own ``--backends-config``
selection (one under ``-n 2``); they share one baseline file, as CI jobs
that update a committed baseline would. The merged report must equal a
single full run test by test, and the merged census the full run's census.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

# Imported before any pytester snapshot (pytester unloads modules first imported in a test).
import torch  # noqa: F401

from pytest_backends.__main__ import main

# plant::noisy adds a per-call amount to the nonzero elements of its input: nondeterministic
# for a nonzero input, identical on every call for an all-zero one.
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
import pytest
import torch

pytestmark = pytest.mark.backends("mkldnn", "deterministic")


def test_matmul():
    x = torch.arange(6.0).reshape(2, 3)
    assert (x @ x.T).sum() > 0


def test_noisy(backend_config):
    on = backend_config.axes["deterministic"] == "on"
    torch.ops.plant.noisy(torch.ones(4) if on else torch.zeros(4))


def test_mixed(backend_config):
    if backend_config.axes["mkldnn"] == "off":
        pytest.skip("needs oneDNN")
    assert backend_config.axes["deterministic"] == "on", "differs without deterministic mode"
"""

COMMON = ("-p", "no:randomly", "-p", "no:cacheprovider", "--backends-determinism=2")
SHARDS = (
    ("shard-1", "mkldnn-on,deterministic-on", ()),
    ("shard-2", "mkldnn-on,deterministic-off", ()),
    # Default label; two xdist workers inside the job, gw0 pinned to the DEFAULT CPU level.
    (
        None,
        "mkldnn-off",
        ("--dist", "load", "--tx", "popen//env:ATEN_CPU_CAPABILITY=default", "--tx", "popen"),
    ),
)
NOISY = {"op": "plant::noisy", "device": "cpu", "dtype": "float32"}


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``pytest-backends`` script."""
    script = Path(sys.executable).with_name("pytest-backends")
    return subprocess.run([str(script), *args], capture_output=True, text=True, check=False)


def _module(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest_backends``."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_backends", *args],
        capture_output=True,
        text=True,
        check=False,
    )


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.grid_cells: list[str] = []
        self.failure_rows: list[list[str]] = []
        self._table = ""
        self._row: list[str] | None = None
        self._in_td = False
        self._in_pre = False  # the whole failure text, folded under the message

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self._in_pre = self._in_pre or tag == "pre"
        if tag == "table":
            self._table = a.get("class") or ""
        elif tag == "td" and self._table == "grid":
            self.grid_cells.append((a.get("class") or "").split(" ")[0])
        elif tag == "tr" and "failures" in self._table:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._in_td = True
            self._row.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._in_pre = False
        elif tag == "td":
            self._in_td = False
        elif tag == "tr" and self._row:
            self.failure_rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._in_td and self._row is not None and not self._in_pre:
            self._row[-1] += data


@pytest.mark.slow
def test_three_shards_merge_to_the_full_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The torch-ops digest gives the native harness's verdicts and needs no build cache,
    # which processes elsewhere on the machine may hold locked for minutes.
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_ci=SUITE)
    path = pytester.path

    full = pytester.runpytest_subprocess(
        *COMMON,
        "--backends-matrix",
        "--backends-report=full.json",
        "--backends-census=full-census.json",
        "--backends-baseline=full-baseline.json",
        "--backends-baseline-update",
        "--backends-label=full",
    )
    full.assert_outcomes(passed=9, failed=1, skipped=2)

    for i, (label, select, extra) in enumerate(SHARDS, 1):
        shard = pytester.runpytest_subprocess(
            *COMMON,
            *extra,
            f"--backends-config={select}",
            f"--backends-report=r{i}.json",
            f"--backends-census=c{i}.json",
            "--backends-baseline=baseline.json",
            "--backends-baseline-update",
            *([f"--backends-label={label}"] if label else []),
        )
        assert shard.ret in (0, 1), shard.stdout.str()
        if i == 2:
            # shard-2 saw plant::noisy come out identical; its update must keep shard-1's entry.
            assert _load(path / "baseline.json")["accepted"] == [NOISY]
            shard.stdout.fnmatch_lines(["baseline updated: *a run only adds ops*"])

    # The xdist shard's report names its environment (the controller's, plus the worker
    # fact that differs) and its default label.
    r3 = _load(path / "r3.json")
    assert r3["format"] == "pytest-backends-report"
    env = r3["environment"]
    assert env[0].startswith("torch 2.") and env[1].startswith("CPU capability: ")
    level = env[1].split()[2]
    if level == "DEFAULT":  # this CPU has no vector level above DEFAULT: nothing differs
        assert len(env) == 2
    else:
        assert env[2:] == [f"gw0: CPU capability: DEFAULT ({env[1].split()[3].strip('();')})"]
        assert r3["label"].split("/")[1] == level
    host = socket.gethostname().split(".", 1)[0]
    assert r3["label"].startswith(f"{host}/") and r3["label"].endswith("/cpu")
    assert _load(path / "c1.json")["label"] == "shard-1"

    merged = _cli(
        "merge",
        "--report",
        str(path / "merged.json"),
        "--html",
        str(path / "merged.html"),
        "--census",
        str(path / "merged-census.json"),
        *(str(path / f"r{i}.json") for i in (1, 2, 3)),
        *(str(path / f"c{i}.json") for i in (1, 2, 3)),
    )
    assert merged.returncode == 0, merged.stderr
    assert "warning" not in merged.stderr
    out = merged.stdout
    assert "merged 3 source(s):" in out and "[1] shard-1: 3 tests from" in out
    grid = out[out.index("config ") :].splitlines()
    assert grid[1].split() == ["mkldnn-on,deterministic-on", "3", "0", "0"]
    assert grid[5].split() == ["total", "9", "1", "2"]

    # Test by test, the merged report is the full run.
    def by_test(report: Any) -> dict[str, tuple[Any, ...]]:
        return {
            t["nodeid"]: (t["test"], t["config"], t["outcome"], t["message"], t["verify"])
            for t in report["tests"]
        }

    full_report, report = _load(path / "full.json"), _load(path / "merged.json")
    assert by_test(report) == by_test(full_report)
    assert len(report["tests"]) == 12
    assert report["grid_totals"] == full_report["grid_totals"]
    assert [c["id"] for c in report["configs"]] == [c["id"] for c in full_report["configs"]]
    assert [s["label"] for s in report["sources"]] == ["shard-1", "shard-2", r3["label"]]
    assert report["sources"][2]["settings"]["select"] == ["mkldnn-off"]
    assert report["sources"][2]["environment"] == r3["environment"]
    origin = {t["nodeid"]: t["sources"] for t in report["tests"]}
    assert origin["test_ci.py::test_mixed[mkldnn-on,deterministic-off]"] == ["shard-2"]
    assert origin["test_ci.py::test_matmul[mkldnn-off,deterministic-on]"] == [r3["label"]]
    assert report["conflicts"] == []

    # The merged census is the full run's census.
    census = _load(path / "merged-census.json")
    assert census["entries"] == _load(path / "full-census.json")["entries"]
    assert [s["label"] for s in census["sources"]] == ["shard-1", "shard-2", r3["label"]]

    # The HTML grid has every test x config cell and lists the failure.
    page = _Cells()
    page.feed((path / "merged.html").read_text(encoding="utf-8"))
    assert sorted(page.grid_cells) == sorted(t["outcome"] for t in full_report["tests"])
    assert page.failure_rows == [
        [
            "test_ci.py::test_mixed",
            "mkldnn-on,deterministic-off",
            "failed",
            "AssertionError: differs without deterministic mode",
            "shard-2",
        ]
    ]
    assert "needs oneDNN" in (path / "merged.html").read_text(encoding="utf-8")

    # The gate: new nondeterminism against the committed baseline fails the final job.
    (path / "committed.json").write_text(
        json.dumps({"format": "pytest-backends-baseline", "version": 1, "accepted": []})
    )
    check = _module(
        "baseline",
        "--check",
        "--census",
        str(path / "merged-census.json"),
        str(path / "committed.json"),
    )
    assert check.returncode == 1
    assert "NEW nondeterministic op, not in" in check.stdout
    assert "plant::noisy (cpu, float32)" in check.stdout
    # The same command in-process (the script and -m were run above).
    assert (
        main(
            [
                "baseline",
                "--check",
                "--census",
                str(path / "merged-census.json"),
                str(path / "baseline.json"),
            ]
        )
        == 0
    )

    # Pruning needs the whole suite: the merged census keeps the op, shard-2's alone drops it.
    capsys.readouterr()
    assert (
        main(
            ["baseline", "--census", str(path / "merged-census.json"), str(path / "baseline.json")]
        )
        == 0
    )
    assert "removed" not in capsys.readouterr().out
    assert _load(path / "baseline.json")["accepted"] == [NOISY]
    assert main(["baseline", "--census", str(path / "c2.json"), str(path / "baseline.json")]) == 0
    assert (
        "removed plant::noisy (cpu, float32): every key it accepts came out without "
        "nondeterminism: plant::noisy (cpu, float32) deterministic" in capsys.readouterr().out
    )
    assert _load(path / "baseline.json")["accepted"] == []
