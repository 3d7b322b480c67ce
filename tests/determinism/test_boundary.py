"""The determinism check never changes a deterministic test's outcome, and still catches ops.

Real pytest sessions in subprocesses: a realistic suite (the examples plus compiled,
scripted, traced, exported, custom-op, autograd-Function, torch.func, hook, thread and
Python-state tests) runs with and without ``--backends-determinism-all``, serially and
under ``-n 2``, with identical outcomes; planted nondeterministic ops, also inside
compiled code, still fail their tests.
"""

from __future__ import annotations

import json
import shutil
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

# In-process pytester runs import torch through the plugin; importing it here first
# keeps pytester's sys.modules snapshot from unloading (and re-importing) it.
import torch

from pytest_backends.determinism.compare import Comparison, compare_runs
from pytest_backends.determinism.record import RunRecord
from pytest_backends.determinism.record_python import PythonRecorder
from pytest_backends.determinism.verdict import INPUTS_DIFFER, explain_unchecked

HERE = Path(__file__).parent
EXAMPLES = HERE.parent.parent / "examples"

# Appended to the suite: the harness's own machinery fails on one distinctive tensor
# shape (a fault injected into the pure-Python digest, which the recorder calls for
# every output when the native harness is off, as it is in this suite).
BROKEN_DIGEST = """

import pytest_backends.determinism.digest as _digest_module

_real_digest = _digest_module._python_digest


def _breaking_digest(t, *args, **kwargs):
    if tuple(t.shape) == (7, 13):
        raise ZeroDivisionError("injected fault in the digest")
    return _real_digest(t, *args, **kwargs)


_digest_module._python_digest = _breaking_digest
"""

SAFETY_NET_TESTS = """

def test_recorder_breaks():
    x = torch.ones(7, 13).mul(2)
    assert x.sum().item() == 182


_CALLS = []


def test_not_repeatable():
    _CALLS.append(1)
    assert len(_CALLS) == 1
"""


