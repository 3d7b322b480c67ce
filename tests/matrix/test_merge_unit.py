"""Merging matrix reports: sources, conflicts, versions, bad inputs, the HTML grid."""

from __future__ import annotations

import json
from dataclasses import asdict
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_backends.__main__ import main
from pytest_backends._sources import MergeInputError, unique_label, version_warning
from pytest_backends.matrix.coverage import Coverage
from pytest_backends.matrix.environment import combine
from pytest_backends.matrix.merge import merge_reports, read_report
from pytest_backends.matrix.report import Result, build_rows, render_json


def _report(
    path: Path,
    label: str,
    results: list[Result],
    *,
    torch: str = "2.13.0+cpu",
    cuda: str | None = None,
    order: list[str] | None = None,
) -> Path:
    for r in results:
        r.sources = [label]
    rows = build_rows(results, order or sorted({r.config for r in results}))
    text = render_json(
        rows,
        results,
        environment=[f"torch {torch}", f"host {label}"],
        settings={"verify": "off", "select": []},
        header={"label": label, "torch": torch, "cuda": cuda},
        extra={"coverage": _coverage(results).to_plain()},
    )
    path.write_text(text)
    return path


def _coverage(results: list[Result]) -> Coverage:
    """What a run that reported ``results`` collected, ran and skipped."""
    return Coverage(
        {r.nodeid: r.config for r in results},
        {r.nodeid for r in results if r.outcome != "skipped"},
        {r.nodeid: r.message for r in results if r.outcome == "skipped"},
    )


def _r(test: str, config: str, outcome: str = "passed", message: str = "") -> Result:
    return Result(f"t.py::{test}[{config}]", f"t.py::{test}", config, outcome, message)


def test_disjoint_shards_merge_with_their_sources(tmp_path: Path) -> None:
    a = _report(
        tmp_path / "a.json", "linux", [_r("x", "mkldnn-on"), _r("y", "mkldnn-on", "failed", "boom")]
    )
    b = _report(
        tmp_path / "b.json",
        "gpu",
        [_r("x", "mkldnn-off"), _r("y", "mkldnn-off", "skipped", "no oneDNN")],
    )
    merged = merge_reports([a, b])
    assert merged.conflicts == [] and merged.warnings == []
    assert merged.order == ["mkldnn-on", "mkldnn-off"]
    data = json.loads(merged.to_json())
    assert [s["label"] for s in data["sources"]] == ["linux", "gpu"]
    assert data["sources"][0]["file"] == str(a) and data["sources"][1]["tests"] == 2
    assert data["sources"][1]["environment"] == ["torch 2.13.0+cpu", "host gpu"]
    assert data["environment"] == ["torch 2.13.0+cpu"]  # the lines every source shares
    assert {t["nodeid"]: t["sources"] for t in data["tests"]} == {
        "t.py::x[mkldnn-on]": ["linux"],
        "t.py::y[mkldnn-on]": ["linux"],
        "t.py::x[mkldnn-off]": ["gpu"],
        "t.py::y[mkldnn-off]": ["gpu"],
    }
    assert data["totals"]["passed"] == 2 and data["totals"]["failed"] == 1
    lines = merged.terminal_lines()
    assert lines[1].startswith("  [1] linux: 2 tests from")
    assert "    t.py::y[mkldnn-on] - boom" in lines


def test_different_outcomes_are_a_conflict_never_an_overwrite(tmp_path: Path) -> None:
    a = _report(tmp_path / "a.json", "ubuntu", [_r("x", "mkldnn-on"), _r("z", "mkldnn-on")])
    b = _report(
        tmp_path / "b.json",
        "macos",
        [_r("x", "mkldnn-on", "failed", "off by 1e-3"), _r("z", "mkldnn-on")],
    )
    merged = merge_reports([a, b])
    rows = {r.nodeid: r for r in merged.results}
    x = rows["t.py::x[mkldnn-on]"]
    assert x.outcome == "conflict" and x.sources == ["ubuntu", "macos"]
    assert x.message == "passed on ubuntu; failed on macos (off by 1e-3)"
    assert rows["t.py::z[mkldnn-on]"].sources == ["ubuntu", "macos"]  # agreement: one row
    assert merged.conflicts == [
        {
            "nodeid": "t.py::x[mkldnn-on]",
            "config": "mkldnn-on",
            "outcomes": [
                {"source": "ubuntu", "outcome": "passed", "message": ""},
                {"source": "macos", "outcome": "failed", "message": "off by 1e-3"},
            ],
        }
    ]
    grid = merged.terminal_lines()
    header = next(line for line in grid if line.startswith("config"))
    assert header.split() == ["config", "passed", "failed", "skipped", "conflict"]
    assert "    macos: failed - off by 1e-3" in grid

    # Merging the merged report again changes nothing: the conflict is split back.
    out = tmp_path / "merged.json"
    merged.write_json(out)
    again = merge_reports([out])
    assert [asdict(r) for r in again.results] == [asdict(r) for r in merged.results]
    assert again.conflicts == merged.conflicts
    assert [s["label"] for s in again.sources] == ["ubuntu", "macos"]


