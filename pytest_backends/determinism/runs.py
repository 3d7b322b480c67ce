"""The runs of one test: recorders started and stopped safely, and what each run starts from.

The hook layer (:mod:`~pytest_backends.determinism.plugin`) runs a test's
call phase N times; this module holds the mechanics it needs for that:
:class:`Runs` chooses the recorder once (native where the extension is built,
else :class:`~pytest_backends.determinism.record_python.BoundaryRecorder`),
starts and stops one per run and keeps each run's
:class:`~pytest_backends.determinism.record.RunRecord`; :class:`Start` puts
the RNGs back before each run; :func:`run_again` repeats the test body and
turns an outcome a ``unittest.TestCase`` stores into the run's exception;
:class:`CompileWatch` tells a run that compiled (a warm-up, not compared).

A run in which Dynamo compiled is a warm-up for the comparison: compiling
runs code once (first-call analysis, lazy backward compilation) that later
calls skip, so its op sequence legitimately differs. It keeps its outcome
(it is the test's real run), but the runs compared are the later ones.

Importing this module imports neither torch nor a recorder; they are loaded
when the first run starts.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_backends.determinism import subtests
from pytest_backends.determinism.record import RunLog, RunRecord

__all__ = ["CompileWatch", "Runs", "Start", "run_again", "stored_outcome"]


class Runs:
    """The runs of one test: recorders started and stopped safely, and what they saw."""

    def __init__(self, watch: Any) -> None:
        self.records: list[RunRecord] = []
        self.failure: str | None = None
        self._watch = watch
        self._recorder: Any = None
        self._previous: Any = None
        self._compiles = 0
        # The native recorder's module, False for the Python recorder, None before the first run.
        self._native: Any = None
        self._threads: list[str] = []
        self._started = 0
        # Whether the next run may reuse keys the previous run proved (see the recorders).
        self._carry = True
        #: Which recorder recorded the runs, and why not the native one, in words.
        self.described: str | None = None

    def begin(self) -> None:
        """Start recording a run (a recorder that cannot start leaves the run unrecorded)."""
        from pytest_backends.determinism import outside
        from pytest_backends.determinism.record_python import BoundaryRecorder

        outside.install()
        self._threads = _other_threads()
        self._started = outside.started_count()
        self._watch.arm()
        self._compiles = self._watch.total()
        self._recorder = None
        if self.failure is not None:
            return
        try:
            if self._native is None:
                from pytest_backends.determinism.record_native import recorder_choice

                module, self.described = recorder_choice()
                self._native = module or False
            if self._native:
                from pytest_backends.determinism.record_native import NativeRecorder

                recorder: Any = NativeRecorder(self._native, self._previous, self._carry)
            else:
                recorder = BoundaryRecorder(self._previous, self._carry)
            recorder.__enter__()
        except Exception as exc:
            self.fail(exc)
            return
        self._recorder = recorder

    def end(self, raised: BaseException | None = None) -> None:
        """Stop recording the run and keep its record; ``raised`` is the run's exception."""
        recorder, self._recorder = self._recorder, None
        compiled = self._watch.total() != self._compiles
        if recorder is None:
            self.records.append(RunRecord(RunLog([]), compiled=compiled))
            return
        try:
            recorder.__exit__(None, None, None)
        except Exception as exc:
            self.fail(exc)
        log = recorder.finish(raised)
        self._previous = recorder  # keys of tensors from outside the run are reused
        if recorder.failure is not None and self.failure is None:
            self.failure = recorder.failure
        blind = getattr(recorder, "blind", None)
        from pytest_backends.determinism import outside

        started = outside.started_since(self._started)
        # Writes no recorder sees (another thread's ops, compiled kernels, a wrapper
        # subclass's inner ops) may have changed a tensor from outside the run: the next
        # run reads every such tensor again.
        self._carry = not (compiled or started or blind)
        threads = tuple(dict.fromkeys([*self._threads, *started, *_other_threads()]))
        self.records.append(
            RunRecord(
                log,
                recorder.first_uses,
                compiled,
                recorder.keep(),
                blind=blind,
                outside=frozenset(getattr(recorder, "outside", ())),
                outside_places=dict(getattr(recorder, "outside_places", {})),
                threads=threads,
            )
        )

    def native(self) -> Any:
        """The extension module when the native recorder recorded the runs, else None."""
        return self._native or None

    def fail(self, exc: BaseException) -> None:
        """Note the harness's own failure (the first one is kept)."""
        if self.failure is None:
            text = str(exc).strip().splitlines()
            self.failure = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")

    def compared(self) -> list[Any]:
        """The runs to compare: all, or all but a compiling run 0 when others follow."""
        records = self.records
        if len(records) > 2 and records[0].compiled:
            return records[1:]
        return records


