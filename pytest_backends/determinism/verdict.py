"""Stage 4 of the determinism pipeline: the verdict, in words.

Every sentence the check writes about a test is built here, and only here:
the failure message of a test whose op is blamed
(:class:`~pytest_backends.determinism.api.NondeterministicOpError`, from
:func:`failure_of`), each :class:`~pytest_backends.determinism.compare.Divergence`
described (:func:`describe_divergence`), and the reasons a test is "not
checked" (:func:`explain_unchecked` when the runs' inputs differ,
:func:`rerun_raised`, :func:`rerun_raised_after`, :func:`first_run_reason`,
:func:`recorder_failed`) or
checked only at a boundary (:func:`boundary_notes`); the one sentence a recorder
writes while recording, why ops went unseen, is stage 1's
(:func:`~pytest_backends.determinism.record.unseen_reason`).
The rule behind them: a test keeps run 0's outcome unless an op is blamed
(or ``--backends-determinism-repeatable`` fails tests that are not repeatable);
the harness's own failure is never the test's.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_backends.determinism.api import NondeterministicOpError
from pytest_backends.determinism.op_tables import SLOT_TAGS
from pytest_backends.determinism.record import Digest, RunRecord

if TYPE_CHECKING:
    from pytest_backends.determinism.census import Baseline, Key
    from pytest_backends.determinism.compare import Comparison, Divergence
    from pytest_backends.determinism.record import OpCall

__all__ = [
    "INPUTS_DIFFER",
    "accept_hint",
    "also_lines",
    "boundary_notes",
    "describe_divergence",
    "explain_unchecked",
    "failure_of",
    "first_run_reason",
    "format_key",
    "recorder_failed",
    "rerun_raised",
    "rerun_raised_after",
]

#: The verdict's reason when runs differ only because their inputs did.
INPUTS_DIFFER = "its inputs differ between runs (Python state outside torch ops)"


def describe_divergence(d: Divergence, runs: int) -> str:
    """A sentence for a failure message: what ``d`` found, where, in how many runs."""
    where = ", ".join(x for x in (d.device, d.dtype) if x)
    where = f" ({where})" if where else ""
    at = f" at {d.location.describe()}" if d.location is not None else ""
    if d.kind == "op":
        return (
            f"nondeterministic op {d.op}{where}{at}: output {d.output_index} differs "
            f"between run 0 and run {d.run} from identical inputs "
            f"(op #{d.op_index} of the run; {runs} runs)"
        )
    if d.kind == "unproven":
        return (
            f"{d.op}{where}{at} (op #{d.op_index}) gave a different output "
            f"{d.output_index} in run {d.run}, but its {d.origin} cannot be "
            "proven equal between runs, so the op is not blamed"
        )
    if d.kind == "uninitialized":
        return (
            f"reads uninitialised memory from {d.origin}: {d.op}{where}{at} "
            f"(op #{d.op_index}, output {d.output_index}) differs between run 0 and "
            f"run {d.run} because it read memory that no op wrote; initialise it "
            "(torch.zeros, torch.full) or write every element before reading it. This is "
            "a bug in the test or the code under test, not a nondeterministic kernel"
        )
    if d.kind == "inputs":
        return (
            f"run {d.run} first differs from run 0 at op {d.op}{where}{at} "
            f"(op #{d.op_index}, output {d.output_index}), but that op's inputs "
            "already differed: the difference comes from outside torch ops, e.g. state "
            "carried over between runs (function-scoped fixture values are shared by all "
            "runs; a test that mutates them, or a module or global, is not repeatable) "
            "or randomness not drawn from torch, random or numpy"
        )
    return (
        f"run {d.run} called a different op sequence than run 0 from op "
        f"#{d.op_index} on (run 0: {d.op}, run {d.run}: {d.other_op}){at} "
        "with no op output differing before: control flow depends on something "
        "outside torch ops"
    )


def failure_of(
    comparison: Comparison,
    notes: Sequence[str],
    baseline: Baseline,
    baseline_path: Path | None,
    updating: bool,
    raised: tuple[int, BaseException] | None = None,
) -> NondeterministicOpError | None:
    """The test's failure when ``comparison`` blames an op the baseline does not accept.

    Uninitialised reads are never accepted (the test reads garbage); a
    divergence no op is blamed for fails too (the caller only asks when the
    test was checked). ``notes`` are the parts checked only at their boundary.
    ``raised`` is the number and exception of a later run that raised after
    the runs differed at the op: the message names it after the op.
    """
    after = [] if raised is None else [_then_raised(*raised)]
    blamed = comparison.blamed
    runs = comparison.runs
    new = [] if updating else [d for d in blamed if not baseline.accepts((d.op, d.device, d.dtype))]
    unexplained = comparison.unexplained
    if comparison.uninitialized:
        first = comparison.uninitialized[0]
        lines = [describe_divergence(first, runs)]
        lines += also_lines(comparison.uninitialized, runs)
        return _error([*lines, *after], first)
    if new:
        first = new[0]
        lines = [describe_divergence(first, runs)]
        lines += also_lines(new, runs)
        accepted = [d for d in blamed if d not in new]
        if accepted:
            ops = ", ".join(sorted({d.op for d in accepted}))
            lines.append(f"  accepted by the baseline: {ops}")
        lines += [f"  checked only at their boundary: {note}" for note in notes]
        if baseline_path is not None:
            lines.append(f"  {accept_hint(baseline_path)}")
        return _error([*lines, *after], first)
    if unexplained is not None:
        lines = [f"not reproducible: {describe_divergence(unexplained, runs)}"]
        lines += [f"  checked only at their boundary: {note}" for note in notes]
        return _error([*lines, *after], unexplained, blame=False)
    return None


#: How many further findings a failure message shows (one line each, repeats counted).
ALSO_SHOWN = 5


def also_lines(found: Sequence[Divergence], runs: int) -> list[str]:
    """The ``also:`` lines after a failure's first finding, repeats counted, a few shown.

    Findings of the same op at the same place (a blamed op inside a loop) are one
    line with their count; at most :data:`ALSO_SHOWN` lines, then how many more.
    """
    groups: dict[tuple[Any, ...], list[Divergence]] = {}
    first = found[0] if found else None
    for d in found:
        where = d.location.describe() if d.location is not None else None
        groups.setdefault((d.kind, d.op, d.device, d.dtype, where), []).append(d)
    lines: list[str] = []
    for group in groups.values():
        rest = [d for d in group if d is not first]
        if not rest:
            continue
        more = len(rest) - 1
        text = f"  also: {describe_divergence(rest[0], runs)}"
        if more:
            text += f" (and {more} more call(s) like it)"
        lines.append(text)
    if len(lines) > ALSO_SHOWN:
        hidden = len(lines) - ALSO_SHOWN
        lines = [*lines[:ALSO_SHOWN], f"  ... and {hidden} more op(s) blamed, not shown"]
    return lines


def _error(lines: list[str], d: Divergence, blame: bool = True) -> NondeterministicOpError:
    return NondeterministicOpError(
        "\n".join(lines),
        op=d.op if blame else None,
        run=d.run,
        output_index=d.output_index,
        op_index=d.op_index,
    )


def _then_raised(run: int, error: BaseException) -> str:
    """The line after a failure's findings: the later run that raised after the divergence."""
    text = str(error).strip().splitlines()
    shown = f": {text[0][:200]}" if text else ""
    return (
        f"  run {run} then raised {type(error).__name__}{shown} (run 0 passed; the runs "
        "stopped there)"
    )