def test_same_labels_are_told_apart_and_versions_warned(tmp_path: Path) -> None:
    a = _report(tmp_path / "a.json", "ci", [_r("x", "mkldnn-on")])
    b = _report(
        tmp_path / "b.json", "ci", [_r("x", "mkldnn-off")], torch="2.11.0+cu130", cuda="13.0"
    )
    merged = merge_reports([a, b])
    assert [s["label"] for s in merged.sources] == ["ci", "ci (b.json)"]
    assert {r.config: r.sources for r in merged.results} == {
        "mkldnn-on": ["ci"],
        "mkldnn-off": ["ci (b.json)"],
    }
    (warning,) = merged.warnings
    assert "torch 2.13.0+cpu (CUDA none): ci (" in warning
    assert "torch 2.11.0+cu130 (CUDA 13.0): ci (b.json)" in warning


def test_config_order_keeps_each_inputs_order(tmp_path: Path) -> None:
    custom = ["fastpath-on", "fastpath-off"]  # an axis from a conftest hook
    a = _report(tmp_path / "a.json", "a", [_r("x", c) for c in ["fastpath-off"]], order=custom)
    b = _report(tmp_path / "b.json", "b", [_r("x", "fastpath-on")], order=custom)
    c = _report(
        tmp_path / "c.json",
        "c",
        [_r("y", "mkldnn-off"), _r("y", "mkldnn-on")],
        order=["mkldnn-on", "mkldnn-off"],
    )
    assert merge_reports([c, a, b]).order == ["mkldnn-on", "mkldnn-off", *custom]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"format": "pytest-backends-census", "version": 1, "entries": []}',
            "is a determinism census (merge it with --census OUT.json), not a matrix report",
        ),
        (
            '{"format": "pytest-backends-baseline", "version": 1, "accepted": []}',
            "is a determinism baseline",
        ),
        ('{"format": "junit"}', "'format' must be 'pytest-backends-report', got 'junit'"),
        (
            '{"format": "pytest-backends-report", "version": 7, "tests": []}',
            "format version 7 is newer",
        ),
        (
            '{"format": "pytest-backends-report", "version": 1, "tests": [{"nodeid": "a"}]}',
            r"tests[0]: 'config' is missing",
        ),
        (
            '{"format": "pytest-backends-report", "version": 1, "tests": '
            '[{"nodeid": "a", "config": "c", "outcome": "great"}]}',
            "'outcome' must be one of",
        ),
        ("[1, 2]", "expected a JSON object at the top level, got list"),
        ('{"format": ', "is not valid JSON"),
        ("[" * 3000 + "]" * 3000, "nested too deeply"),
        ('{"format": "pytest-backends-report", "x": NaN}', "is not valid JSON"),
    ],
)
def test_bad_inputs_are_errors_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(MergeInputError) as info:
        read_report(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_cli_errors_and_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = tmp_path / "artifacts"
    (shards / "job-1").mkdir(parents=True)
    (shards / "job-2").mkdir()
    _report(shards / "job-1" / "report.json", "one", [_r("x", "mkldnn-on")])
    _report(shards / "job-2" / "report.json", "two", [_r("x", "mkldnn-off")])
    (shards / "job-2" / "notes.json").write_text('{"unrelated": true}')  # skipped in a dir
    (shards / "job-2" / "broken.json").write_text('{"format": ')
    census = tmp_path / "census.json"
    census.write_text('{"format": "pytest-backends-census", "version": 1, "entries": []}')

    assert main(["merge", "--report", str(tmp_path / "m.json"), str(shards)]) == 0
    out, err = capsys.readouterr()
    assert "merged 2 source(s):" in out and "report written to" in out
    assert "skipped " + str(shards / "job-2" / "broken.json") + ": input file" in err
    assert len(json.loads((tmp_path / "m.json").read_text())["tests"]) == 2

    assert main(["merge", "--report", str(tmp_path / "m.json"), str(census)]) == 1
    err = capsys.readouterr().err
    assert f"error: {census} is a census; to merge it, name the output with --census" in err
    assert main(["merge", str(census)]) == 2
    assert "name an output with --report, --html or --census" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "pytest-backends-report", "version": 1, "tests": 3}')
    assert main(["merge", "--report", str(tmp_path / "n.json"), str(bad)]) == 1
    assert f"report file {bad}: 'tests' must be a list" in capsys.readouterr().err
    assert not (tmp_path / "n.json").exists()


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.cells: list[tuple[str, str]] = []
        self.badges: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self.stack.append(a.get("class") or "")
        if tag == "td" and self.stack and self.stack[-1] == "grid":
            self.cells.append((a.get("class") or "", a.get("title") or ""))
        if tag == "span" and a.get("class") == "src":
            self.badges.append("")

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.badges and self.badges[-1] == "":
            self.badges[-1] = data


