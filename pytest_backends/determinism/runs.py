"""The runs of one test: what each starts from, the recorders, the reruns, their reports.

The hook layer (:mod:`~pytest_backends.determinism.plugin`) runs a test's
call phase N times; this module holds the mechanics it needs for that:
:class:`Start` puts the global RNGs, the test's own RNG objects
(:class:`~pytest_backends.determinism.rng_objects.RngObjects`) and the backend
flags back before each run;
:class:`Runs` chooses the recorder once (native where the extension is built,
else :class:`~pytest_backends.determinism.record_python.PythonRecorder`),
starts and stops one per run and keeps each run's
:class:`~pytest_backends.determinism.record.RunRecord`; :func:`repeat` runs
runs 1 to N-1 through :func:`run_again`, which repeats the test body and turns
an outcome a ``unittest.TestCase`` or a subtest stores into the run's
exception; :class:`CompileWatch` tells a run that compiled (a warm-up, not
compared); :class:`SubtestCounter` tags each call-phase report with its run.
What the runs left goes to :func:`~pytest_backends.determinism.check.check`.

A run in which Dynamo compiled is a warm-up for the comparison: compiling
runs code once (first-call analysis, lazy backward compilation) that later
calls skip, so its op sequence legitimately differs. It keeps its outcome
(it is the test's real run), but the runs compared are the later ones.

RNG objects that a test reuses across runs (``torch.Generator``, NumPy's
``Generator`` and ``RandomState``, ``random.Random``, from a fixture, a module
global, its class or its instance, or held in their containers and
attributes, ``holder.gen``) are captured when the call phase begins and
restored before each later run (:mod:`.rng_objects`), so
``torch.randn(8, generator=gen)`` draws the same numbers in every run.

Subtests are counted once: each run executes the test body again, so every
subtest (pytest's ``subtests`` fixture, or ``unittest.TestCase.subTest``)
logs one report per run. The reports a test makes during its call phase are
tagged with the number of the run that made them (the report property
:data:`RUN_PROPERTY`, which travels with the report to the xdist controller).
Wherever reports are counted, a subtest report of a later run that repeats the
outcome of the same subtest in run 0 is not counted again; one whose outcome
differs is (that difference is news). A failed subtest in run 0 fails the
test, so the runs stop after it (:func:`failed_first_run`), as they do when
run 0 raises. A subtest that fails in a later run only is reported with run
0's outcome, passed: the failure is taken (:func:`take_rerun_failure`) as the
run's exception, which makes the test "not checked", exactly as a test
without subtests whose later run raises.

Importing this module imports neither torch nor a recorder; they are loaded
when the first run starts.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_backends import _shared
from pytest_backends.determinism.record import RunLog, RunRecord, failure_text
from pytest_backends.determinism.rng_objects import RngObjects, roots_of

if TYPE_CHECKING:
    from pytest_backends.determinism.record import RunLogRecorder

__all__ = [
    "RUN_KEY",
    "RUN_PROPERTY",
    "CompileWatch",
    "Runs",
    "Start",
    "SubtestCounter",
    "failed_first_run",
    "repeat",
    "run_again",
    "run_of",
    "stored_outcome",
    "tag",
    "take_rerun_failure",
]

#: The determinism run in progress for an item (0 for the first).
RUN_KEY: pytest.StashKey[int] = pytest.StashKey()
#: Report property: the determinism run that made the report.
RUN_PROPERTY = "backends_determinism_run"
#: Whether a subtest failed in an item's first determinism run.
_FAILED_KEY: pytest.StashKey[bool] = pytest.StashKey()
#: The exception of a subtest that failed in a later determinism run only.
_RERUN_FAILURE_KEY: pytest.StashKey[BaseException] = pytest.StashKey()

_Key = tuple[str, object, tuple[tuple[str, str], ...]]


def _context(report: pytest.TestReport) -> tuple[object, tuple[tuple[str, str], ...]] | None:
    """``(msg, kwargs)`` of a subtest report (pytest >= 9 or pytest-subtests), else ``None``."""
    context = getattr(report, "context", None)
    if context is None:
        return None
    kwargs = getattr(context, "kwargs", {})
    items = kwargs.items() if isinstance(kwargs, Mapping) else ()
    return getattr(context, "msg", None), tuple(sorted((str(k), repr(v)) for k, v in items))


def tag(report: pytest.TestReport, run: int) -> None:
    """Tag ``report`` as made by determinism run ``run``."""
    _shared.attach(report, RUN_PROPERTY, run)


def run_of(report: pytest.TestReport) -> int | None:
    """The determinism run that made ``report`` (None: not made by one)."""
    run = _shared.read(report, RUN_PROPERTY)
    return run if isinstance(run, int) else None


def failed_first_run(item: pytest.Item) -> bool:
    """Whether a subtest of ``item`` failed during determinism run 0."""
    return item.stash.get(_FAILED_KEY, False)


def take_rerun_failure(item: pytest.Item) -> BaseException | None:
    """The first exception of a subtest that failed in a later run (and forget it)."""
    failure = item.stash.get(_RERUN_FAILURE_KEY, None)
    if failure is not None:
        del item.stash[_RERUN_FAILURE_KEY]
    return failure


class SubtestCounter:
    """Tags call-phase reports with their run; counts repeated subtests once."""

    def __init__(self) -> None:
        self._first: dict[_Key, str] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        run = item.stash.get(RUN_KEY, None)
        if run is not None and call.when == "call":
            tag(report, run)
            if run == 0 and report.failed:
                item.stash[_FAILED_KEY] = True
            elif run > 0 and report.failed:
                # Run 0 passed this far: the failure is the rerun's, not the subtest's.
                if _RERUN_FAILURE_KEY not in item.stash:
                    error = call.excinfo.value if call.excinfo is not None else None
                    item.stash[_RERUN_FAILURE_KEY] = (
                        error
                        if isinstance(error, BaseException)
                        else AssertionError(f"a subtest failed in determinism run {run}")
                    )
                report.outcome = "passed"
                report.longrepr = None
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        try:
            return (yield)
        finally:
            # The test's own call report (made after this) belongs to no single run.
            if RUN_KEY in item.stash:
                del item.stash[RUN_KEY]

    def _forget(self, nodeid: str) -> None:
        self._first = {key: v for key, v in self._first.items() if key[0] != nodeid}

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self._forget(nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, str] | None:
        run = run_of(report)
        context = _context(report)
        if run is None or context is None:
            return None
        key = (report.nodeid, *context)
        if run == 0:
            self._first.setdefault(key, report.outcome)
            return None
        if self._first.get(key) == report.outcome:
            return "", "", ""
        return None

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        self._forget(nodeid)


class Runs:
    """The runs of one test: recorders started and stopped safely, and what they saw."""

    def __init__(self, watch: Any) -> None:
        self.records: list[RunRecord] = []
        self.failure: str | None = None
        self._watch = watch
        self._recorder: RunLogRecorder | None = None
        self._previous: Any = None
        self._compiles = 0
        # The native recorder's module, False for the Python recorder, None before the first run.
        self._native: Any = None
        self._threads: list[str] = []
        self._started = 0
        # Threads that may write the test's tensors, alive when the run began; and the
        # thread count when the previous run ended (threads started between runs).
        self._writers: list[str] = []
        self._ended_at = 0
        # Whether the next run may reuse keys the previous run proved (see the recorders).
        self._carry = True
        #: Which recorder recorded the runs, and why not the native one, in words.
        self.described: str | None = None

    def begin(self) -> None:
        """Start recording a run (a recorder that cannot start leaves the run unrecorded)."""
        from pytest_backends.determinism import outside
        from pytest_backends.determinism.record_python import PythonRecorder

        outside.install()
        self._threads = _other_threads()
        self._writers = writer_threads()
        if self._writers or outside.started_since(self._ended_at):
            self._carry = False  # another thread may have written a tensor unseen
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

                recorder: RunLogRecorder = NativeRecorder(self._native, self._previous, self._carry)
            else:
                recorder = PythonRecorder(self._previous, self._carry)
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
        blind = recorder.blind
        from pytest_backends.determinism import outside

        started = outside.started_since(self._started)
        self._ended_at = outside.started_count()
        # Writes no recorder sees (another thread's ops, compiled kernels, a wrapper
        # subclass's inner ops) may have changed a tensor from outside the run: the next
        # run reads every such tensor again. Another thread alive during the run (one a
        # fixture started, too) may have written one through ``.data``.
        writers = self._writers or writer_threads()
        self._carry = not (compiled or started or blind or writers)
        threads = tuple(dict.fromkeys([*self._threads, *started, *_other_threads()]))
        self.records.append(
            RunRecord(
                log,
                recorder.first_uses,
                compiled,
                recorder.keep(),
                blind=blind,
                outside=frozenset(recorder.outside),
                outside_places=dict(recorder.outside_places),
                threads=threads,
            )
        )

    def native(self) -> Any:
        """The extension module when the native recorder recorded the runs, else None."""
        return self._native or None

    def fail(self, exc: BaseException) -> None:
        """Note the harness's own failure (the first one is kept)."""
        if self.failure is None:
            self.failure = failure_text(exc)


