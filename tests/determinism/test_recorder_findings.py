"""Verdicts of the op recorder that must not blame kernels: workspaces, uninitialised reads.

Also: source locations of blamed ops, keys carried between runs, and the cap on N.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from pytest_backends.determinism.api import RngState
from pytest_backends.determinism.compare import Comparison, compare_runs
from pytest_backends.determinism.feature import MAX_RUNS, parse_runs
from pytest_backends.determinism.locate import locate
from pytest_backends.determinism.record import Digest, RunLog
from pytest_backends.determinism.record_python import PythonRecorder
from pytest_backends.determinism.verdict import describe_divergence


def _record(fn: Callable[[int], object], runs: int = 3) -> tuple[list[RunLog], Comparison]:
    """Record ``runs`` runs as the plugin does (keys carried over), then locate findings."""
    start = RngState.capture()
    logs = []
    recorder = None
    for run in range(runs):
        start.restore()
        recorder = PythonRecorder(previous=recorder)
        with recorder:
            fn(run)
        logs.append(recorder.finish())
    start.restore()
    return logs, locate(compare_runs(logs), lambda: fn(0))


def _garbage(t: torch.Tensor, run: int) -> None:
    """Write run-dependent bytes that no recorded op wrote: what the allocator may hand out."""
    with _disable_current_modes(), torch.no_grad():
        t.fill_(float(run) + 0.5)


def test_oneDNN_rnn_workspace_is_not_a_result() -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 64, batch_first=True)

    def body(_run: int) -> None:
        lstm.zero_grad(set_to_none=True)
        out, (h, c) = lstm(torch.randn(4, 20, 32))
        torch.autograd.backward(
            [out, h, c], [torch.randn_like(out), torch.randn_like(h), torch.randn_like(c)]
        )

    logs, result = _record(body)
    names = [c.name for c in logs[0].calls]
    assert "aten::mkldnn_rnn_layer" in names and "aten::mkldnn_rnn_layer_backward" in names
    layer = next(c for c in logs[0].calls if c.name == "aten::mkldnn_rnn_layer")
    assert layer.outputs[3][0] == "workspace"
    assert all(isinstance(slot, Digest) for slot in layer.outputs[:3])
    assert result.reproducible, [describe_divergence(d, 3) for d in result.blamed]
    assert result.verdicts[("aten::mkldnn_rnn_layer", "cpu", "float32")] == "deterministic"


def test_reading_uninitialised_memory_is_its_own_finding() -> None:
    def body(run: int) -> None:
        e = torch.empty(100)
        _garbage(e, run)
        (e + 1).sum()

    _logs, result = _record(body)
    assert result.blamed == [] and result.unexplained is None
    (finding,) = result.uninitialized
    assert (finding.kind, finding.op) == ("uninitialized", "aten::add")
    assert finding.origin is not None
    assert finding.origin.startswith("aten::empty (test_recorder_findings.py:")
    text = describe_divergence(finding, 3)
    assert text.startswith(
        "reads uninitialised memory from aten::empty (test_recorder_findings.py:"
    )
    assert "in body" in text and "not a nondeterministic kernel" in text
    assert result.verdicts[("aten::add", "cpu", "float32")] == "reads_uninitialized"
    assert not result.reproducible


@pytest.mark.parametrize("path", ["view", "in-place", "partial-write", "new_empty"])
def test_taint_follows_views_and_in_place_ops(path: str) -> None:
    def body(run: int) -> None:
        base = torch.ones(4, 6)
        e = base.new_empty(4, 6) if path == "new_empty" else torch.empty(4, 6)
        _garbage(e, run)
        if path == "view":
            e.t()[1:].mul(2)
        elif path == "in-place":
            e.add_(1).exp()
        elif path == "partial-write":
            e[:2] = base[:2]  # the rest of e stays uninitialised
            e.sum(0)
        else:
            torch.cat([base, e])

    _logs, result = _record(body)
    assert result.blamed == [] and result.unexplained is None
    assert [d.kind for d in result.uninitialized] == ["uninitialized"]
    origin = "aten::new_empty" if path == "new_empty" else "aten::empty"
    assert result.uninitialized[0].origin.startswith(origin + " (")  # type: ignore[union-attr]


def test_fully_written_uninitialised_memory_is_fine() -> None:
    def body(run: int) -> None:
        x = torch.randn(5, 3)
        a = torch.empty(5, 3)
        _garbage(a, run)
        a.copy_(x)
        b = torch.empty(5, 3)
        _garbage(b, run)
        for i in range(5):
            b[i] = x[i] * 2  # every row written through a view
        (a + b).sum()
        torch.empty(7).fill_(1.0).cumsum(0)

    _logs, result = _record(body)
    assert result.reproducible


def test_nondeterministic_kernel_is_still_blamed_next_to_uninitialised_reads(
    planted: ModuleType,
) -> None:
    def body(run: int) -> None:
        e = torch.empty(3)
        _garbage(e, run)
        e.neg()
        planted.noisy(torch.ones(3))

    _logs, result = _record(body)
    assert [d.op for d in result.uninitialized] == ["aten::neg"]
    assert [d.op for d in result.blamed] == ["pbtest::noisy"]


class _Block(torch.nn.Module):
    def __init__(self, planted: ModuleType) -> None:
        super().__init__()
        self.planted = planted
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.planted.noisy(self.proj(x))


class _Net(torch.nn.Module):
    def __init__(self, planted: ModuleType) -> None:
        super().__init__()
        self.planted = planted
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), _Block(planted)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.planted.spread(x, 8)


def test_blame_names_source_line_module_path_and_forward_op(planted: ModuleType) -> None:
    torch.manual_seed(0)
    net = _Net(planted)

    def body(_run: int) -> None:
        net.zero_grad(set_to_none=True)
        y = net(torch.randn(3, 4))
        y.backward(torch.randn(3, 4, 8))

    _logs, result = _record(body)
    noisy, backward = result.blamed
    assert noisy.location is not None and backward.location is not None
    assert noisy.location.file.endswith("test_recorder_findings.py")
    assert noisy.location.function == "forward"
    assert (noisy.location.module, noisy.location.module_type) == ("layers.1", "_Block")
    assert "test_recorder_findings.py:" in describe_divergence(noisy, 3)
    assert ", module layers.1 (_Block)" in describe_divergence(noisy, 3)
    assert backward.op == "pbtest::spread_backward"
    assert backward.location.forward_op == "pbtest::spread"
    forward = backward.location.forward
    assert forward is not None and forward.module_type == "_Net" and forward.function == "forward"
    assert "backward of pbtest::spread called at" in describe_divergence(backward, 3)


def test_outside_tensors_changed_between_runs_are_keyed_by_content() -> None:
    weight = torch.randn(4, 4)
    seen: list[object] = []

    def clean(_run: int) -> None:
        (torch.ones(2, 4) @ weight).sum()

    logs, result = _record(clean)
    keys = [next(c for c in log.calls if c.name == "aten::mm").inputs[1] for log in logs]
    assert isinstance(keys[0], Digest) and keys[0] == keys[1] == keys[2]
    # Unchanged and unwritten: its key is carried to the next run, not read again.
    assert result.reproducible

    def sneaky(_run: int) -> None:
        (torch.ones(2, 4) @ weight).sum()
        weight.data.add_(1)  # .data bypasses the version counter
        seen.append(weight._version)

    _logs, result = _record(sneaky)
    assert len(set(seen)) == 1
    assert result.blamed == []
    assert result.unexplained is not None and result.unexplained.kind == "inputs"
    assert result.unexplained.op == "aten::mm"


def test_runs_are_capped_with_a_reason() -> None:
    assert parse_runs(str(MAX_RUNS), "--backends-determinism") == MAX_RUNS
    with pytest.raises(pytest.UsageError, match="at most 1000 runs, got 1000000000") as info:
        parse_runs("1000000000", "--backends-determinism")
    assert "multiplies the session's time" in str(info.value)


SUITE = """
import pytest
import torch