def test_html_lists_failures_skips_and_sources(tmp_path: Path) -> None:
    a = _report(
        tmp_path / "a.json",
        "cpu-avx2",
        [
            _r("x", "mkldnn-on"),
            _r("y", "mkldnn-on", "failed", "AssertionError: <x> != 1"),
            _r("w", "mkldnn-on", "skipped", "needs CUDA"),
        ],
    )
    b = _report(
        tmp_path / "b.json",
        "cpu-avx512",
        [
            _r("x", "mkldnn-off", "error", "fixture broke"),
            _r("y", "mkldnn-off"),
            _r("w", "mkldnn-off", "skipped", "needs CUDA"),
        ],
    )
    c = _report(tmp_path / "c.json", "again", [_r("x", "mkldnn-on", "failed", "flaky")])
    merged = merge_reports([a, b, c])
    page = _Page()
    page.feed(merged.to_html())
    text = "".join(page.text)
    outcomes = sorted(cls.split()[0] for cls, _ in page.cells if cls != "absent")
    assert outcomes == ["conflict", "error", "failed", "passed", "skipped", "skipped"]
    assert page.badges == ["1", "2", "1,3", "2", "1", "2"]  # tests w, x, y; configs on, off
    assert "Sources" in text and "cpu-avx512" in text and str(b) in text
    # Failures, with their message and source, under the grid; the conflict among them.
    failures = text[text.index("Failures (3)") : text.index("Skip reasons")]
    assert "AssertionError: <x> != 1" in failures and "fixture broke" in failures
    assert "passed on cpu-avx2; failed on again (flaky)" in failures
    skips = text[text.index("Skip reasons per configuration") :]
    assert skips.count("needs CUDA") == 2 and "mkldnn-off" in skips


def test_worker_environment_adds_only_what_differs() -> None:
    controller = ["torch 2.13.0; CUDA: no", "CPU capability: AVX512 (x86_64); MKL: yes"]
    workers: dict[str, Any] = {
        "gw10": ["torch 2.13.0; CUDA: no", "CPU capability: AVX2 (x86_64); MKL: yes"],
        "gw1": ["torch 2.13.0; CUDA: no", "CPU capability: AVX2 (x86_64); MKL: yes"],
        "gw0": controller,
    }
    assert combine(controller, workers) == [*controller, "gw1, gw10: CPU capability: AVX2 (x86_64)"]
    assert combine(controller, {}) == controller


def test_inputs_that_disagree_on_the_order_keep_first_appearance(tmp_path: Path) -> None:
    a = _report(tmp_path / "a.json", "a", [_r("x", "p-1"), _r("x", "p-2")], order=["p-1", "p-2"])
    b = _report(tmp_path / "b.json", "b", [_r("y", "p-1"), _r("y", "p-2")], order=["p-2", "p-1"])
    assert merge_reports([a, b]).order == ["p-1", "p-2"]
    assert merge_reports([b, a]).order == ["p-2", "p-1"]


def test_unique_labels_and_version_agreement() -> None:
    taken: set[str] = set()
    assert [unique_label("ci", taken, f"/x/{n}/report.json") for n in (1, 2, 3)] == [
        "ci",
        "ci (report.json)",
        "ci (report.json #2)",
    ]
    same = [
        {"label": "a", "file": "a.json", "torch": "2.13.0", "cuda": None},
        {"label": "b", "file": "b.json", "torch": "2.13.0", "cuda": None},
    ]
    assert version_warning(same, "reports") is None
    assert version_warning(
        [*same, {"label": "c", "file": "c.json", "torch": "2.13.0", "cuda": "12.8"}], "reports"
    ) == (
        "the reports come from different torch/CUDA versions (torch 2.13.0 (CUDA none): "
        "a (a.json), b (b.json); torch 2.13.0 (CUDA 12.8): c (c.json)); they are merged, "
        "but results that differ between them may be version differences"
    )


