"""The determinism check as a feature: its settings, and the plugins it needs.

The options resolve once into
:class:`~pytest_backends.determinism.settings.Settings` (which also reads the
baseline). :func:`plugins` refuses output paths that would be refused at the
end, and returns the hook layer (:mod:`~pytest_backends.determinism.plugin`)
and the subtest counter.

Importing this module never imports torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_backends import _xdist
from pytest_backends.determinism.settings import MAX_RUNS, SETTINGS_KEY, Settings, parse_runs

__all__ = ["MAX_RUNS", "SETTINGS_KEY", "Settings", "files", "parse_runs", "plugins"]


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The hook layer and the subtest counter when the check is on (else none).

    In the controller, refuses output paths before any test runs.
    """
    if not settings.enabled:
        return []
    from pytest_backends.determinism.census import Baseline
    from pytest_backends.determinism.plugin import DeterminismPlugin
    from pytest_backends.determinism.runs import SubtestCounter

    accepted = settings.accepted if settings.accepted is not None else Baseline()
    worker = _xdist.is_worker(config)
    if not worker:
        _check_outputs(settings)
    return [
        (DeterminismPlugin(config, settings, accepted), "backends-determinism"),
        (SubtestCounter(), "backends-subtests"),
    ]


def files(settings: Settings) -> list[tuple[str, Path | None, bool]]:
    """The census and baseline files the settings name: ``(option, path, written)``."""
    return [
        ("--backends-census", settings.census, True),
        ("--backends-baseline", settings.baseline, settings.baseline_update),
    ]


def _check_outputs(settings: Settings) -> None:
    """Refuse, before any test runs, output paths that would be refused at the end."""
    from pytest_backends import _files

    outputs = [("--backends-census", settings.census, _files.CENSUS)]
    if settings.baseline_update:
        outputs.append(("--backends-baseline-update", settings.baseline, _files.BASELINE))
    for flag, path, kind in outputs:
        if path is not None:
            try:
                _files.check_output(path, kind)
            except _files.OutputFileError as exc:
                raise pytest.UsageError(f"{flag}: {exc}") from None
