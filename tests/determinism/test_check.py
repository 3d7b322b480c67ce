"""``check``: one test's runs in, its verdict out, each stage called once and in order.

The stages are replaced by recording stand-ins (no torch, no pytester): what
is checked here is the orchestration, on the four ways a test's runs end.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest

from pytest_backends.determinism import check as check_module
from pytest_backends.determinism import verdict
from pytest_backends.determinism.api import NondeterministicOpError
from pytest_backends.determinism.census import Baseline, BaselineEntry
from pytest_backends.determinism.check import Recorded, check
from pytest_backends.determinism.compare import Comparison, Divergence
from pytest_backends.determinism.location import Location
from pytest_backends.determinism.record import RunLog, RunRecord
from pytest_backends.determinism.settings import Settings

KEY = ("aten::index_add_", "cpu", "float32")
PLACE = Location("test_x.py", 3, "test_x", None, None)


def _divergence(kind: str) -> Divergence:
    return Divergence(kind, 1, 0, KEY[0], KEY[1], KEY[2], output_index=0, origin="an opaque input")


def _comparison(kind: str | None) -> Comparison:
    found = _divergence(kind) if kind else None
    return Comparison(
        runs=3,
        blamed=[found] if found and kind == "op" else [],
        unexplained=found if kind in ("op", "unproven") else None,
        verdicts={KEY: "nondeterministic" if kind == "op" else "deterministic"},
    )


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stages called, in order; locate places every divergence at :data:`PLACE`."""
    called: list[str] = []

    def locate(comparison: Comparison, run: Any, native: Any = None) -> Comparison:
        called.append("locate")
        run()

        def placed(d: Divergence | None) -> Any:
            return None if d is None else dataclasses.replace(d, location=PLACE)

        return dataclasses.replace(
            comparison,
            blamed=[placed(d) for d in comparison.blamed],
            unexplained=placed(comparison.unexplained),
        )

    fake = types.ModuleType("pytest_backends.determinism.locate")
    fake.locate = locate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pytest_backends.determinism.locate", fake)

    def spy(module: Any, name: str, stage: str) -> None:
        real = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            called.append(stage)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    spy(verdict, "explain_unchecked", "verdict")
    spy(verdict, "first_run_reason", "verdict")
    spy(verdict, "failure_of", "verdict: failure")
    spy(check_module, "entry_rows", "census entry")
    return called


def _check(
    comparison: Comparison,
    calls: list[str],
    runs: int = 3,
    baseline: Baseline | None = None,
    settings: Settings | None = None,
    **how: Any,
) -> Any:
    def compare(logs: Any, threads: Any) -> Comparison:
        calls.append("compare")
        return comparison

    records = [RunRecord(RunLog([])) for _ in range(runs)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check_module, "compare_runs", compare)
        return check(Recorded(records, **how), settings or Settings(runs=3), baseline or Baseline())


def test_a_blamed_op_is_compared_located_worded_and_entered_once(calls: list[str]) -> None:
    reruns: list[str] = []
    found = _check(
        _comparison("op"),
        calls,
        complete=True,
        restore=lambda: reruns.append("restore"),
        run_again=lambda: reruns.append("run"),
    )
    assert calls == ["compare", "locate", "verdict", "verdict: failure", "census entry"]
    assert reruns == ["restore", "run"]
    assert isinstance(found.failure, NondeterministicOpError)
    assert "test_x.py:3" in str(found.failure)
    assert found.reason is None and found.census == [
        {"op": KEY[0], "device": KEY[1], "dtype": KEY[2], "verdict": "nondeterministic"}
    ]


def test_an_unproven_op_is_located_for_its_reason_and_fails_nothing(calls: list[str]) -> None:
    found = _check(_comparison("unproven"), calls, complete=True)
    assert calls == ["compare", "locate", "verdict", "census entry"]
    assert found.failure is None and found.reason is not None and "test_x.py:3" in found.reason
    assert found.as_property()["check"] == "not checked"


def test_agreeing_runs_are_not_located(calls: list[str]) -> None:
    found = _check(_comparison(None), calls, complete=True)
    assert calls == ["compare", "verdict", "verdict: failure", "census entry"]
    assert found.failure is None and found.reason is None and not found.rerun_is_outcome


def test_runs_that_stopped_early_are_neither_located_nor_failed(calls: list[str]) -> None:
    first = _check(_comparison(None), calls, runs=1, first=ValueError("run 0"))
    assert calls == ["compare", "verdict", "census entry"]
    assert first.reason == "it failed in its first run, so it was not run again"
    calls.clear()
    raised = _check(_comparison(None), calls, runs=2, raised=(1, KeyError("run 1")))
    assert calls == ["compare", "verdict", "census entry"]
    assert not raised.rerun_is_outcome and raised.failure is None
    assert raised.reason.startswith("run 1 raised KeyError ('run 1') where run 0 passed")
    calls.clear()
    broken = _check(_comparison("op"), calls, complete=True, failure="RuntimeError: hook")
    assert calls == ["compare"]  # the harness failed: nothing to locate, word or enter
    assert broken.reason == "the determinism recorder failed: RuntimeError: hook"
    assert broken.census is None and broken.failure is None


@pytest.mark.parametrize("repeatable", [False, True])
def test_a_rerun_that_raised_after_a_blamed_op_is_judged_by_the_op(
    calls: list[str], repeatable: bool
) -> None:
    """The later run's exception never decides when the runs differed at a blamed op."""
    settings = Settings(runs=3, repeatable=repeatable)
    error = KeyError("run 1")
    new = _check(_comparison("op"), calls, runs=2, raised=(1, error), settings=settings)
    assert calls == ["compare", "locate", "verdict", "verdict: failure", "census entry"]
    assert not new.rerun_is_outcome and new.reason is None
    assert isinstance(new.failure, NondeterministicOpError) and new.failure.op == KEY[0]
    message = str(new.failure)
    assert message.startswith(f"nondeterministic op {KEY[0]} (cpu, float32) at test_x.py:3")
    assert message.splitlines()[-1].startswith("  run 1 then raised KeyError: 'run 1'")

    accepting = Baseline((BaselineEntry(*KEY),))
    accepted = _check(
        _comparison("op"), calls, runs=2, raised=(1, error), settings=settings, baseline=accepting
    )
    assert not accepted.rerun_is_outcome and accepted.failure is None
    assert accepted.reason == (
        "run 1 raised KeyError ('run 1') where run 0 passed, after the runs differed at "
        "nondeterministic op(s) accepted by the baseline: aten::index_add_ (cpu, float32); "
        "the test keeps run 0's outcome"
    )
    assert accepted.census == [
        {"op": KEY[0], "device": KEY[1], "dtype": KEY[2], "verdict": "nondeterministic"}
    ]


def test_a_stage_that_raises_makes_the_test_not_checked(calls: list[str]) -> None:
    def compare(logs: Any, threads: Any) -> Comparison:
        raise RuntimeError("compare broke\nsecond line")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check_module, "compare_runs", compare)
        found = check(
            Recorded([RunRecord(RunLog([]))] * 3, complete=True), Settings(runs=3), Baseline()
        )
    assert found.reason == "the determinism recorder failed: RuntimeError: compare broke"
    assert found.census is None and found.failure is None and calls == []