def test_reports_without_a_format_name_still_merge(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    data = json.loads(_report(old, "x", [_r("x", "mkldnn-on", "failed", "no")]).read_text())
    for key in ("format", "label", "torch", "cuda"):
        del data[key]
    for row in data["tests"]:
        del row["sources"]
    old.write_text(json.dumps(data))
    merged = merge_reports([old])
    assert merged.sources[0]["label"] == "old" and merged.sources[0]["torch"] is None
    assert [(r.outcome, r.message, r.sources) for r in merged.results] == [
        ("failed", "no", ["old"])
    ]


def test_a_skip_yields_to_a_source_that_ran_the_item(tmp_path: Path) -> None:
    cpu = _report(
        tmp_path / "cpu.json",
        "cpu",
        [_r("x", "device-cuda", "skipped", "needs CUDA"), _r("x", "device-cpu")],
    )
    gpu = _report(tmp_path / "gpu.json", "gpu", [_r("x", "device-cuda"), _r("x", "device-cpu")])
    merged = merge_reports([cpu, gpu])
    rows = {r.config: r for r in merged.results}
    assert (rows["device-cuda"].outcome, rows["device-cuda"].sources) == ("passed", ["gpu"])
    assert rows["device-cpu"].sources == ["cpu", "gpu"]
    assert merged.conflicts == []
    assert merged.skipped_elsewhere == [
        {
            "nodeid": "t.py::x[device-cuda]",
            "config": "device-cuda",
            "outcomes": [{"source": "cpu", "outcome": "skipped", "message": "needs CUDA"}],
        }
    ]
    assert "1 item(s) ran in some sources and were skipped in others" in "\n".join(
        merged.terminal_lines()
    )
    out = tmp_path / "merged.json"
    merged.write_json(out)
    again = merge_reports([out])
    assert again.skipped_elsewhere == merged.skipped_elsewhere
    assert [asdict(r) for r in again.results] == [asdict(r) for r in merged.results]
    # Skipped everywhere stays skipped, with the first source's reason.
    both = merge_reports(
        [
            cpu,
            _report(tmp_path / "cpu2.json", "cpu2", [_r("x", "device-cuda", "skipped", "no GPU")]),
        ]
    )
    cuda = next(r for r in both.results if r.config == "device-cuda")
    assert (cuda.outcome, cuda.message, cuda.sources) == ("skipped", "needs CUDA", ["cpu", "cpu2"])


def test_what_ran_in_no_job_is_on_the_merged_page_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gap that fails ``merge --strict`` is on the page and in the JSON, not only on stderr."""
    paths = []
    for label, config in (("linux", "mkldnn-on"), ("macos", "mkldnn-off")):
        path = _report(tmp_path / f"{label}.json", label, [_r("x", config)])
        data = json.loads(path.read_text())
        # both jobs collected test_gone and deselected it (-k)
        data["coverage"]["collected"]["t.py::test_gone"] = ""
        path.write_text(json.dumps(data))
        paths.append(str(path))
    out_json, out_html = tmp_path / "merged.json", tmp_path / "merged.html"
    code = main(["merge", "--strict", "--report", str(out_json), "--html", str(out_html), *paths])
    assert code == 1
    assert "t.py::test_gone (deselected in every job)" in capsys.readouterr().err
    [warning] = json.loads(out_json.read_text())["warnings"]
    assert "1 collected test(s) ran in no job" in warning
    assert "t.py::test_gone (deselected in every job)" in warning
    page = out_html.read_text()
    assert 'id="warnings"' in page and "t.py::test_gone (deselected in every job)" in page
    # --strict failed the merge: the page and the JSON say so, not only the exit code
    assert 'id="merge-failed"' in page and "merge --strict failed" in page
    assert json.loads(out_json.read_text())["merge_errors"]
    # merging the merged report again keeps the gap, and only it
    again = merge_reports([out_json])
    assert again.all_warnings() == [warning]
    # without --strict the gap is a warning only
    code = main(["merge", "--report", str(out_json), "--html", str(out_html), *paths])
    assert code == 0
    assert 'id="merge-failed"' not in out_html.read_text()
    assert json.loads(out_json.read_text())["merge_errors"] == []
