"""The native op recorder: what the plugin records every op of a checked test with.

Each test records real torch ops with the C++ recorder (``native/recorder.cpp``)
and checks the record a user's verdict depends on: which ops, which keys, and
what :func:`compare_runs` concludes from them.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch

from pytest_backends.determinism.api import RngState
from pytest_backends.determinism.compare import compare_runs
from pytest_backends.determinism.locate import locate
from pytest_backends.determinism.record import RunLog
from pytest_backends.determinism.record_native import NativeRecorder, native_module
from pytest_backends.flags import override_flags


@pytest.fixture(scope="module")
def native() -> Any:
    module = native_module()
    if module is None:
        pytest.skip(
            "the native extension is not built here (python -m pytest_backends build-native)"
        )
    return module


def _runs(
    native: Any, fn: Callable[[int], object], runs: int = 3
) -> list[tuple[NativeRecorder, RunLog]]:
    """Record ``runs`` runs as the plugin does: RNGs reset, outside keys carried over."""
    start = RngState.capture()
    done: list[tuple[NativeRecorder, RunLog]] = []
    for run in range(runs):
        start.restore()
        recorder = NativeRecorder(native, done[-1][0] if done else None)
        with recorder:
            fn(run)
        done.append((recorder, recorder.finish().loaded()))
    return done


def _logs(native: Any, fn: Callable[[int], object], runs: int = 3) -> list[RunLog]:
    return [log for _, log in _runs(native, fn, runs)]


def _names(log: RunLog) -> list[str]:
    return [c.name for c in log.calls]


def test_composite_ops_are_looked_through_to_the_kernels_that_run(native: Any) -> None:
    x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
    (log,) = _logs(native, lambda _: torch.nn.functional.linear(x, w, b), runs=1)
    names = _names(log)
    assert "aten::linear" not in names
    assert names == ["aten::t", "aten::addmm"]
    addmm = log.calls[1]
    assert (addmm.device, addmm.dtype) == ("cpu", "float32")
    assert addmm.outputs[0][0] == "digest"


def test_backward_ops_are_recorded_with_the_forward_keys(native: Any) -> None:
    x = torch.randn(6, requires_grad=True)

    def body(_: int) -> None:
        x.grad = None
        torch.sin(x).backward(torch.ones(6))

    (log,) = _logs(native, body, runs=1)
    names = _names(log)
    assert names[0] == "aten::sin"
    assert "aten::cos" in names and "aten::mul" in names  # sin's backward
    sin, cos = log.calls[0], log.calls[names.index("aten::cos")]
    assert cos.inputs[0] == sin.inputs[0]  # the same tensor, keyed once


def test_an_outside_tensor_is_keyed_by_content_in_every_run(native: Any) -> None:
    weight = torch.randn(8, 8)
    done = _runs(native, lambda _: weight @ weight, runs=3)
    logs = [log for _, log in done]
    assert [len(r.first_uses) for r, _ in done] == [1, 1, 1]  # no key is carried over
    assert logs[0].calls[0].inputs == logs[2].calls[0].inputs
    assert compare_runs(logs).reproducible


def test_a_storage_swapped_between_runs_is_seen(native: Any) -> None:
    layer = torch.nn.Linear(4, 4, bias=False)
    checkpoints = [torch.randn(4, 4) for _ in range(2)]

    def body(run: int) -> None:
        layer.weight.data = checkpoints[run]  # same TensorImpl, same version, new storage
        layer(torch.ones(2, 4))

    logs = [log for _, log in _runs(native, body, runs=2)]
    result = compare_runs(logs)
    assert result.blamed == []
    assert result.unexplained is not None and result.unexplained.kind == "inputs"


def test_a_write_through_data_is_not_carried_over(native: Any) -> None:
    p = torch.nn.Parameter(torch.zeros(4))

    def body(_: int) -> None:
        (p * 2).sum()
        p.data.add_(1)  # bypasses p's version counter

    done = _runs(native, body, runs=2)
    logs = [log for _, log in done]
    assert len(done[1][0].first_uses) >= 1  # p is digested again in run 1
    assert logs[0].calls[0].inputs != logs[1].calls[0].inputs  # and its values did change


def test_a_planted_nondeterministic_op_is_blamed(native: Any, planted: ModuleType) -> None:
    x = torch.ones(4)
    logs = _logs(native, lambda _: torch.ops.pbtest.noisy(x).relu())
    result = compare_runs(logs)
    assert [d.op for d in result.blamed] == ["pbtest::noisy"]
    assert result.verdicts[("pbtest::noisy", "cpu", "float32")] == "nondeterministic"
    assert result.verdicts[("aten::relu", "cpu", "float32")] == "inconclusive"


def test_a_backward_blame_names_its_forward_op_and_line(native: Any, planted: ModuleType) -> None:
    x = torch.randn(3, requires_grad=True)
    # Magnitudes that make every summation order give other bits (1e8 + 1 == 1e8 in float32).
    upstream = torch.tensor([[1e8, 1.0, -1e8, 0.5, 0.25]]).repeat(3, 1)

    def body(_: int) -> None:
        x.grad = None
        torch.ops.pbtest.spread(x, 5).backward(upstream)

    start = RngState.capture()
    logs = _logs(native, body, runs=5)  # five runs: every rotation of the planted sum
    start.restore()
    result = locate(compare_runs(logs), lambda: body(0), native)
    (blamed,) = result.blamed
    assert blamed.op == "pbtest::spread_backward"
    assert blamed.location is not None and blamed.location.forward is not None
    assert blamed.location.forward_op == "pbtest::spread"
    assert blamed.location.forward.file.endswith("test_native_recorder.py")
    assert blamed.location.forward.function == "body"


def test_reading_uninitialised_memory_is_its_own_finding(native: Any) -> None:
    def body(run: int) -> None:
        e = torch.empty(50)
        e.numpy()[:] = run + 0.5  # what the allocator hands out: no op wrote it
        (e + 1).sum()

    result = compare_runs(_logs(native, body))
    assert result.blamed == []
    (finding,) = result.uninitialized
    assert finding.op == "aten::add"
    assert finding.origin is not None
    assert finding.origin.startswith("aten::empty (test_native_recorder.py:")
    assert result.verdicts[("aten::add", "cpu", "float32")] == "reads_uninitialized"


def test_a_whole_overwrite_clears_the_taint(native: Any) -> None:
    def body(run: int) -> None:
        e = torch.empty(50)
        e.numpy()[:] = run + 0.5
        e.fill_(2.0)
        (e + 1).sum()

    result = compare_runs(_logs(native, body))
    assert result.reproducible
    assert all(c.tainted is None for c in _logs(native, body, runs=1)[0].calls)


def test_the_onednn_rnn_workspace_is_compared_by_shape(native: Any) -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, batch_first=True)
    x = torch.randn(2, 5, 8)

    def body(_: int) -> None:
        lstm.zero_grad(set_to_none=True)
        out, _state = lstm(x)
        out.backward(torch.ones_like(out))

    logs = _logs(native, body)
    layers = [c for c in logs[0].calls if c.name == "aten::mkldnn_rnn_layer"]
    if not layers:
        pytest.skip("this build runs LSTM without oneDNN")
    assert layers[0].outputs[3][0] == "workspace"
    assert compare_runs(logs).reproducible


def test_an_alert_under_warn_only_is_recorded_and_still_warns(native: Any) -> None:
    flags = {"deterministic_algorithms": True, "deterministic_algorithms.warn_only": True}
    with override_flags(flags), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (log,) = _logs(
            native,
            lambda _: torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0])),
            runs=1,
        )
    put = next(c for c in log.calls if c.name == "aten::put_")
    assert put.alerted
    assert any("does not have a deterministic" in str(w.message) for w in caught)
    verdicts = compare_runs([log, log]).verdicts
    assert verdicts[("aten::put_", "cpu", "float32")] == "raises_under_deterministic_mode"


def test_an_alert_that_ends_the_run_marks_the_op_that_raised(native: Any) -> None:
    recorder = NativeRecorder(native)
    with (
        override_flags({"deterministic_algorithms": True}),
        pytest.raises(RuntimeError, match="does not have a deterministic") as info,
        recorder,
    ):
        torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
    log = recorder.finish(info.value).loaded()
    put = next(c for c in log.calls if c.name == "aten::put_")
    assert put.alerted and put.outputs == (("raised", "exception"),)


def test_ops_under_vmap_are_recorded_on_the_unwrapped_tensors(native: Any) -> None:
    x = torch.randn(3, 4)
    (log,) = _logs(native, lambda _: torch.func.vmap(torch.sin)(x), runs=1)
    sin = next(c for c in log.calls if c.name == "aten::sin")
    assert sin.outputs[0][0] == "digest"  # read, not an opaque wrapper


def test_inference_tensors_are_digested_at_every_use(native: Any) -> None:
    with torch.inference_mode():
        x = torch.randn(4)

    def body(_: int) -> None:
        with torch.inference_mode():
            (x + 1).sum()

    logs = _logs(native, body)
    assert compare_runs(logs).reproducible
    assert logs[0].calls[0].inputs[0][0] == "digest"


def test_only_one_recorder_records_at_a_time(native: Any) -> None:
    first = NativeRecorder(native)
    with first:
        second = NativeRecorder(native)
        with pytest.raises(RuntimeError, match="another native op recorder is active"):
            second.__enter__()
    assert first.finish().calls == []


def test_an_observer_error_does_not_break_the_op(
    native: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = native.RunRecorder()
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def observer(index: int, name: str) -> None:
        raise ValueError("observer broke")

    recorder.set_observer(observer)
    recorder.start()
    try:
        y = torch.ones(3) * 2
    finally:
        recorder.stop()
    assert y.tolist() == [2.0, 2.0, 2.0]
    assert [type(u.exc_value) for u in unraisable] == [ValueError, ValueError]
    _fingerprint, _keys, _uses, failure = recorder.finish()
    assert [row[0] for row in recorder.rows()] == ["aten::ones", "aten::mul"]
    assert failure is None


def test_alike_runs_are_compared_without_building_their_calls(native: Any) -> None:
    x = torch.randn(16)
    recorders = []
    logs = []
    for _ in range(3):
        recorder = NativeRecorder(native, recorders[-1] if recorders else None)
        with recorder:
            (x.sin() * 2).sum()
        recorders.append(recorder)
        logs.append(recorder.finish())
    assert len({log.fingerprint for log in logs}) == 1
    result = compare_runs(logs)
    assert result.reproducible
    assert all(log.calls == [] and log.load is not None for log in logs)  # never built
    assert result.verdicts == {
        ("aten::sin", "cpu", "float32"): "deterministic",
        ("aten::mul", "cpu", "float32"): "deterministic",
        ("aten::sum", "cpu", "float32"): "deterministic",
    }
    full = compare_runs([log.loaded() for log in logs[:1]] + [RunLog(logs[1].loaded().calls)])
    assert full.verdicts == result.verdicts  # the op-by-op comparison agrees


def test_runs_that_differ_are_compared_op_by_op(native: Any, planted: ModuleType) -> None:
    x = torch.ones(4)
    logs = []
    for _ in range(2):
        recorder = NativeRecorder(native)
        with recorder:
            torch.ops.pbtest.noisy(x).sum()
        logs.append(recorder.finish())
    assert logs[0].fingerprint != logs[1].fingerprint
    result = compare_runs(logs)
    assert [d.op for d in result.blamed] == ["pbtest::noisy"]
    assert [c.name for c in logs[0].calls] == ["pbtest::noisy", "aten::sum"]


def test_python_values_are_keyed_like_the_python_recorder(native: Any) -> None:
    x = torch.ones(3)
    scale = iter([2.5, 3.25])
    logs = _logs(native, lambda _: torch.clamp(x, min=next(scale)), runs=2)
    a, b = logs[0].calls[0], logs[1].calls[0]
    assert a.inputs[1] == (2.5).hex() and b.inputs[1] == (3.25).hex()
    result = compare_runs(logs)
    assert result.unexplained is not None and result.unexplained.kind == "inputs"


def test_a_python_number_an_op_returns_is_compared_by_value(native: Any) -> None:
    x = torch.full((4,), 0.75)
    (log,) = _logs(native, lambda _: x.sum().item(), runs=1)
    item = next(c for c in log.calls if c.name == "aten::_local_scalar_dense")
    assert item.outputs == ((3.0).hex(),)


def _hook_keys() -> tuple[str, str]:
    """The thread's included and excluded dispatch key sets, as torch prints them."""
    return (
        repr(torch._C._dispatch_tls_local_include_set()),
        repr(torch._C._dispatch_tls_local_exclude_set()),
    )


