"""CPU capability levels as pytest-xdist workers.

``--backends-cpu-capability=LEVELS`` gives every test a ``cpu_capability``
axis (a test whose ``@pytest.mark.backends`` names levels keeps its own) and
starts, for each level this CPU can run, xdist workers whose spec sets the
level's environment (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``,
``MKL_ENABLE_INSTRUCTIONS`` and a ``TORCHINDUCTOR_CACHE_DIR`` of its own)
before the worker imports anything.  :class:`~pytest_backends.capability.
scheduler.LevelScheduling` sends each level's items to its workers.

* Controller (:class:`ControllerPlugin`): plans the workers before xdist
  starts them (``-n N`` means N workers *per level*), hands each its level,
  names the signal and the config of a test that crashed its worker, and
  turns SIGTERM into an orderly shutdown that takes the workers down.
* Worker (:class:`WorkerPlugin`): checks the level torch really runs before
  the first test, refuses items of another level, and leaves a note of the
  running test and a fault-handler dump for the controller.
"""

from __future__ import annotations

import contextlib
import faulthandler
import getpass
import json
import os
import shutil
import signal
import tempfile
import time
import unittest
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

import pytest

from pytest_backends import _keys, _options, _shared
from pytest_backends.capability import levels
from pytest_backends.capability.scheduler import (
    LevelScheduling,
    level_in_nodeid,
    node_level,
)

__all__ = [
    "CapabilitySettings",
    "ControllerPlugin",
    "LevelAxisPlugin",
    "WorkerPlan",
    "WorkerPlugin",
    "describe_exit",
    "level_spec",
    "plan_workers",
    "widen_matrix",
]

#: ``workerinput`` keys handed from the controller to a level's worker.
INPUT_LEVEL = "backends_cpu_level"
INPUT_LEVELS = "backends_cpu_levels"
INPUT_NOTES = "backends_cpu_notes"
INPUT_WARN = "backends_cpu_warn"
#: ``workeroutput`` key: how many items the worker deselected.
OUTPUT_DESELECTED = "backends_deselected"

_INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
_MARKER = "backends"


class CapabilityWarning(pytest.PytestWarning):
    """A test does not run at every CPU capability level that was asked for."""


@dataclass(frozen=True)
class CapabilitySettings:
    """Resolved ``--backends-cpu-capability``: the levels, or ``None`` when off."""

    levels: tuple[str, ...] | None = None


@dataclass(frozen=True)
class WorkerPlan:
    """The xdist workers the controller starts for the levels."""

    levels: tuple[str, ...]
    runnable: tuple[str, ...]
    unsupported: Mapping[str, str]
    per_level: int
    specs: tuple[str, ...]

    @property
    def worker_levels(self) -> tuple[str | None, ...]:
        """The levels that have workers, home level first (``None``: one plain worker)."""
        return self.runnable or (None,)


def parse_settings(value: str | None, source: str) -> CapabilitySettings:
    """``default,avx2`` or ``all`` -> the levels; empty, ``off`` or ``none`` -> off."""
    text = (value or "").strip()
    if not text or _options.is_off(text):
        return CapabilitySettings(None)
    return CapabilitySettings(levels.parse_levels(text, source))


def widen_matrix(
    levels_on: tuple[str, ...] | None, enabled: bool, axes: tuple[str, ...] | None
) -> tuple[bool, tuple[str, ...] | None]:
    """The matrix's ``(enabled, axes)`` once CPU levels are asked for.

    The levels ask for the ``cpu_capability`` axis by themselves: they turn the
    matrix on for that axis alone when ``--backends-matrix`` is off, and add
    the axis to a restricted ``--backends-matrix=a,b`` list.
    """
    if levels_on is None:
        return enabled, axes
    if not enabled:
        return True, (levels.AXIS,)
    if axes is not None and levels.AXIS not in axes:
        return True, (*axes, levels.AXIS)
    return enabled, axes


