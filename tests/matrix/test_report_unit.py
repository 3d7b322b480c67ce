"""The report model and its renderers."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from pytest_backends.matrix.report import (
    Result,
    base_test_id,
    build_rows,
    render_json,
    render_terminal,
)
from pytest_backends.matrix.report_html import render_html


@pytest.mark.parametrize(
    ("nodeid", "config", "expected"),
    [
        ("t.py::test_x[mkldnn-off]", "mkldnn-off", "t.py::test_x"),
        ("t.py::test_x[3-mkldnn-off]", "mkldnn-off", "t.py::test_x[3]"),
        ("t.py::test_x[mkldnn-off-a]", "mkldnn-off", "t.py::test_x[a]"),
        ("t.py::test_x[a-cudnn-on,sdpa-math-b]", "cudnn-on,sdpa-math", "t.py::test_x[a-b]"),
        ("t.py::C::test_x", "default", "t.py::C::test_x"),
        ("t[1].py::test_x[mkldnn-on]", "mkldnn-on", "t[1].py::test_x"),
    ],
)
def test_base_test_id(nodeid: str, config: str, expected: str) -> None:
    assert base_test_id(nodeid, config) == expected


RESULTS = [
    Result(
        "t.py::a[mkldnn-on]",
        "t.py::a",
        "mkldnn-on",
        "passed",
        verify="not exercised",
        verify_detail="mkldnn-on not exercised: oneDNN kernels never ran; ...",
    ),
    Result("t.py::a[mkldnn-off]", "t.py::a", "mkldnn-off", "failed", "AssertionError: x"),
    Result("t.py::b[mkldnn-off]", "t.py::b", "mkldnn-off", "skipped", "needs <CUDA>"),
    Result(
        "t.py::c[<script>alert(1)</script>-mkldnn-on]",
        "t.py::c[<script>alert(1)</script>]",
        "mkldnn-on",
        "error",
        "boom & <b>",
    ),
]


def test_rows_count_outcomes_per_config() -> None:
    rows = build_rows(RESULTS, ["mkldnn-on", "mkldnn-off"])
    assert [r.config for r in rows] == ["mkldnn-on", "mkldnn-off"]
    assert rows[0].counts["passed"] == 1 and rows[0].counts["error"] == 1
    assert rows[0].not_exercised == 1
    assert rows[1].counts["failed"] == 1 and rows[1].counts["skipped"] == 1
    assert rows[1].skip_reasons == ["needs <CUDA>"]
    lines = render_terminal(rows, verify=True)
    assert lines[0].split() == [
        "config",
        "passed",
        "failed",
        "error",
        "skipped",
        "not",
        "exercised",
    ]
    assert lines[1].split() == ["mkldnn-on", "1", "0", "1", "0", "1"]
    assert lines[3].split() == ["total", "1", "1", "1", "1", "1"]
    assert "    t.py::a[mkldnn-off] - AssertionError: x" in lines


def test_json_agrees_with_the_rows() -> None:
    rows = build_rows(RESULTS, ["mkldnn-on", "mkldnn-off"])
    data = json.loads(render_json(rows, RESULTS, environment=["torch x"], settings={}))
    assert [c["id"] for c in data["configs"]] == ["mkldnn-on", "mkldnn-off"]
    assert data["configs"][1]["counts"]["failed"] == 1
    assert data["totals"]["not_exercised"] == 1
    assert len(data["tests"]) == 4


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.cells: list[tuple[str, str]] = []
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "td":
            a = dict(attrs)
            self.cells.append((a.get("class") or "", a.get("title") or ""))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)


def test_html_is_self_contained_and_escapes_everything() -> None:
    rows = build_rows(RESULTS, ["mkldnn-on", "mkldnn-off"])
    page = render_html(rows, RESULTS, environment=["torch <2>"], verify=True)
    assert "<script>" not in page and "&lt;script&gt;" in page
    grid = page.partition('<h2 id="failures">')[0]
    parser = _Collect()
    parser.feed(grid)
    assert "script" not in parser.tags and "link" not in parser.tags
    assert "http" not in page
    titles = [t for _, t in parser.cells]
    assert any("boom & <b>" in t for t in titles)  # unescaped back by the parser
    classes = [c for c, _ in parser.cells if c and c != "absent"]
    assert sorted(classes) == ["error", "failed", "passed unexercised", "skipped"]
    assert "t.py::c[<script>alert(1)</script>]" in parser.texts


def test_html_lists_failures_and_skip_reasons_under_the_grid() -> None:
    rows = build_rows(RESULTS, ["mkldnn-on", "mkldnn-off"])
    page = render_html(rows, RESULTS, environment=[], verify=False)
    lists = page[page.index('<h2 id="failures">') :]
    parser = _Collect()
    parser.feed(lists)
    text = [t for t in parser.texts if t.strip()]
    failures = text[text.index("Failures (2)") : text.index("Skip reasons per configuration")]
    assert failures[:4] == ["Failures (2)", "test", "config", "outcome"]
    assert failures[5:9] == ["t.py::a", "mkldnn-off", "failed", "AssertionError: x"]
    assert failures[9:13] == [
        "t.py::c[<script>alert(1)</script>]",
        "mkldnn-on",
        "error",
        "boom & <b>",
    ]
    skips = text[text.index("Skip reasons per configuration") :]
    assert skips[-3:] == ["mkldnn-off", "1", "needs <CUDA>"]
    assert "<script>" not in lists and "source" not in failures  # one source: no column


def test_json_names_its_format_and_header() -> None:
    rows = build_rows(RESULTS, ["mkldnn-on", "mkldnn-off"])
    data = json.loads(
        render_json(
            rows,
            RESULTS,
            environment=[],
            settings={},
            header={"label": "ci-linux", "torch": "2.13.0"},
        )
    )
    assert list(data)[:5] == ["format", "version", "label", "torch", "environment"]
    assert data["format"] == "pytest-backends-report" and data["label"] == "ci-linux"
    assert data["totals"]["conflict"] == 0
