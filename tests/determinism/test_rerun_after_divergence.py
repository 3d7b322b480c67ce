"""A later run that raises after the runs diverged at an op: the op decides the verdict.

Run 0 passes; a later run differs at a nondeterministic op and then raises
(here: the test mutates a function-scoped fixture value shared by all runs).
The verdict comes from the op comparison, never from the later run's
exception: an op the baseline accepts leaves the test with run 0's outcome
(passed), reported as not checked with the reason; an op it does not accept
fails the test with a message that names the op first, the later run's
exception following as context. Each case is a real pytest session.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch
from sessions import RECORDERS, session

TESTS = """
import pytest
import torch

@pytest.fixture
def calls():
    return []

@pytest.mark.backends(deterministic="on")
def test_raises_in_run_1(calls):
    torch.ops.pbtest.noisy(torch.ones(3))
    calls.append(1)
    assert len(calls) == 1

@pytest.mark.backends(deterministic="on")
def test_raises_in_run_2(calls):
    torch.ops.pbtest.noisy(torch.ones(3))
    calls.append(1)
    assert len(calls) < 3

@pytest.mark.backends("deterministic")
def test_positional_marker(calls):
    torch.ops.pbtest.noisy(torch.ones(3))
    calls.append(1)
    if len(calls) > 1:
        pytest.fail("the fixture value carried over")

@pytest.mark.backends(deterministic="on")
def test_plain_not_repeatable(calls):
    torch.ones(3).add(1)
    calls.append(1)
    assert len(calls) == 1
"""

#: The tests that hit the planted op, and how many.
NOISY = ["test_raises_in_run_1", "test_raises_in_run_2", "test_positional_marker"]


def _baseline(pytester: pytest.Pytester, accepted: list[dict[str, str]]) -> None:
    pytester.path.joinpath("baseline.json").write_text(
        json.dumps(
            {
                "format": "pytest-backends-baseline",
                "version": 1,
                "torch": str(torch.__version__),
                "cuda": torch.version.cuda,
                "accepted": accepted,
            }
        ),
        encoding="utf-8",
    )


def _accept_noisy(pytester: pytest.Pytester) -> None:
    _baseline(pytester, [{"op": "pbtest::noisy", "device": "cpu", "dtype": "float32"}])


def _messages(pytester: pytest.Pytester, name: str) -> dict[str, str]:
    """Each failed test's JUnit failure message and text, by test name."""
    return {
        str(case.get("name")): f"{failure.get('message', '')}\n{failure.text or ''}"
        for case in ET.parse(pytester.path / name).getroot().iter("testcase")
        for failure in case.iter("failure")
    }


def _assert_not_checked_for_accepted_op(result: pytest.RunResult, notes: int = 0) -> None:
    """Every test with the op is not checked, naming it as accepted; none of them failed.

    ``notes``: how many failures carry a later run's exception (tests with no op to blame).
    """
    out = result.stdout.str()
    lines = [line for line in result.stdout.lines if line.startswith("not checked:")]
    for name in NOISY:
        line = next((x for x in lines if f"::{name}:" in x), None)
        assert line is not None, out
        assert "pbtest::noisy (cpu, float32)" in line and "accepted by the baseline" in line, line
        assert not any(x.startswith("FAILED") and name in x for x in result.stdout.lines), out
    # the failures' own sections (under CI=true pytest repeats whole messages in the summary)
    sections = out.split("short test summary info")[0]
    assert sections.count("(raised in determinism run") == notes, out