def inductor_cache_dir(level: str, environ: Mapping[str, str] | None = None) -> str:
    """A ``TORCHINDUCTOR_CACHE_DIR`` for ``level``: kernels built for one ISA stay there.

    Under the user's own cache directory if one is set, else beside inductor's
    default (``<tmp>/torchinductor_<user>``).
    """
    env = os.environ if environ is None else environ
    base = env.get(_INDUCTOR_ENV)
    if not base:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        base = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    return os.path.normpath(os.path.join(base, levels.level_id(level)))


def level_spec(level: str, environ: Mapping[str, str] | None = None) -> str:
    """The xdist ``--tx`` spec of a worker of ``level``."""
    env = {**levels.level_env(level), _INDUCTOR_ENV: inductor_cache_dir(level, environ)}
    for name, value in env.items():
        if "//" in value:
            raise pytest.UsageError(
                f"cannot start a {levels.level_id(level)} worker: {name}={value!r} contains "
                "'//', which xdist's worker specs cannot carry"
            )
    return "//".join(["popen", *(f"env:{name}={value}" for name, value in env.items())])


def plan_workers(
    wanted: Sequence[str],
    per_level: int,
    unsupported: Mapping[str, str | None],
    environ: Mapping[str, str] | None = None,
) -> WorkerPlan:
    """``per_level`` workers for each wanted level this CPU can run.

    With no runnable level, one plain worker reports the skips.
    """
    missing = {lv: why for lv, why in unsupported.items() if why is not None}
    runnable = tuple(lv for lv in wanted if lv not in missing)
    specs = [level_spec(lv, environ) for lv in runnable for _ in range(per_level)]
    return WorkerPlan(tuple(wanted), runnable, missing, per_level, tuple(specs or ["popen"]))


def levels_in_use(config: pytest.Config) -> CapabilitySettings:
    """The resolved settings (resolved by the registrar before anything reads them)."""
    return config.stash.get(_keys.CAPABILITY_KEY, CapabilitySettings())


def plan_distribution(config: pytest.Config) -> None:
    """Turn the levels into xdist worker specs (controller, before xdist starts anything).

    Called from ``pytest_cmdline_main`` after xdist turned ``-n`` into specs.
    """
    check_tx_beside_n(config)
    settings = levels_in_use(config)
    if settings.levels is None or hasattr(config, "workerinput"):
        return
    if not config.pluginmanager.hasplugin("xdist"):
        raise pytest.UsageError(
            "--backends-cpu-capability runs each level in pytest-xdist workers, and "
            "pytest-xdist is not active: install it (pip install pytest-xdist) and do "
            "not disable it with -p no:xdist"
        )
    if config.getoption("collectonly", False):
        return
    if config.getoption("usepdb", False):
        raise pytest.UsageError(
            "--pdb cannot debug a test that runs in a CPU capability level's worker; "
            "run it without --backends-cpu-capability, with ATEN_CPU_CAPABILITY=<level> set"
        )
    numprocesses = config.getoption("numprocesses", None)
    if not numprocesses and config.getoption("tx", None):
        raise pytest.UsageError(
            "--backends-cpu-capability starts its own xdist workers, one set per level: "
            "use -n N (N workers for each level) instead of --tx"
        )
    per_level = int(numprocesses) if isinstance(numprocesses, int) and numprocesses > 0 else 1
    plan = plan_workers(
        settings.levels,
        per_level,
        {lv: levels.unsupported_reason(lv) for lv in settings.levels},
    )
    config.stash[_keys.WORKER_PLAN_KEY] = plan
    config.option.tx = list(plan.specs)
    if config.option.dist == "no":
        config.option.dist = "load"
    if config.getoption("maxworkerrestart", None) is None:
        config.option.maxworkerrestart = str(4 * len(plan.specs))


def _given_tx(args: Sequence[str]) -> list[str]:
    """The ``--tx`` specs on a command line."""
    specs: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--tx" and i + 1 < len(args):
            specs.append(args[i + 1])
        elif arg.startswith("--tx="):
            specs.append(arg[len("--tx=") :])
    return specs


