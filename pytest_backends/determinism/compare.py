"""Stage 2 of the determinism pipeline: compare the runs, op by op.

:func:`compare_runs` takes the :class:`~pytest_backends.determinism.record.RunLog`
of every run and blames an op only when it produced different outputs from
identical inputs that are all proven equal (the proof rule: tensors by their
digests, generators by their state, plain values by value). Differences that
follow from already-different inputs are not blamed on the op that happens to
show them; an op whose differing output comes from reading uninitialised
memory is an uninitialised read, never a nondeterministic kernel. The result,
a :class:`Comparison`, holds the census verdict of every ``(op, device,
dtype)`` and the :class:`Divergence` entries that the next stages locate
(:mod:`.locate`) and turn into words (:mod:`.verdict`).

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_backends.determinism.census import VERDICTS
from pytest_backends.determinism.op_tables import SLOT_TAGS, SlotTag
from pytest_backends.determinism.record import UNPROVEN_TAGS, Digest, RunLog, Slot

if TYPE_CHECKING:
    from pytest_backends.determinism.location import Location

__all__ = ["Comparison", "Divergence", "compare_runs", "merge_verdict", "unproven_input"]


@dataclass(frozen=True)
class Divergence:
    """Where a run first differed from run 0.

    ``kind`` is ``"op"`` (the op produced different outputs from identical
    inputs: it is nondeterministic), ``"uninitialized"`` (the op read
    uninitialised memory, created by ``origin``), ``"inputs"`` (the first
    differing op's inputs already differed, so the cause lies outside torch
    ops), ``"unproven"`` (its inputs looked equal, but one of them, named in
    ``origin``, cannot be proven equal: the op is not blamed) or
    ``"sequence"`` (the runs called different ops). ``location`` is
    filled in by :func:`~pytest_backends.determinism.locate.locate`.
    """

    kind: str
    run: int
    op_index: int
    op: str
    device: str | None
    dtype: str | None
    output_index: int | None = None
    other_op: str | None = None
    origin: str | None = None
    location: Location | None = None


@dataclass
class Comparison:
    """The outcome of :func:`compare_runs`.

    ``blamed`` lists the ops that produced different outputs from identical
    inputs, earliest first, one entry per op position. ``uninitialized``
    lists the ops whose outputs differed because they read uninitialised
    memory. ``unexplained`` is the earliest divergence that is not preceded
    by a blamed op in its run. ``verdicts`` maps ``(op, device, dtype)`` to
    this test's verdict.
    """

    runs: int
    blamed: list[Divergence]
    unexplained: Divergence | None
    verdicts: dict[tuple[str, str | None, str | None], str]
    uninitialized: list[Divergence] = field(default_factory=list)

    @property
    def reproducible(self) -> bool:
        """True when every run matched run 0."""
        return not self.blamed and not self.uninitialized and self.unexplained is None


def _first_difference(a: tuple[Slot, ...], b: tuple[Slot, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _has_uninitialized(slot: Slot) -> bool:
    if type(slot) is tuple and slot:
        if slot[0] == SlotTag.UNINITIALIZED:
            return True
        return any(_has_uninitialized(s) for s in slot)
    return False


def _describe_unproven(slot: Slot) -> str | None:
    if type(slot) is tuple and slot:
        tag = slot[0]
        if tag == SlotTag.OPAQUE:
            what = slot[3] if len(slot) > 3 else SlotTag.OPAQUE
            reason = {
                "unreadable": "a tensor whose storage is too small for it (freed?)",
                "meta": "a meta tensor",
            }.get(str(what), f"a tensor the recorder cannot read ({what})")
            return f"{reason}, {slot[1]} of shape {tuple(slot[2])}"
        if tag == "object":
            return f"a {slot[1]} object, which the recorder cannot compare"
        if tag in SLOT_TAGS and tag != SlotTag.VIEW:
            return None
        for item in slot:
            found = _describe_unproven(item)
            if found is not None:
                return found
    return None


def unproven_input(inputs: tuple[Slot, ...]) -> str | None:
    """``"input 1 (a ... object)"``: the first input that cannot be proven equal, else None.

    Tensors are proven equal by their contents (digests), generators by their
    state, plain values by value. An opaque tensor (unreadable, or of a layout
    the digest cannot read) and a Python object keyed by its type are not.
    """
    for i, slot in enumerate(inputs):
        if type(slot) is Digest or type(slot) is not tuple:
            continue
        found = _describe_unproven(slot)
        if found is not None:
            keyword = len(slot) == 2 and type(slot[0]) is str and slot[0] not in UNPROVEN_TAGS
            name = f"argument {slot[0]!r}" if keyword else ""
            return f"input {i} ({found})" if not name else f"{name} ({found})"
    return None


def shared_generator_input(inputs: tuple[Slot, ...], threads: Sequence[str]) -> str | None:
    """``"input 5 (...)"``: a generator input while other threads ran, else None.

    A generator's state at call time proves its draws equal only if nobody else
    draws from it during the op; with other threads running, another thread may
    advance it between the state being read and the op drawing.
    """
    if not threads:
        return None
    for i, slot in enumerate(inputs):
        if type(slot) is tuple and len(slot) == 3 and slot[0] == "generator":
            names = ", ".join(repr(t) for t in threads[:3])
            more = f" and {len(threads) - 3} more" if len(threads) > 3 else ""
            return (
                f"input {i} (the state of the generator it draws from, which other threads "
                f"running in the test ({names}{more}) may advance between this thread's draws)"
            )
    return None


def compare_runs(logs: Sequence[RunLog], threads: Sequence[str] = ()) -> Comparison:
    """Compare every run with run 0, op by op.

    The proof rule: an op is blamed only when every input it received is proven
    equal between runs (:func:`unproven_input`); where an op's outputs differ
    and one of its equal-looking inputs is not proof, the divergence is
    ``"unproven"`` and the test is not checked.

    One run proves nothing: its ops are ``inconclusive`` (a test that failed
    in its first run is not repeated). ``threads`` names the other threads that
    ran during the runs: a generator's state is no proof while they run.
    """
    if len(logs) < 2:
        return _single_run(logs)
    same = _same_fingerprints(logs)
    if same is not None:
        return same
    ref = logs[0].loaded().calls
    for log in logs[1:]:
        log.loaded()
    status: dict[int, str] = {}  # op index in run 0 -> verdict
    blamed: dict[int, Divergence] = {}
    uninitialized: dict[int, Divergence] = {}
    unexplained: Divergence | None = None
    for r in range(1, len(logs)):
        calls = logs[r].calls
        first_blamed = False
        first_diff_seen = False
        for i in range(max(len(ref), len(calls))):
            if i >= len(ref) or i >= len(calls) or calls[i].name != ref[i].name:
                if not first_diff_seen:
                    a = ref[i] if i < len(ref) else None
                    b = calls[i] if i < len(calls) else None
                    base = a or b
                    assert base is not None
                    d = Divergence(
                        "sequence",
                        r,
                        i,
                        a.name if a else "(end of run)",
                        base.device,
                        base.dtype,
                        None,
                        b.name if b else "(end of run)",
                    )
                    if unexplained is None or (i, r) < (unexplained.op_index, unexplained.run):
                        unexplained = d
                break
            a, b = ref[i], calls[i]
            same_inputs = a.inputs == b.inputs
            out_diff = _first_difference(a.outputs, b.outputs)
            if out_diff is None:
                if same_inputs:
                    status.setdefault(i, "deterministic")
                continue
            origin = a.tainted or b.tainted
            if origin is not None and (
                _has_uninitialized(a.inputs) if same_inputs else not first_diff_seen
            ):
                # The op read memory that no op wrote: its outputs (or inputs) differ
                # because of that memory, not because of the kernel.
                status[i] = "reads_uninitialized"
                if i not in uninitialized:
                    uninitialized[i] = Divergence(
                        "uninitialized", r, i, a.name, a.device, a.dtype, out_diff, origin=origin
                    )
                if not first_diff_seen:
                    first_blamed = True
            elif same_inputs and (
                weak := unproven_input(a.inputs) or shared_generator_input(a.inputs, threads)
            ):
                # Equal keys, but not proof: the op is not blamed (the proof rule).
                if not first_diff_seen:
                    d = Divergence(
                        "unproven", r, i, a.name, a.device, a.dtype, out_diff, origin=weak
                    )
                    if unexplained is None or (i, r) < (unexplained.op_index, unexplained.run):
                        unexplained = d
            elif same_inputs:
                status[i] = "nondeterministic"
                if i not in blamed:
                    blamed[i] = Divergence("op", r, i, a.name, a.device, a.dtype, out_diff)
                if not first_diff_seen:
                    first_blamed = True
            elif not first_diff_seen:
                d = Divergence("inputs", r, i, a.name, a.device, a.dtype, out_diff)
                if unexplained is None or (i, r) < (unexplained.op_index, unexplained.run):
                    unexplained = d
            first_diff_seen = True
            if not first_blamed:
                break
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    for log in logs:
        for call in log.calls:
            if call.alerted:
                merge_verdict(verdicts, call.key, "raises_under_deterministic_mode")
    for i, call in enumerate(ref):
        merge_verdict(verdicts, call.key, status.get(i, "inconclusive"))
    return Comparison(
        len(logs),
        [blamed[i] for i in sorted(blamed)],
        unexplained,
        verdicts,
        [uninitialized[i] for i in sorted(uninitialized)],
    )


def _single_run(logs: Sequence[RunLog]) -> Comparison:
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    for log in logs:
        if log.keys is not None:
            keys = list(log.keys)
        else:
            keys = [(*call.key, call.alerted) for call in log.calls]
        for name, device, dtype, alerted in keys:
            if alerted:
                merge_verdict(verdicts, (name, device, dtype), "raises_under_deterministic_mode")
            merge_verdict(verdicts, (name, device, dtype), "inconclusive")
    return Comparison(len(logs), [], None, verdicts)


def _same_fingerprints(logs: Sequence[RunLog]) -> Comparison | None:
    """The comparison of summarised runs that are all alike, without loading their calls."""
    keys = logs[0].keys
    if keys is None or logs[0].fingerprint is None:
        return None
    if any(log.fingerprint != logs[0].fingerprint or log.keys is None for log in logs):
        return None
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    for name, device, dtype, alerted in keys:
        if alerted:
            merge_verdict(verdicts, (name, device, dtype), "raises_under_deterministic_mode")
        merge_verdict(verdicts, (name, device, dtype), "deterministic")
    return Comparison(len(logs), [], None, verdicts)


def merge_verdict(
    verdicts: dict[tuple[str, str | None, str | None], str],
    key: tuple[str, str | None, str | None],
    verdict: str,
    order: Sequence[str] = VERDICTS,
) -> None:
    """Keep the graver of ``verdict`` and the one ``key`` has (``order``: gravest first)."""
    old = verdicts.get(key)
    if old is None or order.index(verdict) < order.index(old):
        verdicts[key] = verdict