def _other_threads() -> list[str]:
    """Names of the live threads other than this one."""
    import threading

    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me]


@dataclass
class Start:
    """What every run starts from: the global RNGs, the test's generators and the flags.

    ``flags`` is the fingerprint of torch's backend flags (the guard's registry)
    when the call phase began: a test that changes a flag after using it
    (``torch.backends.mkldnn.enabled = False`` after a convolution) would
    otherwise start run 1 under run 0's last flags, and the op that used the
    flag would differ with no input differing.
    """

    rng: Any
    generators: Any
    flags: tuple[object, ...] | None = None

    @staticmethod
    def capture_flags() -> tuple[object, ...] | None:
        """The backend flags' fingerprint now (None where the registry cannot read them)."""
        try:
            from pytest_backends.isolation.snapshot import registry

            return tuple(registry().fingerprint())
        except Exception:
            return None

    def restore(self) -> None:
        """Put the RNGs, generators and backend flags back as they were when the call began."""
        self.rng.restore()
        self.generators.restore()
        if self.flags is not None:
            from pytest_backends.isolation.snapshot import registry

            flags = registry()
            if tuple(flags.fingerprint()) != self.flags:
                flags.restore(flags.to_plain(self.flags))


def _unittest_excinfo(item: pytest.Item) -> list[Any] | None:
    """The outcomes pytest's unittest support stored for ``item`` (a TestCase test), if any.

    A ``unittest.TestCase`` reports its failure, skip, expected failure or
    unexpected success to its result object, which pytest's unittest support
    stores on the item (``_excinfo``) and turns into the call's outcome later.
    """
    excinfo = item.__dict__.get("_excinfo")
    return excinfo if isinstance(excinfo, list) else None


def stored_outcome(item: pytest.Item, keep_from: int) -> BaseException | None:
    """The exception of the first outcome stored for ``item`` (TestCase tests), or None."""
    excinfo = _unittest_excinfo(item)
    if not excinfo or len(excinfo) <= keep_from:
        return None
    value = getattr(excinfo[keep_from], "value", None)
    return value if isinstance(value, BaseException) else None


def run_again(item: pytest.Item) -> None:
    """Run the test body again; raise what the run stored instead of raising.

    Outcomes a later run stores (a TestCase's result, a subtest's failure) are
    taken away, so that only run 0's outcome is the test's.
    """
    excinfo = _unittest_excinfo(item)
    before = len(excinfo) if excinfo is not None else 0
    subtests.take_rerun_failure(item)
    item.runtest()
    excinfo = _unittest_excinfo(item)
    stored = stored_outcome(item, before)
    if excinfo is not None:
        del excinfo[before:]
    failure = subtests.take_rerun_failure(item)
    if stored is not None:
        raise stored
    if failure is not None:
        raise failure


class CompileWatch:
    """Counts Dynamo compilations: its compile-start callbacks and its graph counter.

    The callback (which also sees backward graphs compiled lazily) is
    (re)installed before every run, since ``torch._dynamo.reset()`` clears
    them; the graph counter covers a run that loads Dynamo and compiles before
    the callback is in. Nothing is imported here.
    """

    def __init__(self) -> None:
        self.count = 0

    def _on_start(self, *args: Any) -> None:
        self.count += 1

    def arm(self) -> None:
        """Install the callback if Dynamo is loaded and it is not installed."""
        module = sys.modules.get("torch._dynamo.callback")
        handler = getattr(module, "callback_handler", None)
        starts = getattr(handler, "start_callbacks", None)
        if handler is None or not isinstance(starts, list) or self._on_start in starts:
            return
        with contextlib.suppress(Exception):
            handler.register_start_callback(self._on_start)

    def total(self) -> int:
        """Compilations so far: callbacks seen plus graphs Dynamo counted (0 before it loads)."""
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        graphs = 0
        with contextlib.suppress(Exception):
            graphs = int(counters["stats"]["unique_graphs"]) if counters is not None else 0
        return self.count + graphs
