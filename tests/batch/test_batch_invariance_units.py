"""Unit tests: the marker's binding, the census section and the baseline update (no torch)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from pytest_backends.batch import marker
from pytest_backends.batch.census import BatchCensus, updated_baseline
from pytest_backends.determinism.census import Baseline, BaselineEntry, CensusFileError


def test_marker_arguments_bind_through_its_signature() -> None:
    spec = marker.bind((), {"sizes": [1, 4], "tolerance": (1e-3, 1e-5)})
    assert spec == {
        "sizes": [1, 4],
        "rtol": None,
        "atol": None,
        "tolerance": (1e-3, 1e-5),
        "permute": True,
    }
    assert marker.bind((), {"tolerance": "report"})["tolerance"] == "report"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {"size": [1]}, "unexpected keyword argument 'size'"),
        (([1],), {}, "positional argument"),
        ((), {"sizes": []}, "non-empty list of positive ints"),
        ((), {"sizes": "12"}, "non-empty list of positive ints"),
        ((), {"sizes": [True]}, "non-empty list of positive ints"),
        ((), {"rtol": -1}, "rtol must be a number >= 0"),
        ((), {"atol": "1e-3"}, "atol must be a number >= 0"),
        ((), {"tolerance": (1, 2, 3)}, "tolerance must be (rtol, atol) or 'report'"),
        ((), {"tolerance": "loose"}, "tolerance must be (rtol, atol) or 'report'"),
        ((), {"tolerance": (1e-3, 0), "rtol": 1e-3}, "not both"),
        ((), {"permute": "yes"}, "permute must be True or False"),
    ],
)
def test_invalid_marker_arguments_are_refused(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(marker.MarkerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        marker.bind(args, kwargs)


def test_marker_line_lists_the_signature() -> None:
    line = marker.marker_line()
    for name in inspect.signature(marker.batch_invariant).parameters:
        assert name in line
    assert line.startswith("batch_invariant(*, sizes")


def _rows(verdict: str, sizes: list[int], op: str = "aten::mm") -> list[dict[str, object]]:
    return [{"op": op, "device": "cpu", "dtype": "float32", "verdict": verdict, "sizes": sizes}]


def test_census_keeps_the_strongest_verdict_per_op_and_per_config() -> None:
    census = BatchCensus()
    census.add_test("t.py::a[mkldnn-on]", "mkldnn-on", _rows("no_difference", [1, 2]))
    census.add_test("t.py::a[mkldnn-off]", "mkldnn-off", _rows("batch_variant", [1]))
    census.add_test("t.py::b", "default", _rows("no_difference", [1, 2, 8], "aten::_softmax"))
    key = ("aten::mm", "cpu", "float32")
    assert census.verdict(key) == "batch_variant"
    assert census.configs(key) == {"mkldnn-off": "batch_variant", "mkldnn-on": "no_difference"}
    assert census.variant() == {key: ["t.py::a[mkldnn-off]"]}
    assert census.describe(key) == "batch-variant at sizes 1"
    data = census.to_data()
    softmax = next(r for r in data["entries"] if r["op"] == "aten::_softmax")
    assert softmax["description"] == "no difference in 3 sizes"
    assert softmax["sizes_compared"] == [1, 2, 8]
    mm = next(r for r in data["entries"] if r["op"] == "aten::mm")
    assert mm["batch_variant_in"] == ["t.py::a[mkldnn-off]"]
    assert mm["sizes_compared"] == [1, 2] and mm["sizes_differing"] == [1]


def test_census_refuses_malformed_rows() -> None:
    census = BatchCensus()
    with pytest.raises(CensusFileError, match="unknown verdict 'flaky'"):
        census.add_test("t.py::a", "default", _rows("flaky", []))
    with pytest.raises(CensusFileError, match="'sizes' must be a list of integers"):
        census.add_test("t.py::a", "default", _rows("no_difference", ["1"]))  # type: ignore[list-item]


def test_baseline_update_only_adds_ops() -> None:
    census = BatchCensus()
    census.add_test("t.py::a", "default", _rows("batch_variant", [1]))
    census.add_test("t.py::b", "default", _rows("no_difference", [1], "aten::tanh"))
    old = Baseline((BaselineEntry("suite::kept", "cpu", note="known"),))
    new = updated_baseline(old, census)
    assert [(e.op, e.device, e.dtype, e.note) for e in new.entries] == [
        ("aten::mm", "cpu", "float32", None),
        ("suite::kept", "cpu", None, "known"),
    ]
    assert updated_baseline(new, census) == new


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = (
        "import sys; import pytest_backends.plugin, pytest_backends.batch.plugin, "
        "pytest_backends.batch.api, pytest_backends.batch.runs, pytest_backends.batch.state; "
        "import pytest_backends as p; p.assert_batch_invariant; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    # Resolving the lazy name imports the api module, which must not import torch either.
    subprocess.run([sys.executable, "-c", code], check=True)
