"""``pytest-backends merge`` validates before it writes, drops nothing, and keeps any text."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_backends.__main__ import main

REPORT: dict[str, Any] = {
    "format": "pytest-backends-report",
    "version": 1,
    "label": "job",
    "environment": ["torch 2.13.0+cpu"],
    "settings": {},
    "configs": [{"id": "mkldnn-on", "counts": {"passed": 1}}],
    "tests": [
        {
            "nodeid": "t.py::x[mkldnn-on]",
            "test": "t.py::x",
            "config": "mkldnn-on",
            "outcome": "passed",
        }
    ],
}

CENSUS: dict[str, Any] = {
    "format": "pytest-backends-census",
    "version": 1,
    "torch": "2.13.0+cpu",
    "cuda": None,
    "runs": 2,
    "entries": [
        {
            "op": "aten::add",
            "device": "cpu",
            "dtype": "float32",
            "verdict": "nondeterministic",
            "observations": {"nondeterministic": 1},
            "tests": ["t.py::a"],
            "nondeterministic_in": ["t.py::a"],
        }
    ],
    "not_checked": {"t.py::b": "a generator was not proven equal"},
    "boundary": {"t.py::c": ["custom op checked at its boundary"]},
}


def _write(path: Path, data: dict[str, Any], **changes: Any) -> Path:
    data = copy.deepcopy(data)
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


def _merge(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["merge", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"settings": ["a"]}, "'settings' must be an object"),
        ({"environment": 5}, "'environment' must be a list of strings"),
        ({"label": 5}, "'label' must be a string"),
        ({"configs": "x"}, "'configs' must be a list"),
        ({"configs": [{"id": "mkldnn-on", "counts": {"passed": -1}}]}, "configs[0].counts"),
        ({"sources": [{"label": "s", "tests": -3}]}, "sources[0].tests must be a non-negative"),
        ({"sources": [{"label": "s", "environment": 3}]}, "sources[0]: 'environment'"),
        (
            {
                "tests": [dict(REPORT["tests"][0], outcome="conflict", sources=["a", "b"])],
                "conflicts": [{"nodeid": "t.py::x[mkldnn-on]", "outcomes": []}],
            },
            "conflicts[0] must name a 'nodeid' and list at least one",
        ),
        ({"coverage": {"collected": ["t.py::x"]}}, "'coverage.collected' must map"),
    ],
)
def test_a_bad_field_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], field: str
) -> None:
    good = _write(tmp_path / "good.json", REPORT)
    bad = _write(tmp_path / "bad.json", REPORT, **changes)
    out = tmp_path / "out"
    code, err = _merge(
        capsys, "--report", f"{out}.json", "--html", f"{out}.html", str(good), str(bad)
    )
    assert code == 1
    assert f"report file {bad}: " in err and field in err, err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("out.*"))


def test_a_bad_census_writes_no_report_either(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _write(tmp_path / "r.json", REPORT)
    census = _write(
        tmp_path / "c.json",
        CENSUS,
        entries=[dict(CENSUS["entries"][0], observations={"nondeterministic": -1})],
    )
    code, err = _merge(
        capsys,
        "--report",
        str(tmp_path / "o.json"),
        "--census",
        str(tmp_path / "oc.json"),
        str(report),
        str(census),
    )
    assert code == 1
    assert "entries[0].observations.nondeterministic must not be negative" in err
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "oc.json").exists()


def test_outputs_that_are_inputs_or_each_other_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _write(tmp_path / "r.json", REPORT)
    before = report.read_text()
    code, err = _merge(capsys, "--report", str(report), str(report))
    assert code == 1 and "is also an input" in err
    assert report.read_text() == before
    same = tmp_path / "same"
    code, err = _merge(capsys, "--report", str(same), "--html", str(same), str(report))
    assert code == 1 and "--html" in err and "is also the --report output" in err
    assert not same.exists()


def test_a_file_reached_twice_is_merged_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    a = _write(jobs / "a.json", REPORT, label="a")
    b = _write(
        jobs / "b.json",
        REPORT,
        label="b",
        tests=[dict(REPORT["tests"][0], nodeid="t.py::y[mkldnn-on]", test="t.py::y")],
    )
    out = tmp_path / "m.json"
    code, err = _merge(capsys, "--report", str(out), str(jobs), str(a), str(jobs / "." / "b.json"))
    assert code == 0, err
    assert err.count("is given twice; merged once") == 2, err
    merged = json.loads(out.read_text())
    assert sorted(t["nodeid"] for t in merged["tests"]) == [
        "t.py::x[mkldnn-on]",
        "t.py::y[mkldnn-on]",
    ]
    assert sorted(src["label"] for src in merged["sources"]) == ["a", "b"]
    code, err = _merge(capsys, "--report", str(out), str(b), str(b))
    assert code == 0 and "merged once" in err
    assert [src["label"] for src in json.loads(out.read_text())["sources"]] == ["b"]


def test_census_merge_keeps_not_checked_boundary_and_unknown_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write(tmp_path / "a.json", CENSUS, label="a", future_field={"t.py::a": 1})
    b = _write(
        tmp_path / "b.json",
        CENSUS,
        label="b",
        not_checked={"t.py::d": "another reason"},
        boundary={"t.py::c": ["a second note"]},
        future_field={"t.py::z": 2},
    )
    code, err = _merge(capsys, "--census", str(tmp_path / "m.json"), str(a), str(b))
    assert code == 0, err
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["not_checked"] == {
        "t.py::b": "a generator was not proven equal",
        "t.py::d": "another reason",
    }
    assert merged["boundary"] == {"t.py::c": ["custom op checked at its boundary", "a second note"]}
    assert merged["future_field"] == {"t.py::a": 1, "t.py::z": 2}
    # Merging the merged census again (staged merges) keeps them too.
    code, err = _merge(capsys, "--census", str(tmp_path / "m2.json"), str(tmp_path / "m.json"))
    assert code == 0, err
    again = json.loads((tmp_path / "m2.json").read_text())
    assert again["not_checked"] == merged["not_checked"]
    assert again["boundary"] == merged["boundary"]
    assert again["entries"][0]["observations"] == {"nondeterministic": 2}


def test_a_surrogate_escaped_message_survives_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = dict(REPORT["tests"][0], outcome="skipped", message="no file \udcff.bin")
    report = _write(tmp_path / "r.json", REPORT, tests=[row])
    code, err = _merge(
        capsys,
        "--report",
        str(tmp_path / "o.json"),
        "--html",
        str(tmp_path / "o.html"),
        str(report),
    )
    assert code == 0, err
    assert "no file \\udcff.bin" in (tmp_path / "o.html").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "o.json").read_text())["tests"][0]["message"] == (
        "no file \udcff.bin"
    )


def test_a_surrogate_escaped_skip_reason_survives_the_html_report(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_s="""
        import os

        import pytest

        @pytest.mark.backends("mkldnn")
        def test_missing():
            pytest.skip("no file " + os.fsdecode(b"\\xff.bin"))
        """
    )
    # Bytes: the terminal prints the reason as the undecodable byte it came from.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "--backends-matrix",
            "--backends-html=m.html",
            "--backends-report=m.json",
        ],
        cwd=pytester.path,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode(errors="replace")
    assert b"2 skipped" in done.stdout
    html = (pytester.path / "m.html").read_text(encoding="utf-8")
    assert "no file \\udcff.bin" in html
    report = json.loads((pytester.path / "m.json").read_text())
    assert {t["message"] for t in report["tests"]} == {"no file \udcff.bin"}