def accept_hint(baseline: Path) -> str:
    """The commands that accept new nondeterministic ops into ``baseline``."""
    return (
        f"accept with: pytest --backends-baseline={baseline} --backends-baseline-update "
        "(this job), or across jobs: pytest-backends baseline --census MERGED_CENSUS.json "
        f"{baseline}"
    )


def format_key(key: Key) -> str:
    """``"aten::index_add_ (cpu, float32)"``: a census key for the terminal."""
    op, device, dtype = key
    where = ", ".join(x for x in (device, dtype) if x)
    return f"{op} ({where})" if where else op


def rerun_raised(run: int, error: BaseException) -> str:
    """Why a test whose later run raised (run 0 passed) is not checked."""
    text = str(error).strip().splitlines()
    return (
        f"run {run} raised {type(error).__name__}"
        + (f" ({text[0][:200]})" if text else "")
        + " where run 0 passed: the test is not repeatable"
    )


def rerun_raised_after(
    run: int, error: BaseException, accepted: Sequence[Divergence], updating: bool
) -> str:
    """Why a test is not checked when its run ``run`` raised after differing at accepted ops.

    The test keeps run 0's outcome: the runs differ because of ``accepted``
    (blamed ops the baseline accepts, or that ``--backends-baseline-update``
    adds to it), and the exception may follow from their outputs.
    """
    text = str(error).strip().splitlines()
    ops = ", ".join(dict.fromkeys(format_key((d.op, d.device, d.dtype)) for d in accepted))
    how = "added to the baseline by this run" if updating else "accepted by the baseline"
    return (
        f"run {run} raised {type(error).__name__}"
        + (f" ({text[0][:200]})" if text else "")
        + f" where run 0 passed, after the runs differed at nondeterministic op(s) {how}: "
        f"{ops}; the test keeps run 0's outcome"
    )


