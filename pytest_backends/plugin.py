"""pytest entry point: options, ini keys, markers and hook registration.

This module is imported for every pytest run once the package is installed,
so it stays declarative and never imports torch; the feature modules it
delegates to import torch lazily, when a feature is in use.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_backends import _native_plugin, isolation
from pytest_backends.capability import runner as _capability_runner
from pytest_backends.determinism import plugin as determinism_plugin
from pytest_backends.matrix import markers
from pytest_backends.matrix import plugin as matrix


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
    matrix.addoption(parser, group)
    _capability_runner.addoption(parser, group)
    determinism_plugin.addoption(parser, group)


def pytest_configure(config: pytest.Config) -> None:
    """Resolve settings once and register the feature plugins that are in use."""
    config.addinivalue_line(
        "markers",
        "backends_leaks(mode): override --backends-leaks (fail, warn, off) for one test",
    )
    config.addinivalue_line("markers", markers.marker_line())
    settings = isolation.resolve_leak_mode(config)
    config.pluginmanager.register(isolation.IsolationPlugin(settings), "backends-isolation")
    matrix.configure(config)
    _capability_runner.configure(config)
    determinism_plugin.configure(config)
    _native_plugin.configure(config)


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


@pytest.fixture
def backend_config(request: pytest.FixtureRequest) -> Any:
    """The ``BackendConfig`` the test runs under (``.id``, ``.axes``, ``.flags``, ``.device``).

    With ``--backends-matrix`` each marked test is parametrized over configs and
    this is its config; otherwise it is the ``default`` config (torch's
    defaults, on the CPU).
    """
    return matrix.config_for(request.node)


@pytest.fixture
def backend_device(backend_config: Any) -> Any:
    """A ``torch.device`` for the config's device axis (``cpu`` unless the config says)."""
    return matrix.device_for(backend_config)


@pytest.fixture
def backend_tolerance(backend_config: Any) -> Any:
    """Tolerances from the active precision flags, for the config's device.

    ``rtol, atol = backend_tolerance`` for the default dtype, or
    ``backend_tolerance(torch.float16, op="matmul", k=512)`` for a
    :class:`~pytest_backends.tolerance.Tolerance` (which unpacks the same way).
    Flags are read when asked, so they are those of the running config.
    """
    from pytest_backends.tolerance import BackendTolerance

    return BackendTolerance.for_config(backend_config)
