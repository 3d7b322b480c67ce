"""The matrix as a feature: its settings, where they are kept, and the plugins it needs.

The registrar (:mod:`pytest_backends.plugin`) stores
``Settings.from_config(config)`` under :data:`SETTINGS_KEY` and registers
what :func:`plugins` returns: the collection hooks in every process; the
verifier with ``--backends-verify``; the report and, under pytest-xdist, the
seed hand-over in the controller; the environment lines in each worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends.matrix.settings import SETTINGS_KEY
from pytest_backends.matrix.settings import MatrixSettings as Settings

__all__ = ["READS_REQUIRED_AXES", "SETTINGS_KEY", "Settings", "collected", "files", "plugins"]

#: The settings read the axes other features require: they resolve after those.
READS_REQUIRED_AXES = True


def _check_outputs(settings: Settings) -> None:
    """Refuse, before any test runs, report paths that would be refused at the end."""
    from pytest_backends import _files

    for flag, path, kind in (
        ("--backends-report", settings.report_json, _files.JSON_REPORT),
        ("--backends-html", settings.report_html, _files.HTML_REPORT),
    ):
        if path is not None:
            try:
                _files.check_output(path, kind)
            except _files.OutputFileError as exc:
                raise pytest.UsageError(f"{flag}: {exc}") from None


def files(settings: Settings) -> list[tuple[str, Path | None, bool]]:
    """The report files the settings name: ``(option, path, written)``."""
    return [
        ("--backends-report", settings.report_json, True),
        ("--backends-html", settings.report_html, True),
    ]


def _check_ignored(config: pytest.Config, settings: Settings) -> None:
    """Say when an option does nothing in this run (an error under ``--backends-strict``)."""
    if settings.sample is None or settings.enabled:
        return
    message = (
        f"{settings.sample_source} does nothing without the matrix: sampling picks "
        "configurations of the matrix, which is off; add --backends-matrix (or --backends-config)"
    )
    if _shared.strict(config):
        raise pytest.UsageError(message + " (--backends-strict)")
    config.issue_config_time_warning(pytest.PytestConfigWarning(message), stacklevel=2)


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The matrix, verification, report and xdist plugins ``settings`` need (not registered)."""
    from pytest_backends.matrix.hooks import MatrixPlugin

    is_worker = _xdist.is_worker(config)
    if not is_worker:
        _check_outputs(settings)
        _check_ignored(config, settings)
    found: list[tuple[object, str]] = [(MatrixPlugin(config, settings), "backends-matrix")]
    if settings.verify != "off":
        from pytest_backends.matrix.verify_cost import CostSummary, TimedVerifyPlugin

        found.append((TimedVerifyPlugin(strict=settings.verify == "strict"), "backends-verify"))
        if not is_worker:
            found.append((CostSummary(), "backends-verify-cost"))
    if not is_worker and (settings.enabled or settings.report_json or settings.report_html):
        from pytest_backends.matrix.report_plugin import ReportPlugin

        found.append((ReportPlugin(config, settings), "backends-report"))
    if is_worker:
        from pytest_backends.matrix.environment import WorkerEnvironment

        found.append((WorkerEnvironment(config), "backends-environment"))
    if not is_worker and config.pluginmanager.hasplugin("xdist"):
        from pytest_backends.matrix.xdist import XdistHooks

        found.append((XdistHooks(settings), "backends-xdist"))
    return found


def collected(
    config: pytest.Config, settings: Settings, items: list[pytest.Item]
) -> list[tuple[object, str]]:
    """The plugin that fails tests with a wrong marker, if collection kept any."""
    from pytest_backends.matrix.hooks import MARKER_ERROR_KEY, MarkerErrors

    if config.pluginmanager.has_plugin("backends-marker-errors"):
        return []
    if any(MARKER_ERROR_KEY in item.stash for item in items):
        return [(MarkerErrors(), "backends-marker-errors")]
    return []