def recorder_failed(failure: str) -> str:
    """Why a test is not checked when the recorder's own machinery failed."""
    return f"the determinism recorder failed: {failure}"


def first_run_reason(
    first: BaseException | None, subtest_failed: bool, expected: bool = False
) -> str:
    """Why a test was run once only, from run 0's exception (or its stored outcome).

    ``expected``: ``first`` is the failure an ``xfail`` marker expects.
    """
    import unittest

    import pytest

    if isinstance(first, pytest.xfail.Exception) or expected:
        return "it xfailed in its first run, so it was not run again"
    if isinstance(first, (pytest.skip.Exception, unittest.SkipTest)):
        return "it was skipped in its first run, so it was not run again"
    if first is None and subtest_failed:
        return "a subtest failed in its first run, so it was not run again"
    return "it failed in its first run, so it was not run again"


def _leaves(a: Any, b: Any) -> Iterator[tuple[Any, Any]]:
    """Pairs of differing leaf keys in two input keys (lists and keyword pairs are opened)."""
    if (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b)
        and not _is_tensor_key(a)
        and not _is_tensor_key(b)
        and not _is_generator_key(a)
    ):
        for x, y in zip(a, b):
            yield from _leaves(x, y)
    elif a != b:
        yield a, b


def _is_generator_key(key: Any) -> bool:
    return isinstance(key, tuple) and len(key) == 3 and key[0] == "generator"


def _is_tensor_key(key: Any) -> bool:
    if isinstance(key, Digest):
        return True
    return isinstance(key, tuple) and bool(key) and key[0] in SLOT_TAGS


def _show(key: Any) -> str:
    if isinstance(key, str):
        try:
            return repr(float.fromhex(key))  # floats are keyed by their exact hex form
        except ValueError:
            return repr(key)
    if isinstance(key, (int, bool)) or key is None:
        return repr(key)
    if isinstance(key, (tuple, list)) and not _is_tensor_key(key) and not _is_generator_key(key):
        shown = [_show(k) for k in key]
        if "?" not in shown:
            inner = ", ".join(shown) + ("," if len(shown) == 1 and isinstance(key, tuple) else "")
            return f"({inner})" if isinstance(key, tuple) else f"[{inner}]"
    return "?"


def carried_note(carried: Sequence[str]) -> str:
    """``"; state kept between runs ...: ..."``, naming ``carried``, or ``""``."""
    if not carried:
        return ""
    return "; state kept between runs that the harness cannot reset: " + "; ".join(carried)


def explain_unchecked(
    comparison: Comparison, runs: Sequence[RunRecord], carried: Sequence[str] = ()
) -> str | None:
    """Why the runs differ when no op is to blame, or None when they agree or an op is blamed.

    ``runs`` are the compared runs, in the order given to ``compare_runs``.
    ``carried`` names state kept between runs that the harness cannot reset
    (:func:`~pytest_backends.determinism.carried.carried_state`): it is named
    as the cause, and a differing generator is then not put down to threads.
    """
    reason = _explain(comparison, runs, bool(carried))
    return None if reason is None else reason + carried_note(carried)


