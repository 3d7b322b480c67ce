"""The plan of CPU level workers: xdist specs per level, made before xdist starts any.

``-n N`` means N workers *per level*; each worker's spec sets its level's
environment (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``,
``MKL_ENABLE_INSTRUCTIONS`` and a ``TORCHINDUCTOR_CACHE_DIR`` of its own)
before the worker imports anything.  Also the names of what the controller
and a worker tell each other through :mod:`pytest_backends._xdist`.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends.capability import levels

__all__ = [
    "WORKER_PLAN_KEY",
    "WorkerPlan",
    "check_tx_beside_n",
    "inductor_cache_dir",
    "level_spec",
    "plan_distribution",
    "plan_workers",
]

#: Channel names: what the controller hands a level's worker.
INPUT_LEVEL = _xdist.channel("cpu_level")
INPUT_LEVELS = _xdist.channel("cpu_levels")
INPUT_ASKED = _xdist.channel("cpu_asked")
INPUT_NOTES = _xdist.channel("cpu_notes")
INPUT_WARN = _xdist.channel("cpu_warn")
#: Channel name: how many items a worker deselected.
OUTPUT_DESELECTED = _xdist.channel("cpu_deselected_count")

_INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"


@dataclass(frozen=True)
class WorkerPlan:
    """The xdist workers the controller starts for the levels."""

    levels: tuple[str, ...]
    runnable: tuple[str, ...]
    unsupported: Mapping[str, str]
    per_level: int
    specs: tuple[str, ...]
    #: Levels this CPU can run that the option does not name: one worker each, for
    #: the tests whose marker names them (a marker keeps its own levels).
    marker_only: tuple[str, ...] = ()

    @property
    def worker_levels(self) -> tuple[str | None, ...]:
        """The levels that have workers, home level first (``None``: one plain worker)."""
        return (*(self.runnable or (None,)), *self.marker_only)


#: The controller's plan (set by :func:`plan_distribution`).
WORKER_PLAN_KEY: pytest.StashKey[WorkerPlan] = pytest.StashKey()


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
    supported: Sequence[str] = (),
) -> WorkerPlan:
    """``per_level`` workers for each wanted level this CPU can run.

    Each ``supported`` level the option does not name gets one worker of its
    own, which runs only the items of markers naming it and stops at once when
    there are none (a marker keeps its own levels, whatever the option names).
    With no runnable level, one plain worker reports the skips of the others.
    """
    missing = {lv: why for lv, why in unsupported.items() if why is not None}
    runnable = tuple(lv for lv in wanted if lv not in missing)
    specs = [level_spec(lv, environ) for lv in runnable for _ in range(per_level)] or ["popen"]
    extra = tuple(lv for lv in supported if lv not in wanted and lv not in missing)
    specs += [level_spec(lv, environ) for lv in extra]
    return WorkerPlan(tuple(wanted), runnable, missing, per_level, tuple(specs), extra)


def plan_distribution(config: pytest.Config, wanted: tuple[str, ...] | None) -> None:
    """Turn the levels into xdist worker specs (controller, before xdist starts anything).

    Called from ``pytest_cmdline_main`` after xdist turned ``-n`` into specs.
    """
    check_tx_beside_n(config)
    if wanted is None or _xdist.is_worker(config):
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
        wanted,
        per_level,
        {lv: levels.unsupported_reason(lv) for lv in wanted},
        supported=levels.supported_levels(),
    )
    config.stash[WORKER_PLAN_KEY] = plan
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
    if _xdist.is_worker(config) or not config.pluginmanager.hasplugin("xdist"):
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