calls = iter(range(100))

def test_lstm_workspace():
    lstm = torch.nn.LSTM(32, 64, batch_first=True)
    out, _ = lstm(torch.randn(4, 20, 32))
    out.backward(torch.randn_like(out))

def test_reads_garbage():
    e = torch.empty(100)
    e.numpy()[:] = next(calls)  # unseen by any recorder: stands in for what the allocator hands out
    (e + 1).sum()

class Block(torch.nn.Module):
    def forward(self, x):
        return torch.ops.pbtest.noisy(x)

def test_noisy_in_module():
    Block()(torch.ones(3))
"""


def test_suite_findings_census_and_baseline(planted_conftest: pytest.Pytester) -> None:
    pytester = planted_conftest
    pytester.makepyfile(test_findings=SUITE)
    result = pytester.runpytest_subprocess(
        "--backends-determinism-all",
        "--backends-determinism=3",
        "--backends-census=census.json",
        "--backends-baseline=baseline.json",
        "--backends-baseline-update",
    )
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "reads uninitialised memory from aten::empty (test_findings.py:12): aten::add" in out
    assert "test_findings.py:14 in test_reads_garbage" in out
    census = json.loads((pytester.path / "census.json").read_text())
    verdicts = {row["op"]: row["verdict"] for row in census["entries"]}
    assert verdicts["aten::add"] == "reads_uninitialized"
    assert verdicts["aten::mkldnn_rnn_layer"] == "deterministic"
    assert verdicts["pbtest::noisy"] == "nondeterministic"
    baseline = json.loads((pytester.path / "baseline.json").read_text())
    accepted = {entry["op"] for entry in baseline["accepted"]}
    assert accepted == {"pbtest::noisy"}  # never the uninitialised read
    # Without a baseline both fail, and the blame names the line and the module.
    result = pytester.runpytest_subprocess("--backends-determinism-all", "--backends-determinism=2")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*nondeterministic op pbtest::noisy (cpu, float32) at test_findings.py:18 in forward, "
            "module Block (outermost)*"
        ]
    )
    result.stdout.fnmatch_lines(["*FAILED test_findings.py::test_reads_garbage*"])
