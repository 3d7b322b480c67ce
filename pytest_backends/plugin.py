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
    from pytest_backends import matrix

    matrix.addoption(parser, group)
    # <capability-options>
    from pytest_backends import _capability_runner

    _capability_runner.addoption(parser, group)
    # <determinism-options>
    group.addoption(
        "--backends-determinism",
        action="store",
        nargs="?",
        const="on",
        default=None,
        metavar="N",
        help="run each test marked @pytest.mark.backends(deterministic=...) N times "
        "(bare flag: 5) under an op recorder and fail it when an op's output differs "
        "between runs; 'off' disables. ini: backends_determinism",
    )
    parser.addini(
        "backends_determinism",
        "determinism runs per selected test: a number >= 2, 'on' (5) or 'off'",
        default="",
    )
    group.addoption(
        "--backends-determinism-all",
        action="store_true",
        default=False,
        help="check every test, not only marked ones (turns the check on). "
        "ini: backends_determinism_all",
    )
    parser.addini(
        "backends_determinism_all", "determinism check for every test", type="bool", default=False
    )
    group.addoption(
        "--backends-census",
        action="store",
        default=None,
        metavar="PATH",
        help="write the op census (verdict per op, device and dtype) as JSON to PATH "
        "(turns the check on). ini: backends_census",
    )
    parser.addini("backends_census", "op census JSON file to write", default="")
    group.addoption(
        "--backends-baseline",
        action="store",
        default=None,
        metavar="PATH",
        help="JSON file of accepted nondeterministic ops: the run fails only for ops "
        "not in it (turns the check on). ini: backends_baseline",
    )
    parser.addini("backends_baseline", "baseline JSON file of accepted ops", default="")
    group.addoption(
        "--backends-baseline-update",
        action="store_true",
        default=False,
        help="rewrite the --backends-baseline file with this run's nondeterministic ops "
        "instead of failing on them. ini: backends_baseline_update",
    )
    parser.addini(
        "backends_baseline_update", "rewrite the baseline file", type="bool", default=False
    )
    # <tolerance-options>


def pytest_configure(config: pytest.Config) -> None:
    """Resolve settings once and register the feature plugins that are in use."""
    config.addinivalue_line(
        "markers",
        "backends_leaks(mode): override --backends-leaks (fail, warn, off) for one test",
    )
    # <markers>
    from pytest_backends import markers

    config.addinivalue_line("markers", markers.marker_line())
    settings = isolation.resolve_leak_mode(config)
    config.pluginmanager.register(isolation.IsolationPlugin(settings), "backends-isolation")
    # <matrix-configure>
    from pytest_backends import matrix

    matrix.configure(config)
    # <capability-configure>
    from pytest_backends import _capability_runner

    _capability_runner.configure(config)
    # <determinism-configure>
    determinism_names = (
        "backends_determinism",
        "backends_determinism_all",
        "backends_census",
        "backends_baseline",
        "backends_baseline_update",
    )
    if any(config.getoption(n, None) or config.getini(n) for n in determinism_names):
        from pytest_backends import determinism_plugin

        determinism_plugin.configure(config)
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


# <matrix-fixtures>
@pytest.fixture
def backend_config(request: pytest.FixtureRequest) -> Any:
    """The ``BackendConfig`` the test runs under (``.id``, ``.axes``, ``.flags``, ``.device``).

    With ``--backends-matrix`` each marked test is parametrized over configs and
    this is its config; otherwise it is the ``default`` config (torch's
    defaults, on the CPU).
    """
    from pytest_backends import matrix

    return matrix.config_for(request.node)


@pytest.fixture
def backend_device(backend_config: Any) -> Any:
    """A ``torch.device`` for the config's device axis (``cpu`` unless the config says)."""
    from pytest_backends import matrix

    return matrix.device_for(backend_config)


# <tolerance-fixtures>
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
