"""The TorchDispatchMode recorder and the run comparison, on real torch ops."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from pytest_backends import override_flags
from pytest_backends.determinism.api import RngState
from pytest_backends.determinism.compare import Comparison, compare_runs
from pytest_backends.determinism.record import Digest, RunLog
from pytest_backends.determinism.record_python import PythonRecorder
from pytest_backends.determinism.verdict import describe_divergence


def _record(fn: Callable[[int], object], runs: int = 3) -> tuple[list[RunLog], Comparison]:
    start = RngState.capture()
    logs = []
    for run in range(runs):
        start.restore()
        with PythonRecorder() as recorder:
            fn(run)
        logs.append(recorder.finish())
    return logs, compare_runs(logs)


def test_deterministic_ops_are_recorded_in_order() -> None:
    w = torch.randn(4, 4)

    def body(_run: int) -> None:
        x = torch.randn(3, 4)
        torch.nn.functional.relu(x @ w).sum()

    logs, result = _record(body)
    names = [c.name for c in logs[0].calls]
    assert names == ["aten::randn", "aten::mm", "aten::relu", "aten::sum"]
    assert result.reproducible
    assert result.verdicts[("aten::mm", "cpu", "float32")] == "deterministic"


def test_planted_op_is_blamed_and_downstream_is_inconclusive(planted: ModuleType) -> None:
    def body(_run: int) -> None:
        x = torch.ones(4) * 2
        planted.noisy(x).exp()

    _logs, result = _record(body)
    assert [d.op for d in result.blamed] == ["pbtest::noisy"]
    first = result.blamed[0]
    assert (first.kind, first.run, first.output_index, first.op_index) == ("op", 1, 0, 2)
    assert result.verdicts[("pbtest::noisy", "cpu", "float32")] == "nondeterministic"
    assert result.verdicts[("aten::exp", "cpu", "float32")] == "inconclusive"
    assert result.verdicts[("aten::mul", "cpu", "float32")] == "deterministic"
    assert "pbtest::noisy (cpu, float32): output 0 differs" in describe_divergence(first, 3)


def test_independent_nondeterministic_ops_are_all_blamed(planted: ModuleType) -> None:
    def body(_run: int) -> None:
        a = planted.noisy(torch.zeros(2))
        torch.zeros(3, dtype=torch.float64).index_add_(0, torch.tensor([0]), a[:1].double())
        planted.spread_backward(torch.randn(64, 16))

    _logs, result = _record(body)
    assert [d.op for d in result.blamed] == ["pbtest::noisy", "pbtest::spread_backward"]
    assert result.unexplained is None


def test_state_carried_between_runs_is_not_blamed_on_an_op() -> None:
    state = torch.zeros(3)

    def body(_run: int) -> None:
        state.add_(1)  # mutates a tensor shared by all runs
        state.mul(2)

    _logs, result = _record(body)
    assert result.blamed == []
    assert result.unexplained is not None
    assert result.unexplained.kind == "inputs"
    assert result.unexplained.op == "aten::add_"
    assert "inputs already differed" in describe_divergence(result.unexplained, 3)


def test_python_level_difference_in_arguments_is_not_blamed() -> None:
    def body(run: int) -> None:
        torch.arange(4.0).roll(run)

    _logs, result = _record(body)
    assert result.blamed == []
    assert result.unexplained is not None and result.unexplained.op == "aten::roll"


def test_changed_op_sequence_is_reported() -> None:
    def body(run: int) -> None:
        x = torch.ones(2)
        if run:
            x.neg()
        else:
            x.abs()

    _logs, result = _record(body, runs=2)
    assert result.unexplained is not None
    assert result.unexplained.kind == "sequence"
    assert (result.unexplained.op, result.unexplained.other_op) == ("aten::abs", "aten::neg")


def test_uninitialized_memory_is_compared_by_shape_only() -> None:
    def body(_run: int) -> None:
        torch.empty(1000).fill_(3.0).sum()

    _logs, result = _record(body)
    assert result.reproducible
    assert result.verdicts[("aten::fill_", "cpu", "float32")] == "deterministic"


def test_in_place_op_returning_nothing_is_digested_through_its_arguments() -> None:
    tensors = [torch.ones(2), torch.ones(3)]

    def body(run: int) -> None:
        local = [t.clone() for t in tensors]
        torch._foreach_add_(local, 1.0)
        local[0].sum()

    logs, _ = _record(body, runs=1)
    call = next(c for c in logs[0].calls if c.name == "aten::_foreach_add_")
    assert len(call.outputs) == 2
    assert all(isinstance(slot, Digest) and slot.value for slot in call.outputs)


def test_alert_under_deterministic_mode_is_recorded() -> None:
    with override_flags({"deterministic_algorithms": True}), PythonRecorder() as recorder:
        with pytest.raises(RuntimeError, match="does not have a deterministic"):
            torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
        torch.ones(2).neg()
    log = recorder.finish()
    put = next(c for c in log.calls if c.name == "aten::put_")
    assert put.alerted
    verdicts = compare_runs([log, log]).verdicts
    assert verdicts[("aten::put_", "cpu", "float32")] == "raises_under_deterministic_mode"
    assert verdicts[("aten::neg", "cpu", "float32")] == "deterministic"


def test_alert_under_warn_only_is_recorded_and_still_warns() -> None:
    flags = {"deterministic_algorithms": True, "deterministic_algorithms.warn_only": True}
    with override_flags(flags), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PythonRecorder() as recorder:
            torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
    log = recorder.finish()
    assert next(c for c in log.calls if c.name == "aten::put_").alerted
    assert any("does not have a deterministic" in str(w.message) for w in caught)


def test_recorder_sees_backward_ops(planted: ModuleType) -> None:
    x = torch.randn(32, requires_grad=True)

    def body(_run: int) -> None:
        x.grad = None
        y = planted.spread(x, 16)
        y.backward(torch.randn(32, 16))

    _logs, result = _record(body)
    assert [d.op for d in result.blamed] == ["pbtest::spread_backward"]


def test_views_are_keyed_by_their_inputs_until_written() -> None:
    def body(_run: int) -> None:
        w = torch.arange(6.0).reshape(2, 3)
        wt = w.t()
        wt.sum()
        w.mul_(2)  # shares the version counter with wt: wt's key must be recomputed
        wt.sum()

    logs, result = _record(body, runs=2)
    calls = logs[0].calls
    t_call = next(c for c in calls if c.name == "aten::t")
    assert t_call.outputs[0][0] == "view"
    first_sum, second_sum = [c for c in calls if c.name == "aten::sum"]
    assert first_sum.inputs[0][0] == "view"
    assert isinstance(second_sum.inputs[0], Digest)
    assert first_sum.outputs != second_sum.outputs
    assert result.reproducible
