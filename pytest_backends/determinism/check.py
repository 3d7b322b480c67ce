"""The determinism check of one test: its recorded runs in, its verdict out.

:func:`check` is the one place the pipeline runs, each stage once and in order:
:mod:`~pytest_backends.determinism.compare` (stage 2: which op, if any, is blamed),
:mod:`~pytest_backends.determinism.locate` (stage 3: one more run for the source
lines, only when there is something to place), :mod:`~pytest_backends.determinism.verdict`
(stage 4: "checked" or "not checked" and why, and the failure to raise) and the
test's census entry (:func:`~pytest_backends.determinism.census.entry_rows`).
Its input, :class:`Recorded`, is what stage 1
(:mod:`~pytest_backends.determinism.record`, run by
:mod:`~pytest_backends.determinism.runs`) left; its output, :class:`Verdict`, is
what the hook layer (:mod:`~pytest_backends.determinism.plugin`) attaches to the
test's reports and raises.

The rule: a test keeps run 0's outcome unless an op is blamed (or
``--backends-determinism-repeatable`` fails tests that are not repeatable); the
harness's own failure (here: any exception of a stage) is never the test's.

Nothing here imports pytest or torch; stage 3 imports torch when a run is located.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_backends.determinism import verdict
from pytest_backends.determinism.census import entry_rows
from pytest_backends.determinism.compare import Comparison, compare_runs
from pytest_backends.determinism.record import RunRecord, failure_text

if TYPE_CHECKING:
    from pytest_backends.determinism.api import NondeterministicOpError
    from pytest_backends.determinism.census import Baseline
    from pytest_backends.determinism.settings import Settings

__all__ = ["Recorded", "Verdict", "check"]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Recorded:
    """What the runs of one test left, as the check reads it.

    ``records`` are every run's record, in order. ``complete`` is True when
    every run ran (the check may then locate, and may fail the test);
    otherwise the runs stopped early: run 0 raised or stored ``first``, a
    subtest failed in run 0 (``subtest_failed``), a later run raised
    (``raised``: its number and exception), or the harness failed
    (``failure``, one line). ``restore`` and ``run_again`` repeat run 0 for
    stage 3; ``native`` is the extension module when the native recorder
    recorded the runs, and ``described`` says which recorder did. ``carried``
    names the state the test keeps between runs that the harness cannot reset
    (:func:`~pytest_backends.determinism.carried.carried_state`), asked for only
    when the runs differ with nothing to blame. ``expected_failure`` says that
    run 0's exception is the one an ``xfail`` marker expects.
    """

    records: Sequence[RunRecord]
    failure: str | None = None
    described: str | None = None
    native: Any = None
    complete: bool = False
    first: BaseException | None = None
    subtest_failed: bool = False
    raised: tuple[int, BaseException] | None = None
    restore: Callable[[], object] = _nothing
    run_again: Callable[[], object] = _nothing
    carried: Callable[[], Sequence[str]] = tuple
    expected_failure: bool = False


@dataclass(frozen=True)
class Verdict:
    """One test's verdict: checked or not (and why), its census entry, its failure.

    ``census`` is the test's census entry (None when its runs could not be
    compared). ``failure`` is the error the test fails with (an op blamed, or
    runs that differ with nothing to blame); ``rerun_is_outcome`` says whether a
    later run's exception (:attr:`Recorded.raised`) is the test's outcome: only
    under ``--backends-determinism-repeatable``, when no op was blamed before it
    (after a blamed op the op decides, see :func:`check`).
    """

    reason: str | None
    notes: list[str] = field(default_factory=list)
    recorder: str | None = None
    census: list[dict[str, Any]] | None = None
    failure: NondeterministicOpError | None = None
    rerun_is_outcome: bool = False

    def as_property(self) -> dict[str, Any]:
        """The report property of the check (``{"check", "reason", "boundary", "recorder"}``)."""
        return {
            "check": "not checked" if self.reason else "checked",
            "reason": self.reason,
            "boundary": self.notes,
            "recorder": self.recorder,
        }


def _compared(records: Sequence[RunRecord]) -> Sequence[RunRecord]:
    """The runs to compare: all, or all but a compiling run 0 when others follow."""
    if len(records) > 2 and records[0].compiled:
        return records[1:]
    return records


def _diverged_at_op(comparison: Comparison | None) -> bool:
    """Whether the runs differ at an op that is blamed (or that read uninitialised memory)."""
    return comparison is not None and bool(comparison.blamed or comparison.uninitialized)


def _to_locate(comparison: Comparison, single: bool, recorded: Recorded) -> bool:
    """Whether stage 3 places what stage 2 found.

    A blamed op or an uninitialised read is placed for the failure message
    (also when a later run raised after it: the op decides the verdict); an op
    whose differing output cannot be blamed ("unproven") is placed for the
    "not checked" reason, which names its line, when every run ran.
    """
    if _diverged_at_op(comparison):
        return not single and (recorded.complete or recorded.raised is not None)
    unexplained = comparison.unexplained
    return recorded.complete and unexplained is not None and unexplained.kind == "unproven"


def _reason(
    comparison: Comparison, compared: Sequence[RunRecord], recorded: Recorded, single: bool
) -> str | None:
    """Why the test is not checked (None: it is), from the compared runs."""
    if single:
        return verdict.first_run_reason(
            recorded.first, recorded.subtest_failed, recorded.expected_failure
        )
    carried: Sequence[str] = ()
    if comparison.unexplained is not None:
        carried = recorded.carried()
    reason = verdict.explain_unchecked(comparison, compared, carried)
    blind = next((r.blind for r in recorded.records if r.blind), None)
    if blind and not (comparison.blamed or comparison.uninitialized):
        return blind
    return reason


def check(recorded: Recorded, settings: Settings, baseline: Baseline) -> Verdict:
    """The verdict on one test's runs under ``settings`` and the accepted ``baseline``."""
    records = recorded.records
    compared = _compared(records)
    single = len(compared) < 2
    failure = recorded.failure
    comparison: Comparison | None = None
    notes: list[str] = []
    reason: str | None = None
    try:
        threads = sorted({name for r in records for name in r.threads})
        comparison = compare_runs([r.log for r in compared], threads)
        notes = verdict.boundary_notes(records)
        if failure is None and _to_locate(comparison, single, recorded):
            from pytest_backends.determinism.locate import locate

            recorded.restore()
            comparison = locate(comparison, recorded.run_again, recorded.native)
        if failure is None:
            reason = _reason(comparison, compared, recorded, single)
    except Exception as exc:
        failure = failure or failure_text(exc)
    if failure is not None:
        reason, comparison = verdict.recorder_failed(failure), None
    diverged = _diverged_at_op(comparison)
    if recorded.raised is not None and comparison is not None and diverged:
        return _after_divergence(recorded, comparison, notes, settings, baseline)
    if recorded.raised is not None and failure is None:
        reason = verdict.rerun_raised(*recorded.raised) + verdict.carried_note(recorded.carried())
    repeatable = settings.repeatable and failure is None and not single
    if repeatable:
        reason = None  # not repeatable is a failure here, reported as such
    error = None
    if recorded.complete and comparison is not None and reason is None:
        error = verdict.failure_of(
            comparison, notes, baseline, settings.baseline, settings.baseline_update
        )
    return Verdict(
        reason,
        notes,
        recorded.described,
        None if comparison is None else entry_rows(comparison.verdicts),
        error,
        recorded.raised is not None and repeatable,
    )


def _after_divergence(
    recorded: Recorded,
    comparison: Comparison,
    notes: list[str],
    settings: Settings,
    baseline: Baseline,
) -> Verdict:
    """The verdict when a later run raised after the runs differed at an op.

    The op comparison decides, never the later run's exception (which may
    well follow from the op's differing output): an op the baseline does not
    accept (or an uninitialised read) fails the test, naming the op first and
    the exception after it; otherwise the test keeps run 0's outcome and is
    not checked, the reason naming the accepted ops. So under
    ``--backends-determinism-repeatable`` too.
    """
    assert recorded.raised is not None
    explained = dataclasses.replace(comparison, unexplained=None)
    error = verdict.failure_of(
        explained, notes, baseline, settings.baseline, settings.baseline_update, recorded.raised
    )
    reason = None
    if error is None:
        reason = verdict.rerun_raised_after(
            *recorded.raised, comparison.blamed, settings.baseline_update
        )
    return Verdict(reason, notes, recorded.described, entry_rows(comparison.verdicts), error, False)