def check_tx_beside_n(config: pytest.Config) -> None:
    """Say that ``-n`` replaces ``--tx`` (pytest-xdist drops the specs without a word).

    An error under ``--backends-strict``.
    """
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    if not config.getoption("numprocesses", None):
        return
    import shlex

    args = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *config.invocation_params.args]
    specs = _given_tx([str(a) for a in args])
    if not specs:
        return

    message = (
        f"--tx {' --tx '.join(specs)} is ignored: -n starts its own workers and pytest-xdist "
        "drops --tx beside it; give either -n N or the --tx specs"
    )
    if _shared.strict(config):
        raise pytest.UsageError(message + " (--backends-strict)")
    config.issue_config_time_warning(pytest.PytestConfigWarning(message), stacklevel=2)


def describe_exit(status: int) -> str:
    """``exit code 1`` or ``killed by signal SIGSEGV`` from a ``waitpid``-style status."""
    if status & 0x7F:
        number = status & 0x7F
        try:
            return f"killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit code {(status >> 8) & 0xFF}"


def exit_status(pid: int, wait_s: float = 1.0) -> int | None:
    """The exit status of a dead, unreaped child (Linux ``/proc``), or ``None``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = text[text.rfind(")") + 2 :].split()
        # fields[0] is field 3 (state); field 52 is the exit code.
        if fields and fields[0] in ("Z", "X") and len(fields) >= 50:
            return int(fields[49])
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def fault_tail(text: str, lines: int = 12) -> str:
    """The useful part of a fault-handler dump: the error line and the first frames."""
    kept = [line for line in text.splitlines() if line.strip()]
    fatal = [i for i, line in enumerate(kept) if "Fatal Python error" in line]
    if fatal:
        kept = kept[fatal[-1] :]
    shown = kept[:lines] + (["..."] if len(kept) > lines else [])
    return "\n".join(f"    {line}" for line in shown)


class LevelAxisPlugin:
    """Gives every test without a ``cpu_capability`` marker value the option's levels.

    Registered in every process, so collection is identical everywhere.
    """

    def __init__(self, wanted: tuple[str, ...]) -> None:
        self.levels = wanted

    @pytest.hookimpl(tryfirst=True)
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        for mark in metafunc.definition.iter_markers(_MARKER):
            if levels.AXIS in mark.kwargs or levels.AXIS in mark.args:
                return
        metafunc.definition.add_marker(pytest.mark.backends(**{levels.AXIS: list(self.levels)}))


@dataclass
class _Notes:
    """Per-worker files in the controller's notes directory."""

    root: Path

    def current(self, worker: str) -> Path:
        return self.root / f"{worker}.current.json"

    def fault(self, worker: str) -> Path:
        return self.root / f"{worker}.fault"

    def pid(self, worker: str) -> Path:
        return self.root / f"{worker}.pid"


