"""The zoo of real modules and functions: zero false verdicts on CPU.

Every entry runs forward and backward with random upstream gradients, N = 5,
under ``assert_reproducible`` (in this process) and under the suite-wide
``--backends-determinism`` recorder (one pytest subprocess with ``-n 2``).
On CPU every entry is deterministic, so any finding is a false verdict.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from pytest_backends import assert_reproducible

ZOO_PATH = Path(__file__).with_name("zoo.py")


def _load_zoo() -> ModuleType:
    name = "pytest_backends_tests_zoo"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, ZOO_PATH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


zoo = _load_zoo()


def test_zoo_covers_the_model_families() -> None:
    names = set(zoo.ZOO)
    assert len(names) >= 40
    for family in (
        "lstm",
        "gru",
        "transformer",
        "attention",
        "conv_transpose3d",
        "batch_norm",
        "group_norm",
        "layer_norm",
        "embedding_bag",
        "pool",
        "interpolate",
        "grid_sample",
        "ctc_loss",
        "sort",
        "topk",
        "unique",
        "scatter",
        "index",
        "cumsum",
        "einsum",
        "linalg_qr",
        "linalg_svd",
        "linalg_eigh",
        "linalg_solve",
        "fft",
    ):
        assert any(family in name for name in names), family


@pytest.mark.filterwarnings("ignore:LSTM with projections")
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_entry_is_reproducible(name: str) -> None:
    torch.manual_seed(0)
    fn, args = zoo.ZOO[name]("cpu")
    assert_reproducible(fn, *args, runs=5)


SUITE = """
import pytest
from zoo_entries import ZOO, run_entry

@pytest.mark.filterwarnings("ignore:LSTM with projections")
@pytest.mark.parametrize("name", sorted(ZOO))
def test_entry(name):
    run_entry(name)
"""


def _zoo_census(pytester: pytest.Pytester, recorder: str) -> dict[str, Any]:
    """The census of the zoo run suite-wide under ``-n 2`` with ``recorder``."""
    out = f"census-{recorder}.json"
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "--backends-determinism=5",
        "--backends-determinism-all",
        f"--backends-census={out}",
    )
    result.assert_outcomes(passed=len(zoo.ZOO))
    text = result.stdout.str()
    shown = "recorder: native" if recorder == "native" else "recorder: Python"
    assert shown in text, text[-2000:]
    census: dict[str, Any] = json.loads((pytester.path / out).read_text())
    return census


@pytest.mark.slow
def test_zoo_suite_wide_under_xdist_has_no_false_verdicts_under_both_recorders(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester = planted_conftest
    pytester.makepyfile(zoo_entries=ZOO_PATH.read_text(encoding="utf-8"), test_zoo_suite=SUITE)
    from pytest_backends.determinism.record_native import native_module

    recorders = ["native", "python"] if native_module() is not None else ["python"]
    verdicts_by_recorder: dict[str, dict[tuple[str, str], str]] = {}
    for recorder in recorders:
        monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "auto" if recorder == "native" else "off")
        census = _zoo_census(pytester, recorder)
        rows = census["entries"]
        false = [r for r in rows if r["verdict"] in ("nondeterministic", "reads_uninitialized")]
        assert false == [], recorder
        tested = {test for row in rows for test in row["tests"]}
        assert len(tested) == len(zoo.ZOO), recorder  # both workers' verdicts reached it
        assert census.get("not_checked", {}) == {}, (recorder, census.get("not_checked"))
        verdicts = {(r["op"], r["dtype"]): r["verdict"] for r in rows}
        for op in (
            "aten::mkldnn_rnn_layer_backward",
            "aten::convolution_backward",
            "aten::_ctc_loss_backward",
            "aten::native_batch_norm_backward",
        ):
            assert verdicts.get((op, "float32")) == "deterministic", (recorder, op)
        assert sum(v == "deterministic" for v in verdicts.values()) >= 150, recorder
        verdicts_by_recorder[recorder] = verdicts
    if len(verdicts_by_recorder) == 2:
        # Each recorder sees ops at its own dispatch level (the native hook above
        # autograd, the dispatch mode below it), so some ops are seen by one only;
        # an op both saw gets the same verdict, and most ops are seen by both.
        native, python = verdicts_by_recorder["native"], verdicts_by_recorder["python"]
        common = native.keys() & python.keys()
        differ = {key: (native[key], python[key]) for key in common if native[key] != python[key]}
        assert differ == {}
        assert len(common) >= 0.8 * max(len(native), len(python)), (len(common), len(native))


RACY_SUITE = """
import torch
from zoo_entries import RACY_CPU

def test_racy_index_put():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        fn, args = RACY_CPU["index_put_accumulate_1e6"]("cpu")
        fn(*args)
    finally:
        torch.set_num_threads(threads)
"""


def test_a_real_cpu_race_is_caught_or_called_no_difference_never_deterministic(
    planted_conftest: pytest.Pytester,
) -> None:
    """``index_put_(accumulate=True)`` on 10^6 elements races with 2 threads, only sometimes.

    Whichever way this session's five runs fall, the census must not call the op
    deterministic: it is blamed (the test fails) or its evidence reads "no
    difference in 5 runs".
    """
    pytester = planted_conftest
    pytester.makepyfile(zoo_entries=ZOO_PATH.read_text(encoding="utf-8"), test_racy=RACY_SUITE)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:xdist",
        "--backends-determinism=5",
        "--backends-determinism-all",
        "--backends-census=census.json",
    )
    census = json.loads((pytester.path / "census.json").read_text())
    rows = [r for r in census["entries"] if "index_put" in r["op"]]
    assert rows, census["entries"]
    caught = any(r["verdict"] == "nondeterministic" for r in rows)
    for row in rows:
        assert row["verdict"] in ("nondeterministic", "deterministic"), row
        if row["verdict"] == "deterministic":
            assert row["evidence"].startswith("no difference in 5 runs"), row
            assert "not a proof" in row["evidence"]
    others = [r for r in census["entries"] if "index_put" not in r["op"]]
    assert all(r["verdict"] != "nondeterministic" for r in others), others
    if caught:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*nondeterministic op aten::*index_put*"])
    else:
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["*showed no difference in 5 runs*"])
