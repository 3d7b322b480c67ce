"""``merge --census`` merges and checks every input's batch-invariance section, in any order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_backends._sources import MergeInputError
from pytest_backends.batch.census import SECTION, BatchCensus
from pytest_backends.determinism.census import Census, Key, Versions
from pytest_backends.determinism.census_merge import merge_censuses

MM: Key = ("aten::mm", "cpu", "float32")
SUM: Key = ("aten::sum", "cpu", "float32")


def _write(path: Path, label: str, rows: list[tuple[str, str, Key, str, list[int]]]) -> Path:
    census = Census()
    census.add_test("t.py::det", {MM: "deterministic"})
    census.write(path, runs=3, versions=Versions("2.13.0+cpu", None), label=label)
    batch = BatchCensus()
    for nodeid, config, key, verdict, sizes in rows:
        op, device, dtype = key
        batch.add_test(
            nodeid,
            config,
            [{"op": op, "device": device, "dtype": dtype, "verdict": verdict, "sizes": sizes}],
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    data[SECTION] = batch.to_data()
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _section(paths: list[Path], out: Path) -> Any:
    merged = merge_censuses(paths)
    merged.write(out)
    return json.loads(out.read_text(encoding="utf-8"))[SECTION]


def test_batch_sections_of_all_inputs_are_merged_in_any_order(tmp_path: Path) -> None:
    a = _write(
        tmp_path / "a.json",
        "cpu-avx2",
        [("t.py::b1", "default", MM, "no_difference", [1, 2])],
    )
    b = _write(
        tmp_path / "b.json",
        "cpu-avx512",
        [
            ("t.py::b1", "mkldnn-off", MM, "batch_variant", [3]),
            ("t.py::b2", "default", SUM, "no_difference", [1]),
        ],
    )
    forward = _section([a, b], tmp_path / "ab.json")
    backward = _section([b, a], tmp_path / "ba.json")
    assert forward == backward
    rows = {row["op"]: row for row in forward["entries"]}
    assert set(rows) == {"aten::mm", "aten::sum"}
    assert rows["aten::mm"]["verdict"] == "batch_variant"
    assert rows["aten::mm"]["configs"] == {
        "default": "no_difference",
        "mkldnn-off": "batch_variant",
    }
    assert rows["aten::mm"]["sizes_compared"] == [1, 2, 3]
    assert rows["aten::mm"]["batch_variant_in"] == ["t.py::b1"]
    # Merging the merged file again changes nothing.
    assert _section([tmp_path / "ab.json", a], tmp_path / "again.json") == forward


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ([], "must be an object"),
        ({"entries": [{"op": "aten::mm", "verdict": "maybe"}]}, "unknown verdict"),
        ({"entries": [{"op": "", "verdict": "no_difference"}]}, "'op'"),
        ({"entries": [{"op": "aten::mm", "verdict": "batch_variant"}]}, "names no test"),
        (
            {"entries": [{"op": "aten::mm", "verdict": "no_difference", "sizes_compared": ["2"]}]},
            "sizes_compared",
        ),
    ],
)
def test_a_bad_batch_section_is_refused_naming_the_file(
    tmp_path: Path, section: object, named: str
) -> None:
    good = _write(tmp_path / "good.json", "a", [("t.py::b", "default", MM, "no_difference", [1])])
    bad = _write(tmp_path / "bad.json", "b", [])
    data = json.loads(bad.read_text(encoding="utf-8"))
    data[SECTION] = section
    bad.write_text(json.dumps(data), encoding="utf-8")
    for order in ([good, bad], [bad, good]):
        with pytest.raises(MergeInputError, match=named) as info:
            merge_censuses(order)
        assert str(bad) in str(info.value)
