"""What a CI log and its artifacts show of the matrix: test ids that read well and stay put
(serial, ``-n 2``, random order), re-running and selecting one config (``--lf``, ``-k``, a
pasted node id), and JUnit XML, JSON and HTML reports that agree with the terminal."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

# Imported before any pytester snapshot (see test_matrix_e2e.py).
import torch  # noqa: F401

SUITE = """
    import pytest
    import torch
    import torch.nn.functional as F

    @pytest.fixture
    def weight(backend_config):
        if backend_config.axes.get("deterministic") == "off":
            raise RuntimeError("weights need deterministic algorithms")
        return torch.ones(2, 1, 3, 3)

    @pytest.mark.backends("mkldnn")
    @pytest.mark.parametrize("size", [6, 8])
    def test_conv(backend_config, size):
        out = F.conv2d(torch.ones(1, 1, size, size), torch.ones(2, 1, 3, 3))
        assert out.shape == (1, 2, size - 2, size - 2)
        if size == 8:
            assert torch.backends.mkldnn.enabled, f"oneDNN off under {backend_config.id}"

    @pytest.mark.backends("deterministic")
    def test_batch_conv(weight):
        assert F.conv2d(torch.ones(16, 1, 8, 8), weight).shape == (16, 2, 6, 6)

    @pytest.mark.backends(sdpa=["math", "efficient"], device="cpu")
    def test_attention(backend_device):
        q = torch.randn(1, 2, 4, 8, device=backend_device)
        assert F.scaled_dot_product_attention(q, q, q).shape == q.shape

    def test_plain():
        assert torch.ones(2).sum().item() == 2
"""

# Node id -> (config id, outcome); the config ids as docs/reference/axes.rst spells them.
ITEMS = {
    "test_suite.py::test_conv[mkldnn-on-6]": ("mkldnn-on", "passed"),
    "test_suite.py::test_conv[mkldnn-on-8]": ("mkldnn-on", "passed"),
    "test_suite.py::test_conv[mkldnn-off-6]": ("mkldnn-off", "passed"),
    "test_suite.py::test_conv[mkldnn-off-8]": ("mkldnn-off", "failed"),
    "test_suite.py::test_batch_conv[deterministic-on]": ("deterministic-on", "passed"),
    "test_suite.py::test_batch_conv[deterministic-off]": ("deterministic-off", "error"),
    "test_suite.py::test_attention[sdpa-math,device-cpu]": ("sdpa-math,device-cpu", "passed"),
    "test_suite.py::test_attention[sdpa-efficient,device-cpu]": (
        "sdpa-efficient,device-cpu",
        "skipped",
    ),
}
CONFIG_ORDER = [
    "mkldnn-on",
    "mkldnn-off",
    "sdpa-math,device-cpu",
    "sdpa-efficient,device-cpu",
    "deterministic-on",
    "deterministic-off",
]
FAILURES = {
    "test_suite.py::test_conv[mkldnn-off-8]": "AssertionError: oneDNN off under mkldnn-off",
    "test_suite.py::test_batch_conv[deterministic-off]": (
        "RuntimeError: weights need deterministic algorithms"
    ),
}
SKIP = "sdpa-efficient only acts on CUDA kernels; this config runs on device-cpu"
JUNIT_OUTCOME = {"failure": "failed", "error": "error", "skipped": "skipped"}


def _junit(path: Path) -> dict[str, tuple[str | None, str]]:
    """``file::name`` -> (``backend_config`` property, outcome) of each JUnit XML test case."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome = next((JUNIT_OUTCOME[c.tag] for c in case if c.tag in JUNIT_OUTCOME), "passed")
        cases[f"{case.get('classname')}.py::{case.get('name')}"] = (
            props.get("backend_config"),
            outcome,
        )
    return cases


def _grid(result: pytest.RunResult) -> dict[str, dict[str, int]]:
    """The terminal's ``backends matrix`` grid: config -> column -> count."""
    start = next(i for i, x in enumerate(result.outlines) if re.match(r"=+ backends matrix =+$", x))
    lines = result.outlines[start + 1 :]
    header = lines[0].split()
    assert header[0] == "config", lines[:3]
    grid = {}
    for line in lines[1 : lines.index("")]:
        config, *counts = line.split()
        grid[config] = dict(zip(header[1:], map(int, counts)))
    return grid