#: Threads of the session's own machinery (see :func:`note_session`).
_MACHINERY: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def note_session(root: Path | None) -> None:
    """Note the session's machinery: threads running now whose code lies outside ``root``.

    Ops on other threads are not recorded, and a write there through ``.data`` moves
    no counter a recorder checks, so a run during which another thread was alive
    carries no key to the next (:meth:`Runs.end`). Threads that pytest's plugins
    started before the session (pytest-rerunfailures' status server) are not counted.
    """
    if root is None:
        return
    me = threading.current_thread()
    for thread in threading.enumerate():
        where = None if thread is me else _code_file(thread)
        if where is None:
            continue  # unknown code: counted
        try:
            Path(where).resolve().relative_to(root.resolve())
        except ValueError:
            _MACHINERY.add(thread)
        except OSError:
            continue


def writer_threads() -> list[str]:
    """Names of the live threads, other than this one, that may write a test's tensors."""
    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me and t not in _MACHINERY]


def _code_file(thread: threading.Thread) -> str | None:
    """The source file of the code ``thread`` runs (its target, or its ``run``), if known."""
    target = getattr(thread, "_target", None)
    if target is None:
        target = type(thread).run
        if target is threading.Thread.run:
            return None
    while isinstance(target, functools.partial):
        target = target.func
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    return None if code is None else str(code.co_filename)


