"""The determinism settings: a leaf that the feature and its hook layer both import.

``--backends-determinism[=N]``, ``--backends-determinism-all``,
``--backends-census``, ``--backends-baseline`` (each with its ini twin),
``--backends-baseline-update`` and ``--backends-determinism-repeatable`` are
resolved once, through :func:`pytest_backends._options.lookup`, into
:class:`Settings`. The check is on when ``--backends-determinism`` asks for
it, or when ``--backends-determinism-all``, a census or a baseline implies it
(only the command line's ``off`` overrides them). A baseline given is read and
validated here, so that a bad file is a usage error before any test runs.

Importing this module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_backends import _options, _xdist
from pytest_backends.determinism import DEFAULT_RUNS

if TYPE_CHECKING:
    from pytest_backends.determinism.census import Baseline

__all__ = ["MAX_RUNS", "SETTINGS_KEY", "Settings", "parse_runs"]

#: The largest N accepted by ``--backends-determinism``.
MAX_RUNS = 1000

_OFF = _options.OFF_WORDS
# The options that can turn the check on: an empty value of each means "off", not a bad path.
_OPTION_NAMES = (
    "backends_determinism",
    "backends_determinism_all",
    "backends_census",
    "backends_baseline",
    "backends_baseline_update",
)


def parse_runs(value: str, source: str) -> int | None:
    """Parse ``--backends-determinism``'s ``N``: an int >= 2, ``on`` (default) or ``off`` (None)."""
    text = value.strip().lower()
    if text in ("", "default", "on", "true", "yes"):
        return DEFAULT_RUNS
    if text in _OFF:
        return None
    try:
        runs = int(text)
    except ValueError:
        raise pytest.UsageError(
            f"{source}: expected a number of runs (an integer >= 2), 'on' or 'off', got "
            f"{value!r}. Write --backends-determinism=N: a bare --backends-determinism "
            "takes the next argument as N."
        ) from None
    if runs < 2:
        raise pytest.UsageError(
            f"{source}: the determinism check needs at least 2 runs, got {runs} "
            "(use 'off' to disable it)"
        )
    if runs > MAX_RUNS:
        raise pytest.UsageError(
            f"{source}: at most {MAX_RUNS} runs, got {runs}: every selected test runs N times "
            "under the op recorder, so a larger N only multiplies the session's time (a "
            "nondeterministic kernel usually shows within 2 to 10 runs); pick N <= "
            f"{MAX_RUNS}"
        )
    return runs


def _path(config: pytest.Config, name: str) -> Path | None:
    """A file option's path: from the command line relative to the invocation directory,
    from the ini file relative to the rootdir; None when unset or empty in the ini file."""
    raw = _options.lookup(config, name)
    if raw.from_cli:
        if not raw.text.strip():
            raise pytest.UsageError(f"{raw.source}: expected a file path, got an empty value")
        return Path(config.invocation_params.dir) / raw.text
    text = raw.text.strip()
    return config.rootpath / text if text else None


@dataclass(frozen=True)
class Settings:
    """The resolved determinism options (``enabled`` False: the check is off)."""

    runs: int = DEFAULT_RUNS
    select_all: bool = False
    census: Path | None = None
    baseline: Path | None = None
    baseline_update: bool = False
    #: Fail tests that are not repeatable instead of reporting them as not checked.
    repeatable: bool = False
    enabled: bool = False
    #: The option that turned the check on, for "selected no test" messages.
    option: str = "--backends-determinism"
    #: The baseline file's contents (None: no baseline given).
    accepted: Baseline | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Resolve the options once (command line over ini); raises ``pytest.UsageError``.

        ``--backends-determinism-all``, ``--backends-census`` and
        ``--backends-baseline`` turn the check on with the default number of runs.
        """
        if not any(_options.lookup(config, name).value for name in _OPTION_NAMES):
            return cls()
        select_all = bool(_options.lookup(config, "backends_determinism_all").value)
        census = _path(config, "backends_census")
        baseline = _path(config, "backends_baseline")
        update = bool(_options.lookup(config, "backends_baseline_update").value)
        if update and baseline is None:
            raise pytest.UsageError(
                "--backends-baseline-update: name the file to write with --backends-baseline=PATH"
            )
        if baseline is not None:
            _refuse_shared_baseline(config, baseline)
        raw = _options.lookup(config, "backends_determinism")
        text = raw.text if raw.from_cli else raw.text.strip()
        runs = parse_runs(text, raw.source) if raw.from_cli or text else None
        repeatable = bool(_options.lookup(config, "backends_determinism_repeatable").value)
        implied = select_all or census is not None or baseline is not None
        if runs is None:
            if not implied or (raw.from_cli and raw.text.strip().lower() in _OFF):
                if implied and not _xdist.is_worker(config):
                    losers = [
                        name
                        for name, on in (
                            ("--backends-determinism-all", select_all),
                            ("--backends-census", census is not None),
                            ("--backends-baseline", baseline is not None),
                        )
                        if on
                    ]
                    config.issue_config_time_warning(
                        pytest.PytestConfigWarning(
                            f"--backends-determinism={raw.text.strip()} wins over "
                            f"{', '.join(losers)}: the determinism check is off"
                        ),
                        stacklevel=2,
                    )
                return cls()
            runs = DEFAULT_RUNS
        option = "--backends-determinism"
        if not raw.from_cli:
            option = (
                "--backends-census" if census else ("--backends-baseline" if baseline else option)
            )
        accepted = None
        if baseline is not None:
            from pytest_backends.determinism.census import load_baseline

            accepted = load_baseline(config, baseline, update, "--backends-baseline")
        return cls(runs, select_all, census, baseline, update, repeatable, True, option, accepted)


def _refuse_shared_baseline(config: pytest.Config, baseline: Path) -> None:
    """Refuse one file for both baselines: each writer would replace the other's file."""
    raw = _options.lookup(config, "backends_batch_baseline")
    text = raw.text.strip()
    if not text:
        return
    base = Path(config.invocation_params.dir) if raw.from_cli else config.rootpath
    if (base / text).resolve() == baseline.resolve():
        raise pytest.UsageError(
            f"--backends-baseline and --backends-batch-baseline name the same file ({baseline}): "
            "the determinism baseline and the batch-invariance baseline are different files, "
            "and each update rewrites its whole file; give each its own path"
        )


#: Where the registrar stores the :class:`Settings`.
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