class _Tables(HTMLParser):
    """The text of every cell of every ``<table>``, by the table's class."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[tuple[str, str]]]] = {}
        self._rows: list[list[tuple[str, str]]] | None = None
        self._cell: list[str] | None = None
        self._cls = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        cls = dict(attrs).get("class") or ""
        if tag == "table":
            self._rows = self.tables.setdefault(cls, [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th"):
            self._cell, self._cls = [], cls
        elif tag == "br" and self._cell is not None:
            self._cell.append(",")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._rows:
            self._rows[-1].append((self._cls, "".join(self._cell).strip()))
            self._cell = None
        elif tag == "table":
            self._rows = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _html(path: Path) -> dict[str, list[list[tuple[str, str]]]]:
    parser = _Tables()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser.tables


_SERIAL = re.compile(r"^(\S+\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED)")
_XDIST = re.compile(r"^\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|ERROR|SKIPPED) (\S+\.py::\S+)")


def _ran(result: pytest.RunResult) -> dict[str, str]:
    """Node id -> outcome of the ``-v`` progress lines (serial or xdist)."""
    ran = {}
    for line in result.outlines:
        if m := _SERIAL.match(line):
            ran[m.group(1)] = m.group(2).lower()
        elif m := _XDIST.match(line):
            ran[m.group(2)] = m.group(1).lower()
    return ran


@pytest.mark.slow
def test_ids_read_well_stay_put_and_every_report_agrees(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    base = ("-p", "no:randomly", "--backends-matrix")
    reports = ("--junitxml=a.xml", "--backends-report=a.json", "--backends-html=a.html")
    first = pytester.runpytest_subprocess(*base, "-v", "-rs", *reports)
    first.assert_outcomes(passed=6, failed=1, errors=1, skipped=1)
    out = first.stdout.str()
    assert "INTERNALERROR" not in out

    # Ids: the documented <axis>-<value> tokens, config before the test's own parameters,
    # plain ascii without spaces, so a CI log line can be pasted back into a shell.
    ran = _ran(first)
    assert set(ran) == {*ITEMS, "test_suite.py::test_plain"}
    assert all(nodeid.isascii() and not re.search(r"\s", nodeid) for nodeid in ran)
    assert {n: ran[n] for n in ITEMS} == {n: o for n, (_, o) in ITEMS.items()}

    # The terminal grid: one row per config, in axis order, counting each item once.
    grid = _grid(first)
    assert list(grid) == [*CONFIG_ORDER, "total"]
    for config in CONFIG_ORDER:
        outcomes = [o for c, o in ITEMS.values() if c == config]
        assert grid[config] == {k: outcomes.count(k) for k in grid[config]}, config
    summary = first.parseoutcomes()
    assert grid["total"]["passed"] + 1 == summary["passed"]  # + the unmarked test_plain
    for column, word in (("failed", "failed"), ("error", "errors"), ("skipped", "skipped")):
        assert grid["total"][column] == summary[word]
    for nodeid, message in FAILURES.items():
        assert f"    {nodeid} - {message}" in first.outlines
    assert f"  sdpa-efficient,device-cpu (1): {SKIP}" in first.outlines
    first.stdout.fnmatch_lines([f"SKIPPED [[]1] test_suite.py:*: {SKIP}"])

    # JUnit XML names each case by its id and carries the config as a property.
    junit = _junit(pytester.path / "a.xml")
    assert junit.pop("test_suite.py::test_plain") == (None, "passed")
    assert junit == ITEMS

    # JSON: the same configs, counts, failures and skip reasons as the terminal.
    report = json.loads((pytester.path / "a.json").read_text(encoding="utf-8"))
    rows = {row["id"]: row for row in report["configs"]}
    assert list(rows) == CONFIG_ORDER
    for config, row in rows.items():
        assert {k: row["counts"][k] for k in grid[config]} == grid[config]
    assert {k: report["grid_totals"][k] for k in grid["total"]} == grid["total"]
    # The totals are pytest's: the unmarked test counts too.
    assert report["totals"]["passed"] == summary["passed"] == grid["total"]["passed"] + 1
    failures = {f["nodeid"]: f["message"] for row in rows.values() for f in row["failures"]}
    assert failures == FAILURES
    assert rows["sdpa-efficient,device-cpu"]["skip_reasons"] == [SKIP]
    assert all(row["skip_reasons"] == [] for c, row in rows.items() if "efficient" not in c)
    tests = {t["nodeid"]: (t["config"], t["outcome"]) for t in report["tests"]}
    assert tests == ITEMS

    # HTML: the summary table, the tests x configs grid, failures and skips per config.
    tables = _html(pytester.path / "a.html")
    summary_rows = {r[0][1]: r[1:] for r in tables["summary"][1:]}
    assert list(summary_rows) == [*CONFIG_ORDER, "total"]
    columns = [text for _, text in tables["summary"][0][1:]]
    for config in [*CONFIG_ORDER, "total"]:
        counts = dict(zip(columns, (int(text) for _, text in summary_rows[config])))
        assert {k: counts[k] for k in grid[config]} == grid[config], config
    head, *body = tables["grid"]
    assert [text for _, text in head[1:]] == CONFIG_ORDER
    cells = {row[0][1]: [cls for cls, _ in row[1:]] for row in body}
    assert cells["test_suite.py::test_conv[8]"] == ["passed", "failed", *["absent"] * 4]
    assert cells["test_suite.py::test_batch_conv"] == [*["absent"] * 4, "passed", "error"]
    # The message cell shows the first line; the whole text unfolds under it.
    failed = {(r[0][1], r[1][1]): (r[2][1], r[3][1]) for r in tables["list failures"][1:]}
    # The message cell shows the first line; the whole failure text unfolds under it.
    for key, (outcome, text) in list(failed.items()):
        failed[key] = (outcome, next(m for m in FAILURES.values() if text.startswith(m)))
    assert failed == {
        ("test_suite.py::test_conv[8]", "mkldnn-off"): (
            "failed",
            FAILURES["test_suite.py::test_conv[mkldnn-off-8]"],
        ),
        ("test_suite.py::test_batch_conv", "deterministic-off"): (
            "error",
            FAILURES["test_suite.py::test_batch_conv[deterministic-off]"],
        ),
    }
    skips = [[text for _, text in r] for r in tables["list skips"][1:]]
    assert skips == [["sdpa-efficient,device-cpu", "1", SKIP]]

    # --lf re-runs exactly the failed configs, nothing else.
    again = pytester.runpytest_subprocess(*base, "-v", "--lf")
    again.assert_outcomes(failed=1, errors=1)
    assert _ran(again) == {
        "test_suite.py::test_conv[mkldnn-off-8]": "failed",
        "test_suite.py::test_batch_conv[deterministic-off]": "error",
    }

    # Two xdist workers in a random order: the same ids, outcomes and reports.
    xdist = pytester.runpytest_subprocess(
        "--randomly-seed=4321",
        "-p",
        "no:cacheprovider",
        "--backends-matrix",
        "-n",
        "2",
        "-v",
        "--junitxml=b.xml",
        "--backends-report=b.json",
    )
    xdist.assert_outcomes(passed=6, failed=1, errors=1, skipped=1)
    assert _ran(xdist) == ran
    assert _grid(xdist) == grid
    assert _junit(pytester.path / "b.xml") == _junit(pytester.path / "a.xml")
    second = json.loads((pytester.path / "b.json").read_text(encoding="utf-8"))
    assert second["configs"] == report["configs"]

    def strip(tests: list[dict]) -> list[dict]:
        return [{k: v for k, v in t.items() if k != "duration"} for t in tests]

    assert strip(second["tests"]) == strip(report["tests"])


def _collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest_inprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--co", "-q", *args
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    return [line for line in result.outlines if "::" in line and " " not in line]


def test_one_config_is_selected_by_its_id_or_its_node_id(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    assert _collected(pytester, "--backends-matrix", "-k", "mkldnn-off") == [
        "test_suite.py::test_conv[mkldnn-off-6]",
        "test_suite.py::test_conv[mkldnn-off-8]",
    ]
    assert _collected(pytester, "--backends-matrix", "-k", "mkldnn-on and 8") == [
        "test_suite.py::test_conv[mkldnn-on-8]"
    ]
    # A multi-axis id: its tokens with -k (pytest's -k grammar has no ',').
    one = ["test_suite.py::test_attention[sdpa-efficient,device-cpu]"]
    assert _collected(pytester, "--backends-matrix", "-k", "sdpa-efficient and device-cpu") == one
    # The node id pasted from a CI log selects that one item.
    assert _collected(pytester, "--backends-matrix=all", one[0]) == one


def test_a_test_with_an_invalid_marker_is_in_the_matrix_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_r="""
        import pytest

        @pytest.mark.backends("mkldnn")
        def test_ok():
            pass

        @pytest.mark.backends("mkldnm")
        def test_typo():
            pass
        """
    )
    result = pytester.runpytest_inprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--backends-matrix",
        "--backends-report=r.json",
    )
    result.assert_outcomes(passed=2, errors=1)
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    # The run failed: the report a CI job uploads must not look all green.
    assert report["totals"]["error"] == 1
    assert [t["outcome"] for t in report["tests"] if "test_typo" in t["nodeid"]] == ["error"]


def test_a_node_id_after_a_bare_matrix_option_gets_the_fix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_inprocess(
        "-p", "no:randomly", "--backends-matrix", "test_suite.py::test_conv[mkldnn-off-8]"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # As for a file path: say that the option took the node id as its value, and the fix.
    assert "--backends-matrix=VALUE" in result.stderr.str(), result.stderr.str()


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_config_node_id_the_run_does_not_have_is_a_usage_error(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    """A FAILED line pasted without ``--backends-matrix``: exit 4 and the fix, never "deselected".

    Also with pytest-xdist (the controller says it; a worker's error would crash it).
    """
    pytester.makepyfile(test_suite=SUITE)
    node = "test_suite.py::test_conv[mkldnn-off-8]"
    result = pytester.runpytest_subprocess("-p", "no:randomly", *workers, node)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert f"{node}: not in this run" in err, err
    assert "Add --backends-matrix" in err, err
    assert "INTERNALERROR" not in result.stdout.str() + err
    # A configuration the chosen axes do not make.
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", node, "--backends-matrix=deterministic"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(
        ["*test_suite.py::test_conv[[]mkldnn-off-8[]]: not in this run (its items: *"]
    )
    # The node id of an item the run has still selects it (that item fails by design).
    result = pytester.runpytest_subprocess("-p", "no:randomly", *workers, node, "--backends-matrix")
    result.assert_outcomes(failed=1)