@pytest.mark.parametrize("recorder", RECORDERS)
def test_an_accepted_op_keeps_the_plain_outcome(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe: the runs differ at an accepted op, run 1 (or 2) raises: the test passes."""
    planted_conftest.makepyfile(test_rerun=TESTS)
    _accept_noisy(planted_conftest)
    result = session(
        planted_conftest,
        recorder,
        monkeypatch,
        "--backends-determinism=3",
        "--backends-baseline=baseline.json",
    )
    result.assert_outcomes(passed=4)
    _assert_not_checked_for_accepted_op(result)
    # The test without the op is not checked as before: not repeatable.
    result.stdout.fnmatch_lines(["not checked: *test_plain_not_repeatable: run 1 raised*"])
    assert result.ret == 0


@pytest.mark.parametrize("recorder", RECORDERS)
def test_an_op_not_accepted_fails_the_test_by_name(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the op in a baseline the test fails, and its failure names the op first."""
    planted_conftest.makepyfile(test_rerun=TESTS)
    result = session(
        planted_conftest, recorder, monkeypatch, "--backends-determinism=3", "--junitxml=out.xml"
    )
    result.assert_outcomes(passed=1, failed=3)
    for name in NOISY:
        result.stdout.fnmatch_lines([f"FAILED test_rerun.py::{name} - nondeterministic op*"])
    messages = _messages(planted_conftest, "out.xml")
    assert sorted(messages) == sorted(NOISY)
    for name, message in messages.items():
        assert message.startswith("nondeterministic op pbtest::noisy (cpu, float32)"), message
        # The later run's exception follows as context.
        run = 2 if name == "test_raises_in_run_2" else 1
        assert f"run {run} then raised " in message, message
    assert "(raised in determinism run" not in result.stdout.str()


def test_a_baseline_without_the_op_fails_the_test_with_the_hint(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted_conftest.makepyfile(test_rerun=TESTS)
    _baseline(planted_conftest, [])
    result = session(
        planted_conftest,
        "python",
        monkeypatch,
        "--backends-determinism=3",
        "--backends-baseline=baseline.json",
        "-k",
        "run_1",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "nondeterministic op pbtest::noisy (cpu, float32) at test_rerun.py:10 *",
            "  accept with: pytest --backends-baseline=*",
            "  run 1 then raised AssertionError: assert 2 == 1 *",
            "FAILED *test_raises_in_run_1 - nondeterministic op*",
        ]
    )


def test_repeatable_mode_takes_the_verdict_from_the_op(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--backends-determinism-repeatable``: the op's verdict, not the rerun's exception."""
    planted_conftest.makepyfile(test_rerun=TESTS)
    _accept_noisy(planted_conftest)
    accepted = session(
        planted_conftest,
        "python",
        monkeypatch,
        "--backends-determinism=3",
        "--backends-baseline=baseline.json",
        "--backends-determinism-repeatable",
    )
    # Only the test with no op to blame is not repeatable, and fails as such.
    accepted.assert_outcomes(passed=3, failed=1)
    accepted.stdout.fnmatch_lines(["FAILED *test_plain_not_repeatable - assert 2 == 1"])
    _assert_not_checked_for_accepted_op(accepted, notes=1)

    new = session(
        planted_conftest,
        "python",
        monkeypatch,
        "--backends-determinism=3",
        "--backends-determinism-repeatable",
        "-k",
        "run_1 or run_2",
    )
    new.assert_outcomes(failed=2)
    new.stdout.fnmatch_lines(
        [
            "FAILED *test_raises_in_run_1 - nondeterministic op*",
            "FAILED *test_raises_in_run_2 - nondeterministic op*",
        ]
    )


def test_baseline_update_adds_the_op_and_keeps_the_plain_outcome(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted_conftest.makepyfile(test_rerun=TESTS)
    result = session(
        planted_conftest,
        "python",
        monkeypatch,
        "--backends-determinism=3",
        "--backends-baseline=baseline.json",
        "--backends-baseline-update",
        "-k",
        "run_1",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["not checked: *test_raises_in_run_1: *pbtest::noisy (cpu, float32)*"]
    )
    written = json.loads((planted_conftest.path / "baseline.json").read_text(encoding="utf-8"))
    assert written["accepted"] == [{"op": "pbtest::noisy", "device": "cpu", "dtype": "float32"}]


def test_the_verdicts_hold_under_xdist(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    planted_conftest.makepyfile(test_rerun=TESTS)
    _accept_noisy(planted_conftest)
    accepted = planted_conftest.runpytest_subprocess(
        "-n", "2", "--backends-determinism=3", "--backends-baseline=baseline.json"
    )
    accepted.assert_outcomes(passed=4)
    _assert_not_checked_for_accepted_op(accepted)

    new = planted_conftest.runpytest_subprocess(
        "-n", "2", "--backends-determinism=3", "--junitxml=out.xml"
    )
    new.assert_outcomes(passed=1, failed=3)
    messages = _messages(planted_conftest, "out.xml")
    assert sorted(messages) == sorted(NOISY)
    assert all(m.startswith("nondeterministic op pbtest::noisy") for m in messages.values())