def _outcomes(path: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        # The suite's files are flat modules without classes: ``test_a`` -> ``test_a.py``.
        name = f"{case.get('classname')}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
    return outcomes


@pytest.fixture
def suite(planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """The realistic suite in a pytester directory (examples, constructs, safety-net tests)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(planted_conftest.path / "inductor"))
    for source in EXAMPLES.glob("*.py"):
        shutil.copy(source, planted_conftest.path / source.name)
    constructs = (HERE / "construct_suite.py").read_text(encoding="utf-8")
    constructs += SAFETY_NET_TESTS
    (planted_conftest.path / "test_constructs.py").write_text(constructs, encoding="utf-8")
    conftest = planted_conftest.path / "conftest.py"
    conftest.write_text(conftest.read_text(encoding="utf-8") + BROKEN_DIGEST, encoding="utf-8")
    return planted_conftest


def _recorders() -> list[tuple[str, list[str]]]:
    """(recorder, extra pytest arguments): each recorder once, one of them under ``-n 2``.

    The plain run's outcomes do not depend on the recorder, so one plain run
    serves both; the Python recorder runs serially and the native one (the
    default where it is built) under xdist, as most users run it.
    """
    from pytest_backends.determinism.record_native import native_module

    runs: list[tuple[str, list[str]]] = [("python", [])]
    if native_module() is not None:
        runs.append(("native", ["-n", "2"]))
    else:
        runs.append(("python", ["-n", "2"]))
    return runs


@pytest.mark.slow
def test_real_suite_outcomes_do_not_change(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    plain = suite.runpytest_subprocess("--junitxml=plain.xml", "-q")
    expected = _outcomes(suite.path / "plain.xml")
    assert expected["test_constructs.py::test_python_state"] == "passed"
    assert expected["test_constructs.py::test_compiled_fullgraph"] == "passed"
    assert len(expected) >= 20, plain.stdout.str()
    assert set(expected.values()) <= {"passed", "skipped"}, expected

    for recorder, extra in _recorders():
        python = recorder == "python"
        monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off" if python else "auto")
        name = f"{recorder}-{'xdist' if extra else 'serial'}"
        result = suite.runpytest_subprocess(
            "--backends-determinism-all",
            "--backends-determinism=2",
            f"--backends-census={name}.json",
            f"--junitxml={name}.xml",
            "-q",
            *extra,
        )
        out = result.stdout.str()
        assert _outcomes(suite.path / f"{name}.xml") == expected, out
        census = json.loads((suite.path / f"{name}.json").read_text())
        unchecked = census["not_checked"]
        # the injected fault breaks the Python digest, which only the Python recorder calls
        assert set(unchecked) == {
            "test_constructs.py::test_python_state",
            "test_constructs.py::test_not_repeatable",
        } | (
            {"test_constructs.py::test_recorder_breaks"}
            if python
            # torch.export runs real-tensor ops outside its tracing modes that differ
            # between its first and later calls: the native hook sees them, so the
            # test is "not checked" (never blamed); the dispatch mode does not
            else {"test_constructs.py::test_export"}
        ), (name, unchecked)
        if not python:
            assert unchecked["test_constructs.py::test_export"].startswith(INPUTS_DIFFER)
        assert unchecked["test_constructs.py::test_python_state"].startswith(
            INPUTS_DIFFER + ": a Python value passed to aten::full differs"
        )
        if python:
            assert unchecked["test_constructs.py::test_recorder_breaks"] == (
                "the determinism recorder failed: ZeroDivisionError: injected fault in the digest"
            )
        assert (
            "where run 0 passed: the test is not repeatable"
            in (unchecked["test_constructs.py::test_not_repeatable"])
        )
        boundary = census["boundary"]
        assert "torch.compile" in boundary["test_constructs.py::test_compiled_fullgraph"][0]
        assert f"{len(unchecked)} not checked" in out
        assert (
            "not checked: test_constructs.py::test_python_state: its inputs differ between "
            "runs (Python state outside torch ops)" in out
        )


PLANTED = """
import itertools

import pytest
import torch

_FIRST = itertools.count()


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.nfe = 0
        self.lin = torch.nn.Linear(4, 4).double()

    def forward(self, x):
        self.nfe += 1
        return torch.tanh(self.lin(x))


f = Counter()


def test_compiled_noisy():
    g = torch.compile(lambda x: torch.ops.pbtest.noisy(x.sin()) * 2, backend="aot_eager",
                      fullgraph=True)
    g(torch.randn(8))


def test_state_and_noisy():
    f(torch.randn(2, 4, dtype=torch.double))
    torch.ops.pbtest.noisy(torch.ones(3)).neg()
    torch.full((1,), float(f.nfe)).add(1)


def test_python_state():
    f(torch.randn(2, 4, dtype=torch.double))
    torch.full((1,), float(f.nfe)).add(1)


def test_rerun_raises():
    assert next(_FIRST) == 0
"""


def test_planted_ops_still_fail_and_opt_in_flags_state(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    planted_conftest.makepyfile(test_planted=PLANTED)
    result = planted_conftest.runpytest_subprocess(
        "--backends-determinism-all",
        "--backends-determinism=3",
        "--backends-determinism-repeatable",
        "--junitxml=planted.xml",
    )
    result.assert_outcomes(failed=4)
    out = result.stdout.str()
    messages = {
        case.get("name"): failure.get("message", "")
        for case in ET.parse(planted_conftest.path / "planted.xml").getroot().iter("testcase")
        for failure in case.iter("failure")
    }
    # Inside compiled code the custom op runs through the dispatcher and is named.
    assert messages["test_compiled_noisy"].startswith("nondeterministic op pbtest::noisy")
    # The failure says which parts were checked only at their boundary.
    assert "checked only at their boundary: torch.compile: fused kernels" in out
    # Python state does not hide a nondeterministic op that comes first.
    assert messages["test_state_and_noisy"].startswith("nondeterministic op pbtest::noisy")
    # The opt-in fails tests that are not repeatable, and does not call them unchecked.
    assert messages["test_python_state"].startswith(
        "not reproducible: run 1 first differs from run 0 at op aten::full"
    )
    assert "raised in determinism run 1" in out
    assert "not checked:" not in out and "0 not checked" in out

    plain_check = planted_conftest.runpytest_subprocess(
        "--backends-determinism-all", "--backends-determinism=3", "-k", "state or raises"
    )
    # Without the opt-in only the test with a nondeterministic op fails.
    plain_check.assert_outcomes(failed=1, passed=2)
    text = plain_check.stdout.str()
    assert "test_state_and_noisy" in text and "nondeterministic op pbtest::noisy" in text
    assert "2 not checked" in text


def test_trace_check_numbers_reach_ops_as_tensors() -> None:
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.sum().item()

    def trace() -> None:
        torch.jit.trace_module(
            DataDependent(),
            {"forward": torch.ones(2, 3)},
            check_inputs=[{"forward": torch.full((2, 3), 2.0)}],
        )

    with pytest.warns(), pytest.raises(torch.jit.TracingCheckError):
        trace()
    recorder = PythonRecorder()
    with pytest.warns(), pytest.raises(torch.jit.TracingCheckError), recorder:
        trace()
    assert recorder.failure is None
    log = recorder.finish()
    assert "aten::_local_scalar_dense" in {c.name for c in log.calls}


def test_compiled_fullgraph_under_recorder_is_compiled() -> None:
    counts = {"frames": 0}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        counts["frames"] += 1
        return gm.forward

    f = torch.compile(lambda x: torch.ops.aten.sin(x) + 1, backend=backend, fullgraph=True)
    logs = []
    for _ in range(2):
        recorder = PythonRecorder()
        with recorder:
            f(torch.ones(3))
        logs.append(recorder.finish())
    assert counts["frames"] == 1
    assert compare_runs(logs).reproducible
    assert [c.name for c in logs[0].calls] == ["aten::ones", "aten::sin", "aten::add"]


def test_recorder_failure_keeps_the_op_result() -> None:
    recorder = PythonRecorder()

    def broken(t: torch.Tensor) -> torch.Tensor:
        raise ZeroDivisionError("injected fault")

    recorder._digest_fn = broken
    with recorder:
        y = torch.arange(4.0).mul(3)
        z = y.add(1)
    assert recorder.failure is not None and recorder.failure.startswith("ZeroDivisionError")
    assert torch.equal(z, torch.tensor([1.0, 4.0, 7.0, 10.0]))
    with pytest.raises(RuntimeError, match="size"), recorder:
        torch.ones(2) + torch.ones(3)


def _record_runs(body: Callable[[], object], runs: int = 2) -> tuple[Comparison, list[RunRecord]]:
    records = []
    for _ in range(runs):
        recorder = PythonRecorder()
        with recorder:
            body()
        records.append(RunRecord(recorder.finish(), recorder.first_uses))
    return compare_runs([r.log for r in records]), records


def test_runs_that_differ_by_python_value_are_explained() -> None:
    state = {"nfe": 0}

    def body() -> None:
        state["nfe"] += 1
        torch.full((1,), float(state["nfe"])).add(1)

    comparison, records = _record_runs(body)
    reason = explain_unchecked(comparison, records)
    assert reason == (
        f"{INPUTS_DIFFER}: a Python value passed to aten::full differs: 1.0 in run 0, 2.0 in run 1"
    )


def test_runs_that_differ_by_kept_or_outside_tensors_are_explained() -> None:
    kept = torch.zeros(3)

    def mutate_kept() -> None:
        kept.add_(1)

    comparison, records = _record_runs(mutate_kept)
    reason = explain_unchecked(comparison, records)
    assert reason is not None and "a tensor kept between runs" in reason
    assert reason.endswith("first used here by aten::add_")

    calls: list[int] = []

    def from_thread() -> None:
        out: dict[str, torch.Tensor] = {}
        calls.append(1)
        worker = threading.Thread(target=lambda: out.setdefault("t", torch.full((2,), len(calls))))
        worker.start()
        worker.join()
        out["t"].mul(2)

    comparison, records = _record_runs(from_thread)
    assert not comparison.blamed
    reason = explain_unchecked(comparison, records)
    assert reason is not None and "a tensor made outside the recorded ops" in reason
    assert reason.endswith("first used by aten::mul")


def test_identical_runs_and_blamed_ops_need_no_explanation(planted: object) -> None:
    comparison, records = _record_runs(lambda: torch.ones(3).exp().sum())
    assert comparison.reproducible
    assert explain_unchecked(comparison, records) is None
    comparison, records = _record_runs(lambda: torch.ops.pbtest.noisy(torch.ones(3)).neg())
    assert comparison.blamed[0].op == "pbtest::noisy"
    assert explain_unchecked(comparison, records) is None


def test_numbers_in_tensor_positions_are_rewrapped_only_there() -> None:
    from pytest_backends.determinism.keys import rewrap_numbers

    view = torch.ops.aten.view.default
    args = rewrap_numbers(view, (6.0, [1]))
    assert args is not None
    assert args[0].dtype == torch.float64 and args[0].item() == 6.0 and args[1] == [1]
    assert rewrap_numbers(view, (torch.ones(2), [2])) is None
    # A number where the schema takes a number is left alone.
    assert rewrap_numbers(torch.ops.aten.add.Scalar, (torch.ones(1), 2)) is None
    (flag,) = rewrap_numbers(torch.ops.aten.logical_not.default, (True,)) or ()
    assert flag.dtype == torch.bool


def test_compile_watch_counts_compilations_and_survives_dynamo_reset() -> None:
    from pytest_backends.determinism.runs import CompileWatch

    watch = CompileWatch()
    backend_calls: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        backend_calls.append(1)
        return gm.forward

    torch._dynamo.reset()
    watch.arm()
    before = watch.total()
    f = torch.compile(lambda x: x.cos() * 3, backend=backend)
    f(torch.ones(2))
    compiled = watch.total()
    f(torch.ones(2))
    assert backend_calls == [1]
    assert compiled > before and watch.total() == compiled
    torch._dynamo.reset()  # clears Dynamo's callbacks: arming again puts ours back
    watch.arm()
    watch.arm()
    torch.compile(lambda x: x.sin() - 1, backend=backend)(torch.ones(2))
    assert watch.count == 2
