"""Census and baseline JSON: schema, atomic writes, validation errors, version warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_backends.determinism.census import (
    BASELINE_FORMAT,
    FORMAT_VERSION,
    Baseline,
    BaselineEntry,
    Census,
    CensusFileError,
    Versions,
    atomic_write_json,
    op_family,
    read_census,
)

V = Versions("2.13.0+cpu", None)
NOISY = ("pbtest::noisy", "cpu", "float32")
ADD = ("aten::add", "cpu", "float32")
INDEX_ADD = ("aten::index_add_", "cuda", "float32")


def _census() -> Census:
    census = Census()
    census.add_test("t.py::a", {NOISY: "nondeterministic", ADD: "deterministic"})
    census.add_test("t.py::b", {ADD: "inconclusive", INDEX_ADD: "raises_under_deterministic_mode"})
    return census


def test_verdict_is_the_strongest_observation() -> None:
    census = _census()
    assert census.verdict(NOISY) == "nondeterministic"
    assert census.verdict(ADD) == "deterministic"
    assert census.verdict(INDEX_ADD) == "raises_under_deterministic_mode"
    assert census.verdict(("aten::mul", "cpu", "float32")) is None
    assert census.nondeterministic() == {NOISY: ["t.py::a"]}


def test_census_round_trip_and_merge(tmp_path: Path) -> None:
    path = tmp_path / "out" / "census.json"
    census = _census()
    census.write(path, runs=5, versions=V)
    data = json.loads(path.read_text())
    assert (data["format"], data["version"], data["torch"], data["cuda"], data["runs"]) == (
        "pytest-backends-census",
        FORMAT_VERSION,
        "2.13.0+cpu",
        None,
        5,
    )
    add = next(e for e in data["entries"] if e["op"] == "aten::add")
    assert add["tests"] == ["t.py::a", "t.py::b"]
    assert add["observations"] == {"deterministic": 1, "inconclusive": 1}
    versions, again = read_census(path)
    assert versions == V
    assert again.to_data() == census.to_data()
    # Merging a second worker's entries adds up observations and tests.
    again.merge_data(_census().to_data())
    add2 = next(e for e in again.to_data() if e["op"] == "aten::add")
    assert add2["observations"] == {"deterministic": 2, "inconclusive": 2}
    assert add2["tests"] == ["t.py::a", "t.py::b"]


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text("old")
    atomic_write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text('{"kept": true}')
    with pytest.raises(TypeError):
        atomic_write_json(path, {"bad": object()})
    assert path.read_text() == '{"kept": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(text)
    return path


def _baseline_text(**overrides: object) -> str:
    data: dict[str, object] = {
        "format": BASELINE_FORMAT,
        "version": 1,
        "torch": "2.13.0+cpu",
        "cuda": None,
        "accepted": [{"op": "pbtest::noisy", "device": "cpu"}],
    }
    data.update(overrides)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": "pytest-backends-baseline", "version": 1, "accepted": [}', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (_baseline_text(format="something"), "'format' must be 'pytest-backends-baseline'"),
        (_baseline_text(version=99), "format version 99"),
        (_baseline_text(version="1"), "'version' must be a positive integer"),
        (_baseline_text(accepted={"op": "x"}), "'accepted' must be a list"),
        (_baseline_text(accepted=[{"device": "cpu"}]), r"accepted\[0\]: 'op' must be"),
        (_baseline_text(accepted=[{"op": "aten::x"}]), r"accepted\[0\]: 'device' must be"),
        (_baseline_text(accepted=[{"op": "a", "device": "cpu", "dtyp": "x"}]), "'dtyp'"),
        (_baseline_text(accepted=[{"op": "a", "device": "cpu", "dtype": 3}]), "'dtype' must be"),
        (_baseline_text(torch=2.13), "'torch' must be a string"),
        ('{"format": "pytest-backends-baseline", "version": NaN}', "NaN is not allowed"),
        (json.dumps({"format": "pytest-backends-census", "version": 1}), "it is a census file"),
    ],
)
def test_broken_baseline_files_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(CensusFileError, match=message) as info:
        Baseline.load(path)
    assert str(path) in str(info.value)


def test_missing_baseline_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CensusFileError, match="does not exist") as info:
        Baseline.load(tmp_path / "nope.json")
    assert "nope.json" in str(info.value)


def test_json_error_gives_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, '{\n  "format": "pytest-backends-baseline",\n  "version": 1,,\n}')
    with pytest.raises(CensusFileError, match="line 3 column"):
        Baseline.load(path)


def test_baseline_matching() -> None:
    any_dtype = BaselineEntry("aten::index_add_", "cuda")
    assert any_dtype.matches(("aten::index_add_", "cuda:1", "float16"))
    assert not any_dtype.matches(("aten::index_add_", "cpu", "float16"))
    only_f32 = BaselineEntry("aten::index_add_", "cuda", "float32")
    assert only_f32.matches(INDEX_ADD)
    assert not only_f32.matches(("aten::index_add_", "cuda", "float64"))
    assert not only_f32.matches(("aten::index_put_", "cuda", "float32"))
    assert not only_f32.matches(("aten::index_add_", "cuda", "float64"))


@pytest.mark.parametrize(
    ("entry_op", "seen"),
    [
        ("aten::index_add_", "aten::index_add"),  # made by the native recorder, run by Python
        ("aten::scatter_add", "aten::scatter_add_"),
        ("aten::_foreach_add_", "aten::_foreach_add"),
    ],
)
def test_an_entry_accepts_the_in_place_and_out_of_place_forms(entry_op: str, seen: str) -> None:
    """One kernel, two names: torch picks the form by whether a dispatch mode is active."""
    assert BaselineEntry(entry_op, "cuda", "float32").matches((seen, "cuda", "float32"))
    assert op_family(entry_op) == op_family(seen)


def test_op_family_keeps_other_names_whole() -> None:
    assert op_family("aten::__iand__") == "aten::__iand__"
    assert op_family("aten::__and__") == "aten::__and__"
    assert op_family("pbtest::noisy") == "pbtest::noisy"
    assert not BaselineEntry("aten::add", "cpu").matches(("aten::addmm", "cpu", "float32"))


def test_version_mismatch_names_both_versions(tmp_path: Path) -> None:
    path = _write(tmp_path, _baseline_text(torch="2.11.0+cu130", cuda="13.0"))
    baseline = Baseline.load(path)
    message = baseline.version_mismatch(path, V)
    assert message is not None
    assert "torch 2.11.0+cu130 (CUDA 13.0)" in message
    assert "torch 2.13.0+cpu (CUDA none)" in message
    assert str(path) in message
    assert Baseline.load(_write(tmp_path, _baseline_text())).version_mismatch(path, V) is None


def test_update_only_adds_and_keeps_every_entry_with_its_note(tmp_path: Path) -> None:
    old = Baseline(
        (
            BaselineEntry("pbtest::noisy", "cpu", None, "planted on purpose"),
            BaselineEntry("aten::add", "cpu", "float32", "fixed since"),
            BaselineEntry("aten::scatter_add_", "cuda", None, "not run today"),
        ),
        Versions("2.11.0", "12.8"),
    )
    census = _census()
    census.add_test("t.py::c", {INDEX_ADD: "nondeterministic"})
    new = old.updated(census)
    # aten::add came out deterministic here, but this run may be one shard of the suite.
    assert [(e.op, e.device, e.dtype, e.note) for e in new.entries] == [
        ("aten::add", "cpu", "float32", "fixed since"),
        ("aten::index_add_", "cuda", "float32", None),
        ("aten::scatter_add_", "cuda", None, "not run today"),
        ("pbtest::noisy", "cpu", None, "planted on purpose"),
    ]
    path = tmp_path / "b.json"
    new.write(path, V)
    loaded = Baseline.load(path)
    assert loaded.entries == new.entries
    assert loaded.versions == V