def test_ops_nested_inside_a_recorded_op_are_not_recorded(native: Any) -> None:
    # mv runs empty and addmv_ inside its kernel; a Long scalar times a double
    # tensor runs a dtype conversion inside mul: only the calls the test made count.
    m, v = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    (log,) = _logs(native, lambda _: (m @ v) * 2, runs=1)
    assert _names(log) == ["aten::mv", "aten::mul"]


def test_the_hook_leaves_the_threads_dispatch_keys_as_it_found_them(native: Any) -> None:
    before = _hook_keys()
    recorder = NativeRecorder(native)
    with recorder:
        assert "DeferredInit" in _hook_keys()[0]
        torch.ones(2).add_(1)
    assert _hook_keys() == before
    recorder.finish()
    failing = NativeRecorder(native)
    with pytest.raises(RuntimeError, match="must match the size"), failing:
        torch.ones(2) + torch.ones(3)
    assert _hook_keys() == before
    assert [c.name for c in failing.finish().loaded().calls][-1] == "aten::add"


def test_ops_after_the_run_are_neither_recorded_nor_hooked(native: Any) -> None:
    recorder = NativeRecorder(native)
    with recorder:
        torch.zeros(3).add_(2)
    after = torch.ones(3) * 5  # outside the run
    assert after.tolist() == [5.0, 5.0, 5.0]
    assert _names(recorder.finish().loaded()) == ["aten::zeros", "aten::add_"]


def test_a_recorder_stopped_on_another_thread_stops_recording(native: Any) -> None:
    import threading

    recorder = native.RunRecorder()
    recorder.start()
    torch.ones(2)
    stopper = threading.Thread(target=recorder.stop)
    stopper.start()
    stopper.join()
    y = torch.ones(2) * 3  # the key is still set on this thread: ops only pass through
    assert y.tolist() == [3.0, 3.0]
    recorder.finish()
    assert [row[0] for row in recorder.rows()] == ["aten::ones"]
    after = native.RunRecorder()  # the next recorder on this thread cleans the key up
    after.start()
    after.stop()
    assert "DeferredInit" not in _hook_keys()[0]
