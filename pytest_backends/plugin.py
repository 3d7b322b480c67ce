"""pytest entry point and the plugin's only registrar.

This module adds the hookspecs, the options and the markers, resolves every
setting once into frozen objects in ``config.stash`` (see
:mod:`pytest_backends._keys`), and registers the feature plugins that are in
use.  Feature modules build their plugin objects; only this module registers
them.  It is imported for every pytest run once the package is installed,
so it never imports torch; the feature modules import torch lazily.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_backends import (
    _keys,
    _native_plugin,
    _options,
    _shared,
    hookspecs,
    isolation,
    selection,
)
from pytest_backends import label as _label
from pytest_backends._feature import Feature
from pytest_backends.batch import plugin as batch_plugin
from pytest_backends.capability import levels as capability_levels
from pytest_backends.capability import plugin as capability
from pytest_backends.determinism import plugin as determinism_plugin
from pytest_backends.matrix import api as matrix_api
from pytest_backends.matrix import feature as matrix
from pytest_backends.matrix import markers

_SHARED_FEATURES: tuple[Feature, ...] = (selection, _label)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Add the plugin's own hooks (``pytest_backends_configurations``)."""
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--backends-*`` options and their ini twins (from the option table)."""
    _options.register(parser)


def resolve(config: pytest.Config) -> None:
    """Resolve every setting once, in data-dependency order, into ``config.stash``.

    The CPU levels come first because they require the matrix's
    ``cpu_capability`` axis; no feature re-resolves another's options.
    """
    if matrix.SETTINGS_KEY in config.stash:
        return
    for feature in _SHARED_FEATURES:
        config.stash[feature.SETTINGS_KEY] = feature.Settings.from_config(config)
    config.stash[_keys.LEAK_KEY] = isolation.resolve_leak_mode(config)
    levels = capability.resolve_settings(config)
    config.stash[_keys.CAPABILITY_KEY] = levels
    required = (capability_levels.AXIS,) if levels.levels is not None else ()
    config.stash[_shared.REQUIRED_AXES_KEY] = required
    config.stash[matrix.SETTINGS_KEY] = matrix.Settings.from_config(config)


def pytest_cmdline_main(config: pytest.Config) -> None:
    """Plan the CPU level workers before pytest-xdist starts any (it has read ``-n`` by now)."""
    resolve(config)
    capability.plan_distribution(config)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Watch for torch's import before any conftest can import it (imports nothing)."""
    _register_watch(early_config)


def _register_watch(config: pytest.Config) -> None:
    watch = isolation.watch_torch(config)
    if not config.pluginmanager.is_registered(watch):
        config.pluginmanager.register(watch, "backends-torch-watch")


def pytest_configure(config: pytest.Config) -> None:
    """Register the feature plugins that the resolved settings ask for."""
    config.addinivalue_line(
        "markers",
        "backends_leaks(mode): override --backends-leaks (fail, warn, off) for one test",
    )
    config.addinivalue_line("markers", markers.marker_line())
    config.addinivalue_line("markers", batch_plugin.marker_line())
    resolve(config)
    _register_watch(config)
    plugins: list[tuple[object, str]] = [
        (isolation.IsolationPlugin(config.stash[_keys.LEAK_KEY]), "backends-isolation")
    ]
    plugins += matrix.plugins(config, config.stash[matrix.SETTINGS_KEY])
    plugins += capability.configure(config, config.stash[_keys.CAPABILITY_KEY])
    plugins += determinism_plugin.configure(config)
    plugins += batch_plugin.configure(config)
    for feature in _SHARED_FEATURES:
        plugins += feature.plugins(config, config.stash[feature.SETTINGS_KEY])
    plugins += _native_plugin.configure(config)
    for plugin, name in plugins:
        config.pluginmanager.register(plugin, name)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Expand ``backends`` markers that conftest hooks added, before ``-k``/``--deselect``.

    This module registers before any conftest and after pytest's own plugins,
    so its implementation runs after the conftests' and before pytest's selection.
    """
    plugin = config.pluginmanager.get_plugin("backends-matrix")
    if plugin is not None:
        plugin.expand_hook_markers(items)


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
    return matrix_api.config_for(request.node)


@pytest.fixture
def backend_device(backend_config: Any) -> Any:
    """A ``torch.device`` for the config's device axis (``cpu`` unless the config says)."""
    return matrix_api.device_for(backend_config)


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
