"""Merging censuses of several jobs, and refreshing a baseline from the whole suite's census."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_backends.__main__ import main
from pytest_backends.determinism.baseline_refresh import refresh
from pytest_backends.determinism.census import (
    Baseline,
    BaselineEntry,
    Census,
    CensusFileError,
    Key,
    Versions,
    read_census,
)
from pytest_backends.determinism.census_merge import merge_censuses
from pytest_backends.label import check_label
from pytest_backends.matrix.availability import default_label

CPU = Versions("2.13.0+cpu", None)
NOISY: Key = ("plant::noisy", "cpu", "float32")
ADD: Key = ("aten::add", "cpu", "float32")
PUT: Key = ("aten::put_", "cpu", "float32")
MM: Key = ("aten::mm", "cpu", "float32")
SCATTER: Key = ("aten::scatter_add_", "cuda", "float32")


def _write(
    path: Path,
    label: str | None,
    tests: dict[str, dict[Key, str]],
    versions: Versions = CPU,
    runs: int = 5,
) -> Path:
    census = Census()
    for nodeid, verdicts in tests.items():
        census.add_test(nodeid, verdicts)
    census.write(path, runs=runs, versions=versions, label=label)
    return path


def test_merge_follows_the_strongest_verdict_and_joins_tests(tmp_path: Path) -> None:
    a = _write(
        tmp_path / "a.json",
        "cpu",
        {
            "t.py::a": {
                NOISY: "deterministic",
                ADD: "inconclusive",
                PUT: "raises_under_deterministic_mode",
            },
            "t.py::b": {MM: "inconclusive"},
        },
    )
    b = _write(
        tmp_path / "b.json",
        "gpu",
        {
            "t.py::c": {
                NOISY: "nondeterministic",
                ADD: "deterministic",
                PUT: "deterministic",
                MM: "inconclusive",
            },
        },
        runs=3,
    )
    merged = merge_censuses([a, b])
    census = merged.census
    assert census.verdict(NOISY) == "nondeterministic"  # nondeterministic anywhere wins
    assert census.verdict(PUT) == "raises_under_deterministic_mode"  # kept over deterministic
    assert census.verdict(ADD) == "deterministic"  # one conclusive source is enough
    assert census.verdict(MM) == "inconclusive"  # no source settled it
    rows = {r["op"]: r for r in census.to_data()}
    assert rows["plant::noisy"]["tests"] == ["t.py::a", "t.py::c"]
    assert rows["plant::noisy"]["nondeterministic_in"] == ["t.py::c"]
    assert rows["aten::put_"]["observations"] == {
        "raises_under_deterministic_mode": 1,
        "deterministic": 1,
    }
    assert merged.warnings == [] and merged.runs == 3

    out = tmp_path / "merged.json"
    merged.write(out)
    data = json.loads(out.read_text())
    assert data["label"] == "merged" and data["runs"] == 3
    assert [(s["label"], s["file"], s["entries"]) for s in data["sources"]] == [
        ("cpu", str(a), 4),
        ("gpu", str(b), 4),
    ]
    # A merged census merges again to itself, with the same sources.
    again = merge_censuses([out])
    assert again.census.to_data() == census.to_data()
    assert [s["label"] for s in again.sources] == ["cpu", "gpu"]
    lines = merged.summary_lines()
    assert "  [2] gpu: 4 op keys from " + str(b) + " (torch 2.13.0+cpu, 3 runs)" in lines
    assert "4 op keys; 1 nondeterministic" in lines


def test_versions_warn_and_wrong_files_name_themselves(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.json", "x", {"t::a": {NOISY: "deterministic"}})
    b = _write(
        tmp_path / "b.json",
        "x",
        {"t::b": {SCATTER: "nondeterministic"}},
        versions=Versions("2.11.0+cu130", "13.0"),
    )
    merged = merge_censuses([a, b])
    (warning,) = merged.warnings
    assert (
        "torch 2.13.0+cpu (CUDA none): x (" in warning
        and "torch 2.11.0+cu130 (CUDA 13.0)" in warning
    )
    assert [s["label"] for s in merged.sources] == ["x", "x (b.json)"]
    assert merged.versions == Versions("2.13.0+cpu, 2.11.0+cu130", "13.0")

    report = tmp_path / "report.json"
    report.write_text('{"format": "pytest-backends-report", "version": 1, "tests": []}')
    with pytest.raises(
        CensusFileError,
        match=r"report\.json: 'format' must be "
        r"'pytest-backends-census'.*\(it is a matrix report file\)",
    ):
        merge_censuses([a, report])


def test_refresh_removes_only_what_the_census_shows_fixed() -> None:
    baseline = Baseline(
        (
            BaselineEntry("plant::noisy", "cpu", None, "planted"),
            BaselineEntry("aten::add", "cpu", "float32", "fixed upstream"),
            BaselineEntry("aten::scatter_add_", "cuda", None, "GPU job"),
            BaselineEntry("aten::mm", "cpu", None),
        ),
        CPU,
    )
    census = Census()
    census.add_test("t::a", {NOISY: "nondeterministic", ADD: "deterministic", MM: "inconclusive"})
    census.add_test("t::b", {NOISY: "deterministic", PUT: "nondeterministic"})
    result = refresh(baseline, census)
    assert [(e.op, e.note) for e in result.baseline.entries] == [
        ("aten::mm", None),
        ("aten::put_", None),
        ("aten::scatter_add_", "GPU job"),
        ("plant::noisy", "planted"),
    ]
    assert result.lines() == [
        "added aten::put_ (cpu, float32): nondeterministic in t::b",
        "removed aten::add (cpu, float32): every key it accepts came out without "
        "nondeterminism: aten::add (cpu, float32) deterministic",
        "kept aten::scatter_add_ (cuda, every dtype): no test in the census hit it",
        "kept aten::mm (cpu, every dtype): the census has only inconclusive verdicts for it",
    ]


def test_baseline_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    census = _write(
        tmp_path / "c.json", "all", {"t::a": {NOISY: "nondeterministic", ADD: "deterministic"}}
    )
    path = tmp_path / "baseline.json"
    # --check on a new baseline: the op is new, nothing is written.
    path.write_text(
        '{"format": "pytest-backends-baseline", "version": 1, "accepted": '
        '[{"op": "aten::add", "device": "cpu"}]}'
    )
    assert main(["baseline", "--check", "--census", str(census), str(path)]) == 1
    out = capsys.readouterr().out
    assert (
        "NEW nondeterministic op, not in" in out and "plant::noisy (cpu, float32); in t::a" in out
    )
    assert "could be removed: aten::add (cpu): every key it accepts" in out
    assert Baseline.load(path).entries == (BaselineEntry("aten::add", "cpu"),)
    # The refresh writes it, stamped with the census's versions.
    assert main(["baseline", "--census", str(census), str(path)]) == 0
    out = capsys.readouterr().out
    assert "added plant::noisy (cpu, float32): nondeterministic in t::a" in out
    assert "removed aten::add (cpu, every dtype)" in out
    loaded = Baseline.load(path)
    assert [e.op for e in loaded.entries] == ["plant::noisy"] and loaded.versions == CPU
    assert main(["baseline", "--check", "--census", str(census), str(path)]) == 0
    # A missing baseline is created; a bad census is an error naming it.
    assert main(["baseline", "--census", str(census), str(tmp_path / "new.json")]) == 0
    assert read_census(census)[1].verdict(NOISY) == "nondeterministic"
    capsys.readouterr()
    assert main(["baseline", "--census", str(path), str(tmp_path / "x.json")]) == 1
    assert f"census file {path}: 'format' must be" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("  ", "got an empty value"),
        ("a\nb", "one line of printable characters"),
        ("x" * 201, "use at most 200"),
    ],
)
def test_bad_labels_are_usage_errors(value: str, message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message):
        check_label(value, "--backends-label")
    assert check_label(" ci / linux-avx2 ", "x") == "ci / linux-avx2"


def test_bad_label_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = pytester.runpytest("-p", "no:randomly", "--backends-label= ")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--backends-label= was given an empty value*"])
    pytester.makeini("[pytest]\nbackends_label = a\tb\n")
    result = pytester.runpytest("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini option backends_label: the label must be one line*"])


def test_default_label_names_host_cpu_level_and_gpu() -> None:
    import socket

    import torch

    host, level, gpu = default_label().split("/", 2)
    assert host == socket.gethostname().split(".", 1)[0]
    assert level == torch.backends.cpu.get_cpu_capability().replace(" ", "").upper()
    expected = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    assert gpu == expected


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ('[{"op": ""}]', "entries[0]: 'op' must be a non-empty string"),
        ('[{"op": "a", "observations": {"great": 1}}]', "'observations' must map verdicts"),
        ('[{"op": "a", "tests": "t::a"}]', "'tests' and 'nondeterministic_in' must be lists"),
        ('{"op": "a"}', "'entries' must be a list"),
    ],
)
def test_bad_census_inputs_name_the_file(tmp_path: Path, entries: str, message: str) -> None:
    good = _write(tmp_path / "good.json", "a", {"t::a": {ADD: "deterministic"}})
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "pytest-backends-census", "version": 1, "entries": ' + entries + "}")
    with pytest.raises(CensusFileError) as info:
        merge_censuses([good, bad])
    assert str(bad) in str(info.value) and message in str(info.value)


def test_merge_command_writes_both_merges_and_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write(tmp_path / "a.json", "cpu", {"t::a": {NOISY: "nondeterministic"}})
    b = _write(
        tmp_path / "b.json",
        "gpu",
        {"t::b": {SCATTER: "deterministic"}},
        versions=Versions("2.11.0+cu130", "13.0"),
    )
    out = tmp_path / "merged.json"
    assert main(["merge", "--census", str(out), str(a), str(b)]) == 0
    captured = capsys.readouterr()
    assert "merged 2 census(es):" in captured.out and f"census written to {out}" in captured.out
    assert "plant::noisy (cpu, float32): in 1 test(s), e.g. t::a" in captured.out
    assert "warning: the censuses come from different torch/CUDA versions" in captured.err
    assert "torch 2.11.0+cu130 (CUDA 13.0): gpu (" in captured.err
    versions, census = read_census(out)
    assert versions == Versions("2.13.0+cpu, 2.11.0+cu130", "13.0")
    assert (
        census.verdict(NOISY) == "nondeterministic" and census.verdict(SCATTER) == "deterministic"
    )
    # A census given where a report is wanted, and a missing input, name the file.
    assert main(["merge", "--report", str(tmp_path / "r.json"), "--census", str(out), str(a)]) == 1
    assert "error: no report among the inputs" in capsys.readouterr().err
    assert main(["merge", "--census", str(out), str(tmp_path / "nope.json")]) == 1
    assert f"input file {tmp_path / 'nope.json'} does not exist" in capsys.readouterr().err
    baseline = tmp_path / "baseline.json"
    baseline.write_text('{"format": "pytest-backends-baseline", "version": 1, "accepted": []}')
    assert main(["merge", "--census", str(out), str(baseline)]) == 1
    assert (
        "is neither a matrix report (--backends-report) nor a census (--backends-census): "
        "it is a baseline" in capsys.readouterr().err
    )


def test_baseline_entries_name_a_device_type(tmp_path: Path) -> None:
    """``cuda:1`` in a census is written as ``cuda``: an entry accepts a device type."""
    census = Census()
    census.add_test("t::e", {("aten::index_add_", "cuda:1", "float16"): "nondeterministic"})
    refreshed = refresh(Baseline(), census).baseline
    assert [(e.op, e.device, e.dtype) for e in refreshed.entries] == [
        ("aten::index_add_", "cuda", "float16")
    ]
    updated = Baseline().updated(census)
    assert [e.device for e in updated.entries] == ["cuda"]
    assert updated.accepts(("aten::index_add_", "cuda:0", "float16"))
