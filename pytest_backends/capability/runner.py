"""One process per CPU capability level, merged back into the parent's run.

The parent (or each xdist worker) collects normally, so every process sees
the same items with the same ids, ``cap-<level>`` included.  Before the run
loop starts, each item of a level is swapped in ``session.items`` for a
:class:`LevelItem` stand-in: same node id, location, keywords and markers, but
hung directly under the session so that no module or class fixtures are set
up or kept alive for it in the parent.  Its run protocol does not run it:

1. the first process to reach an item of level ``L`` claims the level (an
   exclusive lock file in a directory shared by all xdist workers) and starts
   a child ``python -m pytest`` for *all* of the session's level-``L`` items,
   with ``ATEN_CPU_CAPABILITY`` (and the oneDNN/MKL caps) in its environment;
2. the child verifies the level torch really picked, runs the items and
   appends every report, serialized with ``pytest_report_to_serializable``,
   to the level's event file (one JSON object per line);
3. every process that holds an item of level ``L`` reads that file and logs
   the item's reports through its own ``pytest_runtest_logreport``, so the
   terminal, JUnit XML, the matrix report and xdist see ordinary reports.

Each item runs exactly once, in a process of its own level.  A child that
dies while a test runs (segfault, ``os._exit``) fails that test with the exit
code and the tail of the child's output, and a fresh child runs the level's
remaining items.  Each process runs at most ``--backends-cpu-capability-jobs``
children at a time (default 1).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_backends.capability import levels as capability

__all__ = [
    "CHILD_OPTION",
    "CapabilitySettings",
    "ChildPlugin",
    "LevelItem",
    "ParentPlugin",
    "XdistHooks",
    "configure",
    "resolve_settings",
]

#: The hidden option that puts pytest in child mode; its value is a JSON spec file.
CHILD_OPTION = "--backends-cpu-capability-child"
CHILD_DEST = "backends_cpu_capability_child"

#: ``workerinput`` key carrying the shared directory from the xdist controller.
_SHARED_DIR_KEY = "pytest_backends_capability_dir"

#: After this many crashes in one level, its remaining items are not retried.
MAX_CRASHES = 8

_POLL_S = 0.02
# pytest's exit status for KeyboardInterrupt, and death by SIGINT.
_INTERRUPTED = (int(pytest.ExitCode.INTERRUPTED), -int(signal.SIGINT))
_LIVENESS_S = 2.0
_TAIL_LINES = 12

# Invocation arguments that must not reach a child: they would make it
# interactive, loop forever or rewrite a file the parent owns.
_DROP_ARGS = frozenset({"--pdb", "--trace", "-f", "--looponfail", "--backends-baseline-update"})

# Options (and ini keys of the same name) of this plugin that write a file at
# the end of the run: the parent writes them, a child must not.
_OUTPUT_OPTIONS = ("backends_report", "backends_html", "backends_census")


@dataclass(frozen=True)
class CapabilitySettings:
    """Resolved ``--backends-cpu-capability`` / child-mode settings."""

    levels: tuple[str, ...] | None
    child_spec: Path | None = None
    jobs: int = 1


SETTINGS_KEY = pytest.StashKey[CapabilitySettings]()


def resolve_settings(config: pytest.Config) -> CapabilitySettings:
    """Resolve the levels once: the command line wins over the ini key."""
    cli = config.getoption("backends_cpu_capability", None)
    levels: tuple[str, ...] | None = None
    if cli is not None:
        levels = capability.parse_levels(str(cli), "--backends-cpu-capability")
    else:
        ini = str(config.getini("backends_cpu_capability") or "").strip()
        if ini:
            levels = capability.parse_levels(ini, "ini option backends_cpu_capability")
    spec = config.getoption(CHILD_DEST, None)
    jobs_cli = config.getoption("backends_cpu_capability_jobs", None)
    if jobs_cli is not None:
        jobs = parse_jobs(str(jobs_cli), "--backends-cpu-capability-jobs")
    else:
        jobs = parse_jobs(
            str(config.getini("backends_cpu_capability_jobs") or "1"),
            "ini option backends_cpu_capability_jobs",
        )
    return CapabilitySettings(levels, Path(spec) if spec else None, jobs)


def parse_jobs(value: str, source: str) -> int:
    """A positive number of level processes one pytest process may run at once."""
    try:
        jobs = int(value.strip())
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise pytest.UsageError(f"{source}: expected a positive integer, got {value!r}")
    return jobs


def addoption(parser: pytest.Parser, group: Any) -> None:
    """Register ``--backends-cpu-capability``, its ini twin and the hidden child-mode option."""
    group.addoption(
        "--backends-cpu-capability",
        action="store",
        default=None,
        metavar="LEVELS",
        help="run every test once per CPU capability level, each level in a process of its "
        "own started with ATEN_CPU_CAPABILITY=<level>: a comma-separated list of "
        f"{', '.join(capability.LEVELS)}, or 'all' (every level this CPU can run). "
        "A test whose @pytest.mark.backends names cpu_capability keeps its levels. "
        "ini: backends_cpu_capability",
    )
    group.addoption(
        "--backends-cpu-capability-jobs",
        action="store",
        default=None,
        metavar="N",
        help="how many CPU capability level processes one pytest process (or xdist worker) "
        "runs at the same time (default 1). ini: backends_cpu_capability_jobs",
    )
    group.addoption(CHILD_OPTION, action="store", default=None, help=argparse.SUPPRESS)
    parser.addini(
        "backends_cpu_capability",
        "CPU capability levels to run every test under (comma-separated, or 'all')",
        default="",
    )
    parser.addini(
        "backends_cpu_capability_jobs",
        "CPU capability level processes run at the same time per pytest process",
        default="1",
    )


def widen_matrix(
    config: pytest.Config, enabled: bool, axes: tuple[str, ...] | None
) -> tuple[bool, tuple[str, ...] | None]:
    """The matrix's ``(enabled, axes)`` once ``--backends-cpu-capability`` is taken into account.

    The option asks for the ``cpu_capability`` axis by itself: it turns the
    matrix on for that axis alone when ``--backends-matrix`` is off, and adds
    the axis to a restricted ``--backends-matrix=a,b`` list.
    """
    if resolve_settings(config).levels is None:
        return enabled, axes
    if not enabled:
        return True, (capability.AXIS,)
    if axes is not None and capability.AXIS not in axes:
        return True, (*axes, capability.AXIS)
    return enabled, axes


class LevelAxisPlugin:
    """Gives every test without a ``cpu_capability`` marker value the option's levels.

    Registered in the parent and in every child, so collection is identical.
    """

    def __init__(self, levels: tuple[str, ...]) -> None:
        self.levels = levels

    @pytest.hookimpl(tryfirst=True)
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        from pytest_backends.matrix import markers

        for mark in metafunc.definition.iter_markers(markers.MARKER):
            if capability.AXIS in mark.kwargs or capability.AXIS in mark.args:
                return
        metafunc.definition.add_marker(pytest.mark.backends(**{capability.AXIS: list(self.levels)}))


def configure(config: pytest.Config) -> None:
    """Resolve the settings and register the parent or child plugin."""
    settings = resolve_settings(config)
    config.stash[SETTINGS_KEY] = settings
    if settings.levels is not None:
        config.pluginmanager.register(LevelAxisPlugin(settings.levels), "backends-capability-axis")
    if settings.child_spec is not None:
        config.pluginmanager.register(
            ChildPlugin(config, settings.child_spec), "backends-capability"
        )
        return
    parent = ParentPlugin(config, settings.jobs)
    config.pluginmanager.register(parent, "backends-capability")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(parent), "backends-capability-xdist")


def level_of(item: pytest.Item) -> str | None:
    """The CPU capability level an item must run under, or ``None``."""
    # Imported lazily: the matrix module is only needed once items exist.
    from pytest_backends.matrix import plugin as matrix

    backend_config = item.stash.get(matrix.CONFIG_KEY, None)
    if backend_config is None:
        return None
    level = backend_config.axes.get(capability.AXIS)
    return None if level is None else str(level)


# --------------------------------------------------------------------------
# events: one JSON object per line, appended by the child and the supervisor


class _EventWriter:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, event: Mapping[str, object]) -> None:
        line = json.dumps(event, default=repr) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


@dataclass
class _Record:
    """What is known about one item of a level."""

    reports: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    started: bool = False
    done: bool = False
    crash: str | None = None
    lost: str | None = None


class LevelFeed:
    """Incremental reader of one level's event file."""

    def __init__(self, level: str, path: Path) -> None:
        self.level = level
        self.path = path
        self.records: dict[str, _Record] = {}
        self.ended = False
        self.child_pid: int | None = None
        self.abort: str | None = None
        self.collect_errors: list[str] = []
        self._offset = 0
        self._partial = b""

    def record(self, nodeid: str) -> _Record:
        """The record of ``nodeid``, created empty if nothing is known yet."""
        return self.records.setdefault(nodeid, _Record())

    def poll(self) -> bool:
        """Read what was appended since the last call; ``True`` if there was anything."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return False
        if not chunk:
            return False
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                self._apply(json.loads(line))
        return bool(lines)

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "hello":
            self.child_pid = int(event["pid"])
        elif kind == "start":
            self.record(event["nodeid"]).started = True
        elif kind == "report":
            self.record(event["nodeid"]).reports.append(event["data"])
        elif kind == "warning":
            self.record(event["nodeid"]).warnings.append(event)
        elif kind == "finish":
            self.record(event["nodeid"]).done = True
        elif kind == "crash":
            record = self.record(event["nodeid"])
            if not record.done:
                record.crash, record.done = str(event["message"]), True
        elif kind == "lost":
            for nodeid in event["nodeids"]:
                record = self.record(nodeid)
                if not record.done:
                    record.lost, record.done = str(event["message"]), True
        elif kind == "collect-error":
            self.collect_errors.append(f"{event['nodeid']}:\n{event['text']}")
        elif kind == "abort":
            self.abort = str(event["message"])
        elif kind == "end":
            self.ended = True


# --------------------------------------------------------------------------
# the child's command line and environment


def _strip_positionals(config: pytest.Config, args: list[str]) -> list[str]:
    """``args`` without the test paths given on the command line.

    pytest does not expose which tokens were positional, so the last
    occurrence of each entry of ``config.args`` is removed (an option value
    that equals a path usually comes before it).
    """
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return args
    result = list(args)
    for positional in reversed(config.args):
        for index in range(len(result) - 1, -1, -1):
            if result[index] == positional:
                del result[index]
                break
    return result


def child_args(
    config: pytest.Config,
    nodeids: Iterable[str],
    spec: Path,
    basetemp: Path | None,
    cache_dir: Path,
) -> list[str]:
    """The pytest arguments of a child that runs ``nodeids`` in-process.

    The parent's own arguments are kept (plugins, ``-k``/``-m``, ``-W``,
    ``-o``, ``--backends-*``, the ini file...) so that the child collects the
    same items under the same ids; only the test paths are replaced by the
    files that hold ``nodeids`` (put first), and options that would make the child
    distribute, stop early, debug interactively or write the parent's output
    files are overridden after them (the last value of an option wins).
    """
    raw = [str(arg) for arg in config.invocation_params.args]
    files: list[str] = []
    for nodeid in nodeids:
        path = str(config.rootpath / nodeid.split("::", 1)[0])
        if path not in files:
            files.append(path)
    # Paths first: an option with an optional value (a bare --backends-matrix)
    # at the end of the parent's arguments must not take a path as its value.
    args = files + [a for a in _strip_positionals(config, raw) if a not in _DROP_ARGS]
    if not any(a == "--rootdir" or a.startswith("--rootdir=") for a in raw):
        args.append(f"--rootdir={config.rootpath}")
    if config.inipath is not None and not any(
        a in ("-c", "--config-file") or a.startswith(("--config-file=", "-c")) for a in raw
    ):
        args += ["-c", str(config.inipath)]
    args += [
        f"{CHILD_OPTION}={spec}",
        "--maxfail=0",
        "--continue-on-collection-errors",
        "--color=no",
        "--junit-xml=",
        f"--log-file={os.devnull}",
        "-o",
        f"cache_dir={cache_dir}",
    ]
    if basetemp is not None:
        args.append(f"--basetemp={basetemp}")
    if config.pluginmanager.hasplugin("xdist"):
        args += ["-n", "0"]
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        args.append(f"--randomly-seed={seed}")
    args += _matrix_args(config)
    for name in _OUTPUT_OPTIONS:
        if hasattr(config.option, name):
            args.append(f"--{name.replace('_', '-')}=")
        if _has_ini(config, name):
            args += ["-o", f"{name}="]
    if _has_ini(config, "backends_baseline_update"):
        args += ["-o", "backends_baseline_update=false"]
    return args


def _has_ini(config: pytest.Config, name: str) -> bool:
    try:
        config.getini(name)
    except ValueError:
        return False
    return True


def _matrix_args(config: pytest.Config) -> list[str]:
    # A sampled matrix with a random seed must sample the same configs in the child.
    from pytest_backends.matrix import plugin as matrix

    settings = config.stash.get(matrix.SETTINGS_KEY, None)
    if settings is not None and settings.sample is not None and settings.seed is not None:
        return [f"--backends-seed={settings.seed}"]
    return []


def child_env(level: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a level's child: the parent's, plus the level's variables."""
    env = dict(os.environ if base is None else base)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        env.pop(name, None)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(capability.level_env(level))
    return env