def _explain(comparison: Comparison, runs: Sequence[RunRecord], carried: bool) -> str | None:
    d = comparison.unexplained
    if d is None or comparison.blamed or comparison.uninitialized:
        return None
    if d.kind == "sequence":
        return (
            f"{INPUTS_DIFFER}: run {d.run} called {d.other_op} where run 0 called {d.op} "
            f"(op #{d.op_index}) with every earlier op's result identical, so the control "
            "flow depends on something outside torch ops"
        )
    at = f" at {d.location.describe()}" if d.location is not None else ""
    if d.kind == "unproven":
        return (
            f"{d.op}{at} (op #{d.op_index}) gave a different output {d.output_index} in run "
            f"{d.run}, but its {d.origin} cannot be proven equal between runs, so no op is "
            "blamed (an op is blamed only when every input it received is proven equal)"
        )
    ref, other = runs[0], runs[d.run]
    a: OpCall = ref.log.calls[d.op_index]
    b: OpCall = other.log.calls[d.op_index]
    pairs = [p for x, y in zip(a.inputs, b.inputs) for p in _leaves(x, y)]
    if d.op_index in ref.outside or d.op_index in other.outside:
        shared = next(
            (i for i, (x, y) in enumerate(zip(a.inputs, b.inputs)) if x != y and _is_tensor_key(x)),
            None,
        )
        if shared is not None:
            place = ref.outside_places.get(d.op_index) or other.outside_places.get(d.op_index)
            if d.location is not None:
                place = f"{d.location.file}:{d.location.line}"
            where = f" at {place}" if place else ""
            return (
                f"{INPUTS_DIFFER}: input {shared} of {d.op} changed outside torch ops "
                f"(NumPy, DLPack or another process?){where} (op #{d.op_index}): it is "
                "memory shared with something outside torch, its bytes were read at the op "
                f"and differ between run 0 and run {d.run}"
            )
    generators = [(x, y) for x, y in pairs if _is_generator_key(x) or _is_generator_key(y)]
    threads = sorted({name for r in (ref, other) for name in r.threads})
    if generators and carried:
        return (
            f"{INPUTS_DIFFER}: the generator {d.op}{at} (op #{d.op_index}) draws from is in "
            f"a different state at call time in run {d.run} than in run 0"
        )
    if generators and threads:
        names = ", ".join(repr(t) for t in threads[:3])
        return (
            f"{INPUTS_DIFFER}: the generator {d.op}{at} (op #{d.op_index}) draws from was in a "
            f"different state at call time in run {d.run} than in run 0, and other threads "
            f"were running ({names}): another thread drawing from the same generator "
            "advances it between this thread's draws, or the test reseeds it from a value "
            "that changes between runs (a clock, a counter)"
        )
    if generators:
        return (
            f"{INPUTS_DIFFER}: the generator {d.op}{at} draws from (the global one, or a "
            f"torch.Generator passed to it) is in a different state in run {d.run} than in run "
            "0: the harness "
            "restores the global RNGs and the generators it finds in fixture values, module "
            "globals and the test's class before each run, so the test reseeds it from a value "
            "that changes between runs (a clock, a counter), or it is a generator out of the "
            "harness's reach"
        )
    values = [(x, y) for x, y in pairs if not (_is_tensor_key(x) or _is_tensor_key(y))]
    if values or not pairs:
        shown = (
            f": {_show(values[0][0])} in run 0, {_show(values[0][1])} in run {d.run}"
            if values
            else ""
        )
        return f"{INPUTS_DIFFER}: a Python value passed to {d.op} differs{shown}"
    before = ref.entered_at(d.op_index)
    now = other.entered_at(d.op_index)
    if now and now <= before:
        return (
            f"{INPUTS_DIFFER}: a tensor kept between runs (module-level, class-level or "
            f"fixture state) was changed by an earlier run; first used here by {d.op}"
        )
    return (
        f"{INPUTS_DIFFER}: a tensor made outside the recorded ops (Python data, another "
        f"thread or a compiled kernel) differs between runs; first used by {d.op}"
    )


def boundary_notes(runs: Sequence[RunRecord]) -> list[str]:
    """Which parts of the test were checked only at their boundary, and why."""
    notes: list[str] = []
    if any(r.compiled for r in runs):
        notes.append(
            "torch.compile: fused kernels of compiled code run outside the dispatcher and "
            "are checked through their outputs where recorded ops use them; the ops compiled "
            "code calls through the dispatcher (custom ops, library kernels) are recorded"
        )
    return notes