class ControllerPlugin:
    """The xdist controller's side of the CPU levels."""

    def __init__(self, config: pytest.Config, plan: WorkerPlan) -> None:
        self.config = config
        self.plan = plan
        self.notes = _Notes(Path(tempfile.mkdtemp(prefix="pytest-backends-levels-")))
        self._warned_home = False
        self._deselected = 0
        self._previous_sigterm: Any = None
        self._failures = 0
        self._terminated = False

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        plan = self.plan
        each = "worker" if plan.per_level == 1 else "workers"
        line = (
            f"backends: CPU capability levels {', '.join(plan.levels)}; "
            f"{plan.per_level} xdist {each} per level"
        )
        if plan.unsupported:
            line += f" (no workers for {', '.join(plan.unsupported)}: this CPU cannot run them)"
        isas = [(level, levels.onednn_isa_of(level)) for level in plan.runnable]
        if any(isa for _, isa in isas):
            line += "; oneDNN ISA per level: " + ", ".join(
                f"{level} {isa or 'not capped'}" for level, isa in isas
            )
        fake = os.environ.get(levels.FAKE_FEATURES_ENV)
        if fake:
            line += f" (CPU features edited by {levels.FAKE_FEATURES_ENV}={fake})"
        return [line]

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Tell a new worker its level, the levels that have workers and where to leave notes."""
        level = node_level(node)
        node.workerinput[INPUT_LEVEL] = level
        node.workerinput[INPUT_LEVELS] = list(self.plan.runnable)
        node.workerinput[INPUT_NOTES] = str(self.notes.root)
        home = level == self.plan.worker_levels[0] and not self._warned_home
        node.workerinput[INPUT_WARN] = home
        self._warned_home = self._warned_home or home

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> LevelScheduling:
        """Route each level's items to that level's workers."""
        return LevelScheduling(config, self.plan.worker_levels, len(self.plan.specs))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Every worker deselects the same items: keep the count once, not per worker."""
        output = getattr(node, "workeroutput", None) or {}
        self._deselected = max(self._deselected, int(output.get(OUTPUT_DESELECTED, 0) or 0))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """Say which level's worker died, how, in which config, and what happens next."""
        node = getattr(report, "node", None)
        worker = str(node.gateway.id) if node is not None else "?"
        level = (node_level(node) if node is not None else None) or level_in_nodeid(crashitem)
        tag = f"the {levels.level_id(level)} worker" if level else "the worker"
        how = "died"
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.notes.pid(worker).read_text())
            status = exit_status(pid)
            if status is not None:
                how = describe_exit(status)
        config_id = None
        with contextlib.suppress(OSError, ValueError):
            current = json.loads(self.notes.current(worker).read_text())
            if current.get("nodeid") == crashitem:
                config_id = current.get("config")
        dump = ""
        with contextlib.suppress(OSError):
            dump = fault_tail(self.notes.fault(worker).read_text(errors="replace"))
        message = (
            f"crashed {tag} {worker} ({how}) while running this test. "
            "The level's remaining tests run on a replacement worker."
        )
        if dump:
            message += f" The worker's last output:\n{dump}"
        report.longrepr = message
        report.when = "call"
        path, _, name = crashitem.partition("::")
        report.location = (path, None, name.replace("::", ".") or path)
        if config_id is not None:
            report.user_properties = [(_keys.PROPERTY_CONFIG, str(config_id))]

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # SIGTERM would end the controller at once and leave its workers behind;
        # as an interrupt, xdist tears them down first.
        with contextlib.suppress(ValueError):  # not the main thread
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._interrupt)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self._failures += 1

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # xdist ends a run that -x/--maxfail stops as interrupted (exit code 2);
        # without workers pytest says "tests failed" (1), and so does a level run.
        maxfail = int(self.config.getoption("maxfail", 0) or 0)
        if (
            session.exitstatus == pytest.ExitCode.INTERRUPTED
            and not self._terminated
            and maxfail
            and self._failures >= maxfail
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._deselected and not terminalreporter.stats.get("deselected"):
            terminalreporter.write_line(
                f"backends: {self._deselected} deselected (the same items in every worker, "
                "counted once)"
            )

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self._terminated = True
        raise KeyboardInterrupt(f"pytest received {signal.Signals(signum).name}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous_sigterm)
        shutil.rmtree(self.notes.root, ignore_errors=True)


class WorkerPlugin:
    """A level's worker: verifies its level and leaves notes for the controller."""

    def __init__(self, config: pytest.Config, workerinput: Mapping[str, Any]) -> None:
        self.config = config
        raw = workerinput.get(INPUT_LEVEL)
        self.level: str | None = None if raw is None else str(raw)
        self.worker_levels = tuple(str(lv) for lv in workerinput.get(INPUT_LEVELS, ()))
        self.warn = bool(workerinput.get(INPUT_WARN))
        self.worker = str(workerinput.get("workerid", "gw"))
        self.notes = _Notes(Path(str(workerinput[INPUT_NOTES])))
        self._fault: IO[str] | None = None
        self._mismatch: str | None = None
        self._checked = False
        self._deselected = 0
        self._homeless: list[str] = []

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        with contextlib.suppress(OSError):
            self.notes.pid(self.worker).write_text(str(os.getpid()))
            self._fault = self.notes.fault(self.worker).open("w")
            faulthandler.enable(file=self._fault, all_threads=True)
        _die_with_parent()

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After collection_modifyitems has finished, wrappers included: the matrix
        # gives items their configs there, after every other implementation.
        if not self.warn or self.level is None:
            return
        for item in session.items:
            if item.stash.get(_keys.CONFIG_KEY, None) is None:
                self._homeless.append(item.nodeid)
                item.warn(CapabilityWarning(self._why_once(item)))

    def _why_once(self, item: pytest.Item) -> str:
        cls = getattr(item, "cls", None)
        if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
            what = "it is a unittest.TestCase method, and pytest runs those without parametrization"
            fix = "write it as a pytest test function (or a method of a plain class)"
        else:
            what = f"pytest cannot parametrize a {type(item).__name__} item"
            fix = "run it separately with ATEN_CPU_CAPABILITY=<level> if it depends on the level"
        others = [lv for lv in self.worker_levels if lv != self.level]
        return (
            f"{item.nodeid} runs once, at CPU capability level {self.level}, not at "
            f"{', '.join(others) or 'the other levels'}: {what}; {fix}"
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.level is not None and not self._checked:
            self._checked = True
            self._mismatch = levels.verify_level(self.level) or levels.verify_onednn(self.level)
        if self._mismatch is not None:
            pytest.fail(self._mismatch, pytrace=False)
        config = item.stash.get(_keys.CONFIG_KEY, None)
        wanted = None if config is None else config.axes.get(levels.AXIS)
        if wanted in self.worker_levels and wanted != self.level:
            pytest.fail(
                f"{levels.level_id(str(wanted))} item sent to a worker of level {self.level}; "
                "its id does not name its level the way the scheduler reads it "
                f"({level_in_nodeid(item.nodeid)!r}): rename the parameter id that "
                "contains 'cap-<level>'",
                pytrace=False,
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        # The controller reads this note if the worker dies during the test.
        config = item.stash.get(_keys.CONFIG_KEY, None)
        note = {"nodeid": item.nodeid, "config": None if config is None else config.id}
        with contextlib.suppress(OSError):
            self.notes.current(self.worker).write_text(json.dumps(note))
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, object, object]:
        output = getattr(self.config, "workeroutput", None)
        if isinstance(output, dict):
            output[OUTPUT_DESELECTED] = self._deselected
        return (yield)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._fault is not None:
            with contextlib.suppress(Exception):
                faulthandler.disable()
            self._fault.close()


def _die_with_parent() -> None:
    """Ask Linux to end this worker if the controller dies without tearing it down."""
    if not hasattr(os, "getppid") or not Path("/proc/self").exists():
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def configure(config: pytest.Config, settings: CapabilitySettings) -> list[tuple[object, str]]:
    """The plugins this process needs for ``settings`` (the registrar registers them)."""
    plugins: list[tuple[object, str]] = []
    if settings.levels is None:
        return plugins
    plugins.append((LevelAxisPlugin(settings.levels), "backends-capability-axis"))
    workerinput = getattr(config, "workerinput", None)
    if isinstance(workerinput, dict):
        if INPUT_NOTES in workerinput:
            plugins.append((WorkerPlugin(config, workerinput), "backends-capability-worker"))
        return plugins
    plan = config.stash.get(_keys.WORKER_PLAN_KEY, None)
    if plan is not None:
        plugins.append((ControllerPlugin(config, plan), "backends-capability"))
    return plugins


def resolve_settings(config: pytest.Config) -> CapabilitySettings:
    """The command line wins over the ini key."""
    raw = _options.lookup(config, "backends_cpu_capability")
    return parse_settings(raw.text, raw.source)