def describe_exit(returncode: int) -> str:
    """``exit code 1`` or ``signal SIGSEGV``."""
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The useful end of a child's output: a fatal error's traceback, else the last lines.

    pytest's session header is left out; of a faulthandler dump (segfault,
    abort) the first lines are kept, since they name the crashing frame.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "    (no output)"
    kept = [line for line in text.splitlines() if line.strip()]
    header_end = max(
        (i for i, line in enumerate(kept) if line.startswith(("collected ", "collecting "))),
        default=-1,
    )
    kept = kept[header_end + 1 :]
    # The progress line of the crashing test has no newline before the dump.
    fatal = [i for i, line in enumerate(kept) if "Fatal Python error" in line]
    if fatal:
        first = kept[fatal[-1]]
        shown = [first[first.index("Fatal Python error") :], *kept[fatal[-1] + 1 :]][:lines]
        if len(kept) > fatal[-1] + lines:
            shown.append("...")
    else:
        shown = kept[-lines:]
    return "\n".join(f"    {line}" for line in shown) or "    (no output)"


# --------------------------------------------------------------------------
# the supervisor: runs the children of the levels this process owns


@dataclass(frozen=True)
class _Job:
    level: str
    nodeids: tuple[str, ...]


class _Supervisor:
    """Runs the children of claimed levels in background threads, ``jobs`` at a time."""

    def __init__(self, config: pytest.Config, shared_dir: Path, jobs: int) -> None:
        self._config = config
        self._dir = shared_dir
        self._slots = jobs
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._pending = 0

    @property
    def busy(self) -> bool:
        """Whether every slot has a level queued or running."""
        with self._lock:
            return self._pending >= self._slots

    def submit(self, job: _Job) -> None:
        """Queue a level; a thread per slot starts as levels arrive."""
        with self._lock:
            self._pending += 1
            start = len(self._threads) < min(self._pending, self._slots)
        self._jobs.put(job)
        if start:
            thread = threading.Thread(
                target=self._loop, name="pytest-backends-capability", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def finish(self, *, stop: bool) -> None:
        """Wait for the queued levels; with ``stop``, kill the running children first."""
        if not self._threads:
            return
        if stop:
            self._stopping.set()
            with self._lock:
                for proc in self._procs:
                    if proc.poll() is None:
                        proc.kill()
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            writer = _EventWriter(self._dir / f"{job.level}.events.jsonl")
            try:
                self._run(job, writer)
            except Exception as exc:  # never leave readers waiting
                writer.write(
                    {
                        "ev": "lost",
                        "nodeids": list(job.nodeids),
                        "message": f"pytest-backends could not run the "
                        f"{capability.level_id(job.level)} process: {exc!r}",
                    }
                )
            finally:
                writer.write({"ev": "end"})
                writer.close()
                with self._lock:
                    self._pending -= 1

    def _run(self, job: _Job, writer: _EventWriter) -> None:
        tag = capability.level_id(job.level)
        reader = LevelFeed(job.level, self._dir / f"{job.level}.events.jsonl")
        remaining = list(job.nodeids)
        crashes = 0
        attempt = 0
        while remaining and not self._stopping.is_set():
            attempt += 1
            log = self._dir / f"{job.level}-{attempt}.log"
            returncode = self._spawn(job.level, remaining, attempt, log)
            reader.poll()
            running = [n for n in remaining if reader.record(n).started]
            running = [n for n in running if not reader.record(n).done]
            remaining = [n for n in remaining if not reader.record(n).done and n not in running]
            if self._stopping.is_set() or returncode in _INTERRUPTED:
                # The run stops (Ctrl-C reaches the children too): do not restart.
                why = "the test run stopped" if self._stopping.is_set() else "it was interrupted"
                writer.write(
                    {
                        "ev": "lost",
                        "nodeids": running + remaining,
                        "message": f"not run to the end: {why} while the {tag} process ran",
                    }
                )
                return
            if not running:
                if remaining:
                    message = self._lost_reason(tag, reader, returncode, log)
                    writer.write({"ev": "lost", "nodeids": remaining, "message": message})
                    remaining = []
                break
            crashes += 1
            then = (
                f" The level's {len(remaining)} remaining tests run in a new process."
                if remaining and crashes < MAX_CRASHES
                else ""
            )
            for nodeid in running:
                writer.write(
                    {
                        "ev": "crash",
                        "nodeid": nodeid,
                        "message": f"crashed the {tag} process ({describe_exit(returncode)}) "
                        f"while running this test.{then} The process's last output:\n"
                        f"{_tail(log)}",
                    }
                )
            if crashes >= MAX_CRASHES and remaining:
                writer.write(
                    {
                        "ev": "lost",
                        "nodeids": remaining,
                        "message": f"not run: the {tag} process crashed {crashes} times, "
                        f"the last time in {running[-1]}",
                    }
                )
                return
        if remaining:
            writer.write(
                {
                    "ev": "lost",
                    "nodeids": remaining,
                    "message": f"not run: the test run stopped before the {tag} process "
                    "reached this test",
                }
            )

    @staticmethod
    def _lost_reason(tag: str, reader: LevelFeed, returncode: int, log: Path) -> str:
        if reader.abort is not None:
            return reader.abort
        if reader.collect_errors:
            return f"not run: collecting it in the {tag} process failed:\n" + "\n".join(
                reader.collect_errors
            )
        if returncode not in (0, 1, 5):
            return (
                f"not run: the {tag} process ended with {describe_exit(returncode)} before "
                f"running this test. Its last output:\n{_tail(log)}"
            )
        return (
            f"not run: the {tag} process did not collect this test "
            "(does collection depend on the CPU capability level?)"
        )

    def _spawn(self, level: str, nodeids: list[str], attempt: int, log: Path) -> int:
        config = self._config
        spec = self._dir / f"{level}-{attempt}.spec.json"
        spec.write_text(
            json.dumps(
                {
                    "level": level,
                    "events": str(self._dir / f"{level}.events.jsonl"),
                    "nodeids": nodeids,
                }
            ),
            encoding="utf-8",
        )
        basetemp_option = config.getoption("basetemp", None)
        basetemp = (
            Path(f"{basetemp_option}-{capability.level_id(level)}-{attempt}")
            if basetemp_option
            else None
        )
        cache_dir = self._dir / f"cache-{level}-{attempt}"
        args = child_args(config, nodeids, spec, basetemp, cache_dir)
        with log.open("wb") as out:
            with self._lock:
                if self._stopping.is_set():
                    return 0
                proc = subprocess.Popen(
                    [sys.executable, "-m", "pytest", *args],
                    cwd=config.invocation_params.dir,
                    env=child_env(level),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                self._procs.add(proc)
            returncode = proc.wait()
        with self._lock:
            self._procs.discard(proc)
        return returncode


# --------------------------------------------------------------------------
# the parent side


class LevelItem(pytest.Item):
    """Stands in the parent for an item that runs in its CPU level's process.

    It keeps the original's node id, location, keywords and markers, but hangs
    directly under the session: the parent sets up none of its fixtures.
    ``child_nodeid`` is the id the child knows it by (xdist's ``loadgroup``
    adds a suffix in the parent only).
    """

    def __init__(
        self, *, original: pytest.Item, level: str, child_nodeid: str, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.original = original
        self.level = level
        self.child_nodeid = child_nodeid

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        """The original item's location."""
        return self.original.reportinfo()

    def runtest(self) -> None:
        """Never called: :class:`ParentPlugin` replays the child's reports instead."""
        raise RuntimeError(f"{self.nodeid} runs in the {capability.level_id(self.level)} process")


def _child_nodeid(item: pytest.Item) -> str:
    groups = sorted(
        {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
    )
    suffix = "@" + "_".join(groups)
    if groups and item.nodeid.endswith(suffix):
        return item.nodeid[: -len(suffix)]
    return item.nodeid


def _stand_in(session: pytest.Session, item: pytest.Item, level: str) -> LevelItem:
    standin = LevelItem.from_parent(
        session,
        name=item.name,
        nodeid=item.nodeid,
        path=item.path,
        original=item,
        level=level,
        child_nodeid=_child_nodeid(item),
    )
    standin.keywords.update(item.keywords)
    for mark in item.iter_markers():
        standin.own_markers.append(mark)
        standin.keywords[mark.name] = mark
    standin.user_properties = list(item.user_properties)
    if session.config.pluginmanager.hasplugin("timeout"):
        # The test's timeout applies in its child; the parent only waits.
        timeout = pytest.mark.timeout(0)
        standin.own_markers.insert(0, timeout.mark)
    from pytest_backends.matrix import plugin as matrix

    backend_config = item.stash.get(matrix.CONFIG_KEY, None)
    if backend_config is not None:
        standin.stash[matrix.CONFIG_KEY] = backend_config
    return standin


def _claim(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def _alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # no cheap, harmless probe elsewhere
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _warning_message(event: Mapping[str, Any]) -> warnings.WarningMessage:
    category: type[Warning] = UserWarning
    module, _, name = str(event.get("category", "")).rpartition(".")
    with contextlib.suppress(Exception):
        found = getattr(importlib.import_module(module), name)
        if isinstance(found, type) and issubclass(found, Warning):
            category = found
    text = str(event.get("message", ""))
    try:
        message: Warning = category(text)
    except Exception:
        message = UserWarning(text)
    return warnings.WarningMessage(
        message, category, str(event.get("filename", "")), int(event.get("lineno") or 0)
    )


def _untuple(report: pytest.TestReport) -> None:
    """Restore the tuples JSON turned into lists (pytest asserts a skip's longrepr is one)."""
    longrepr: object = report.longrepr
    if isinstance(longrepr, list) and len(longrepr) == 3:
        path, lineno, reason = longrepr
        report.longrepr = (str(path), int(lineno), str(reason))
    where: list[Any] = list(report.location)
    report.location = (str(where[0]), None if where[1] is None else int(where[1]), str(where[2]))
    report.user_properties = [(str(name), value) for name, value in report.user_properties]
    report.sections = [(str(title), str(text)) for title, text in report.sections]


class ParentPlugin:
    """Swaps level items for stand-ins and replays their reports from the children.

    Levels are claimed lazily: a process claims the level it needs when its
    own child slot is free.  A process that waits with a free slot claims the
    next unclaimed level of the session, so under xdist idle workers run the
    levels that busy ones would otherwise queue.
    """

    def __init__(self, config: pytest.Config, jobs: int = 1) -> None:
        self.config = config
        workerinput = getattr(config, "workerinput", None)
        if isinstance(workerinput, dict) and _SHARED_DIR_KEY in workerinput:
            self.shared_dir = Path(workerinput[_SHARED_DIR_KEY])
            self._owns_dir = False
        else:
            unique = f"pytest-backends-cap-{uuid.uuid4().hex}"
            self.shared_dir = Path(tempfile.gettempdir()) / unique
            self._owns_dir = True
        self._supervisor = _Supervisor(config, self.shared_dir, jobs)
        self._by_level: dict[str, list[LevelItem]] = {}
        self._feeds: dict[str, LevelFeed] = {}
        self._tried: set[str] = set()
        self._unsupported: dict[str, str | None] = {}

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        levels = config.stash[SETTINGS_KEY].levels
        if not levels:
            return []
        line = f"backends: CPU capability levels {', '.join(levels)}, one process each"
        fake = os.environ.get(capability.FAKE_FEATURES_ENV)
        if fake:
            line += f" (CPU features edited by {capability.FAKE_FEATURES_ENV}={fake})"
        return [line]

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        if not self.config.option.collectonly:
            for index, item in enumerate(session.items):
                level = level_of(item)
                if level is not None:
                    standin = _stand_in(session, item, level)
                    session.items[index] = standin
                    self._by_level.setdefault(level, []).append(standin)
        return (yield)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> bool | None:
        if not isinstance(item, LevelItem):
            return None
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reason = self._unsupported_reason(item.level)
        if reason is not None:
            self._log_skip(item, reason)
        else:
            self._replay(item, self._wait(item))
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(
        self, session: pytest.Session, exitstatus: int | pytest.ExitCode
    ) -> Generator[None, object, object]:
        # Other processes may still wait for the levels this one owns, unless
        # the run is stopping anyway.
        stop = (
            bool(session.shouldstop or session.shouldfail)
            or exitstatus == pytest.ExitCode.INTERRUPTED
        )
        self._supervisor.finish(stop=stop)
        return (yield)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._supervisor.finish(stop=True)
        if self._owns_dir:
            shutil.rmtree(self.shared_dir, ignore_errors=True)

    def _unsupported_reason(self, level: str) -> str | None:
        if level not in self._unsupported:
            self._unsupported[level] = capability.unsupported_reason(level)
        return self._unsupported[level]

    def _claim_some(self, needed: str) -> None:
        """Claim ``needed``, then the next unclaimed levels, while this process has free slots."""
        for level in (needed, *self._by_level):
            if self._supervisor.busy:
                return
            if level in self._tried or self._unsupported_reason(level) is not None:
                continue
            self._tried.add(level)
            self.shared_dir.mkdir(parents=True, exist_ok=True)
            if _claim(self.shared_dir / f"{level}.lock"):
                nodeids = tuple(standin.child_nodeid for standin in self._by_level[level])
                self._supervisor.submit(_Job(level, nodeids))

    def _wait(self, item: LevelItem) -> _Record:
        feed = self._feeds.get(item.level)
        if feed is None:
            feed = LevelFeed(item.level, self.shared_dir / f"{item.level}.events.jsonl")
            self._feeds[item.level] = feed
        record = feed.record(item.child_nodeid)
        last_progress = time.monotonic()
        while not record.done:
            self._claim_some(item.level)
            if feed.poll():
                last_progress = time.monotonic()
                continue
            if feed.ended:
                tag = capability.level_id(item.level)
                record.lost = f"not run: the {tag} process never reported it"
                break
            if time.monotonic() - last_progress > _LIVENESS_S:
                gone = self._owner_gone(feed)
                if gone is not None:
                    record.lost = gone
                    break
                last_progress = time.monotonic()
            time.sleep(_POLL_S)
        return record

    def _owner_gone(self, feed: LevelFeed) -> str | None:
        try:
            owner = int((self.shared_dir / f"{feed.level}.lock").read_text() or "0")
        except (OSError, ValueError):
            return None
        if owner <= 0 or owner == os.getpid() or _alive(owner):
            return None
        if feed.child_pid is not None and _alive(feed.child_pid):
            return None
        return (
            f"not run: the pytest process that ran the {capability.level_id(feed.level)} "
            f"tests (pid {owner}) exited before this test was reported"
        )

    def _replay(self, item: LevelItem, record: _Record) -> None:
        hook = self.config.hook
        whens: list[str] = []
        for data in record.reports:
            report = hook.pytest_report_from_serializable(config=self.config, data=data)
            _untuple(report)
            report.nodeid = item.nodeid
            whens.append(str(report.when))
            item.ihook.pytest_runtest_logreport(report=report)
        for event in record.warnings:
            hook.pytest_warning_recorded.call_historic(
                kwargs={
                    "warning_message": _warning_message(event),
                    "when": "runtest",
                    "nodeid": item.nodeid,
                    "location": None,
                }
            )
        if record.crash is not None:
            when = "setup" if "setup" not in whens else "teardown" if "call" in whens else "call"
            self._log_failure(item, when, record.crash)
        elif record.lost is not None:
            self._log_failure(item, "setup", record.lost)

    def _log_failure(self, item: LevelItem, when: str, message: str) -> None:
        def fail() -> None:
            pytest.fail(message, pytrace=False)

        phase: Any = when
        report = pytest.TestReport.from_item_and_call(item, pytest.CallInfo.from_call(fail, phase))
        item.ihook.pytest_runtest_logreport(report=report)
        if when != "teardown":
            self._log_passed_teardown(item)

    def _log_passed_teardown(self, item: LevelItem) -> None:
        def nothing() -> None:
            return None

        call = pytest.CallInfo.from_call(nothing, "teardown")
        item.ihook.pytest_runtest_logreport(report=pytest.TestReport.from_item_and_call(item, call))

    def _log_skip(self, item: LevelItem, reason: str) -> None:
        path, lineno, _ = item.reportinfo()
        now = time.time()
        report = pytest.TestReport(
            item.nodeid,
            item.location,
            dict.fromkeys(item.keywords, 1),
            "skipped",
            (os.fspath(path), (lineno or 0) + 1, f"Skipped: {reason}"),
            "setup",
            start=now,
            stop=now,
            user_properties=list(item.user_properties),
        )
        item.ihook.pytest_runtest_logreport(report=report)
        self._log_passed_teardown(item)


class XdistHooks:
    """Hands the shared directory from the xdist controller to its workers."""

    def __init__(self, parent: ParentPlugin) -> None:
        self._parent = parent

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Give a new worker the directory of the level event files."""
        node.workerinput[_SHARED_DIR_KEY] = str(self._parent.shared_dir)


# --------------------------------------------------------------------------
# the child side


class ChildPlugin:
    """Runs one level's items in this process and streams their reports to the parent."""

    def __init__(self, config: pytest.Config, spec_path: Path) -> None:
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
        self.config = config
        self.level = str(spec["level"])
        self.wanted = [str(nodeid) for nodeid in spec["nodeids"]]
        self._writer = _EventWriter(Path(spec["events"]))

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._writer.write({"ev": "hello", "pid": os.getpid()})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        wanted = set(self.wanted)
        keep = [item for item in items if item.nodeid in wanted]
        dropped = [item for item in items if item.nodeid not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._writer.write(
                {"ev": "collect-error", "nodeid": report.nodeid, "text": str(report.longrepr)}
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        mismatch = capability.verify_level(self.level)
        if mismatch is not None:
            self._writer.write({"ev": "abort", "message": mismatch})
            return True
        return None

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self._writer.write({"ev": "start", "nodeid": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self._writer.write({"ev": "report", "nodeid": report.nodeid, "data": data})

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        # "finish" is written outside the warnings plugin's wrapper, which
        # records the test's warnings only after pytest_runtest_logfinish:
        # the parent replays a test once it is finished, warnings included.
        result = yield
        self._writer.write({"ev": "finish", "nodeid": item.nodeid})
        return result

    def pytest_warning_recorded(
        self,
        warning_message: warnings.WarningMessage,
        when: str,
        nodeid: str,
        location: object,
    ) -> None:
        if when != "runtest" or not nodeid:
            return
        category = warning_message.category
        self._writer.write(
            {
                "ev": "warning",
                "nodeid": nodeid,
                "message": str(warning_message.message),
                "category": f"{category.__module__}.{category.__qualname__}",
                "filename": warning_message.filename,
                "lineno": warning_message.lineno,
            }
        )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._writer.close()