def _other_threads() -> list[str]:
    """Names of the live threads other than this one."""
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

    @classmethod
    def capture(cls, item: pytest.Item) -> Start:
        """What ``item``'s runs start from, captured now (when its call phase begins)."""
        from pytest_backends.determinism.api import RngState
        from pytest_backends.determinism.carried import note_start

        note_start(item)  # what the places held, to name what the runs change
        return cls(RngState.capture(), RngObjects.capture(roots_of(item)), cls.capture_flags())

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


def call_phase(item: pytest.Item) -> None:
    """What pytest's call phase runs inside the hook wrappers, once more.

    Every plain ``pytest_runtest_call`` implementation, in pluggy's order:
    pytest's own runs the test, and another may set up what the body sees
    (pytest-randomly reseeds ``random`` and NumPy there, after the harness
    took the state the runs start from). Run 0 ran them all, so every later
    run does; the wrappers (output capture, logging, timeouts) still hold,
    since the later runs happen inside them.
    """
    hook = item.ihook.pytest_runtest_call
    given = {"item": item}
    for impl in reversed(hook.get_hookimpls()):
        if impl.hookwrapper or getattr(impl, "wrapper", False):
            continue
        impl.function(*(given[name] for name in impl.argnames))


def run_again(item: pytest.Item) -> None:
    """Run the test body again; raise what the run stored instead of raising.

    Outcomes a later run stores (a TestCase's result, a subtest's failure) are
    taken away, so that only run 0's outcome is the test's.
    """
    excinfo = _unittest_excinfo(item)
    before = len(excinfo) if excinfo is not None else 0
    take_rerun_failure(item)
    call_phase(item)
    excinfo = _unittest_excinfo(item)
    stored = stored_outcome(item, before)
    if excinfo is not None:
        del excinfo[before:]
    failure = take_rerun_failure(item)
    if stored is not None:
        raise stored
    if failure is not None:
        raise failure


def repeat(
    item: pytest.Item, runs: Runs, start: Start, total: int
) -> tuple[int, BaseException] | None:
    """Runs 1 to ``total - 1`` of ``item`` (run 0 ran in pytest's call), each from ``start``.

    Returns the number and exception of a run that raised (the runs stop
    there), else None. The runs stop early too when the harness fails.
    """
    for run in range(1, total):
        item.stash[RUN_KEY] = run
        if runs.failure is not None:
            break
        try:
            start.restore()
        except Exception as exc:  # a flag that cannot be put back: the runs would differ
            runs.fail(exc)
            break
        runs.begin()
        try:
            run_again(item)
        except (KeyboardInterrupt, SystemExit) as exc:
            runs.end(exc)
            raise
        except BaseException as exc:  # pytest.fail and pytest.skip included
            runs.end(exc)
            return run, exc
        runs.end()
    return None


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
