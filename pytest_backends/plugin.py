"""pytest entry point: options, ini keys, markers and hook registration.

This module is imported for every pytest run once the package is installed,
so it stays declarative and never imports torch; the feature modules it
delegates to import torch lazily, when a feature is in use.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_backends import isolation


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--backends-*`` options and their ini twins."""
    group = parser.getgroup("backends", "torch backend flags, matrix and determinism")
    group.addoption(
        "--backends-leaks",
        action="store",
        default=None,
        metavar="MODE",
        help="what to do when a test leaves a torch backend flag changed: "
        "fail (default), warn or off. ini: backends_leaks",
    )
    parser.addini(
        "backends_leaks",
        "what to do when a test leaks a torch backend flag: fail, warn or off",
        default="fail",
    )
    # <matrix-options>
    # <capability-options>
    # <determinism-options>
    # <tolerance-options>


def pytest_configure(config: pytest.Config) -> None:
    """Resolve settings once and register the feature plugins that are in use."""
    config.addinivalue_line(
        "markers",
        "backends_leaks(mode): override --backends-leaks (fail, warn, off) for one test",
    )
    # <markers>
    settings = isolation.resolve_leak_mode(config)
    config.pluginmanager.register(isolation.IsolationPlugin(settings), "backends-isolation")
    # <matrix-configure>
    # <capability-configure>
    # <determinism-configure>
    # <tolerance-configure>


@pytest.fixture
def backend_flags() -> Generator[Any, None, None]:
    """Set torch backend flags inside a test; every flag is restored at teardown.

    ``backend_flags.set({"cudnn.benchmark": True})`` validates and applies the
    mapping; the state from before the first ``set`` is restored when the
    test's teardown runs, whatever its outcome.
    """
    handle = isolation.FlagSetter()
    try:
        yield handle
    finally:
        handle.close()


# <tolerance-fixtures>
