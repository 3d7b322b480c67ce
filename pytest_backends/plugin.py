"""pytest entry point and the plugin's only registrar.

This module adds the hookspecs, the options and the markers, and walks the
features (:data:`FEATURES`): each resolves its settings through the one
option resolver (``Settings.from_config``), the registrar stores them under
the feature's own key and registers the plugins the feature asks for
(``plugins(config, settings)``); see :mod:`pytest_backends._feature`.  It is
imported for every pytest run once the package is installed, so it never
imports torch; the feature modules import torch lazily.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

from pytest_backends import (
    _options,
    _shared,
    hookspecs,
    isolation,
    label,
    native_build,
    nothing_selected,
)
from pytest_backends._feature import Feature
from pytest_backends.batch import feature as batch
from pytest_backends.batch import marker as batch_marker
from pytest_backends.capability import feature as capability
from pytest_backends.determinism import feature as determinism
from pytest_backends.isolation import feature as isolation_feature
from pytest_backends.isolation import markers as isolation_markers
from pytest_backends.matrix import feature as matrix
from pytest_backends.matrix import markers
from pytest_backends.paths import feature as paths

#: The features, in registration order.  Hooks of the same priority run in reverse
#: registration order, which orders the header lines, the summary sections and which
#: setup failure speaks first: the leak guard comes first and the matrix right after it.
FEATURES: tuple[Feature, ...] = (
    isolation_feature,
    matrix,
    capability,
    determinism,
    batch,
    paths,
    nothing_selected,
    label,
    native_build,
)


def resolution_order() -> list[Feature]:
    """:data:`FEATURES`, those that read the required axes (``READS_REQUIRED_AXES``) last."""
    reads = [f for f in FEATURES if getattr(f, "READS_REQUIRED_AXES", False)]
    return [f for f in FEATURES if f not in reads] + reads


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Add the plugin's own hooks (``pytest_backends_configurations``)."""
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--backends-*`` options and their ini twins (from the option table)."""
    _options.register(parser)


def resolve(config: pytest.Config) -> None:
    """Resolve every feature's settings once into ``config.stash``.

    Axes a feature requires of the matrix (``required_axes``) are gathered in
    :data:`pytest_backends._shared.REQUIRED_AXES_KEY` before the features that
    read them resolve (:func:`resolution_order`).
    """
    if _shared.REQUIRED_AXES_KEY in config.stash:
        return
    required: list[str] = []
    for feature in resolution_order():
        config.stash[_shared.REQUIRED_AXES_KEY] = tuple(required)
        settings = feature.Settings.from_config(config)
        config.stash[feature.SETTINGS_KEY] = settings
        required += [a for a in getattr(settings, "required_axes", ()) if a not in required]
    config.stash[_shared.REQUIRED_AXES_KEY] = tuple(required)


def pytest_cmdline_main(config: pytest.Config) -> None:
    """Resolve the settings; let features act before pytest-xdist starts workers.

    A feature with ``prepare(config, settings)`` (the CPU level workers) runs
    it here: xdist has read ``-n`` by now and starts its workers later.
    """
    resolve(config)
    for feature in FEATURES:
        prepare = getattr(feature, "prepare", None)
        if prepare is not None:
            prepare(config, config.stash[feature.SETTINGS_KEY])


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
    config.addinivalue_line("markers", isolation_markers.marker_line())
    config.addinivalue_line("markers", markers.marker_line())
    config.addinivalue_line("markers", batch_marker.marker_line())
    resolve(config)
    _check_files(config)
    _register_watch(config)
    plugins: list[tuple[object, str]] = []
    for feature in FEATURES:
        plugins += feature.plugins(config, config.stash[feature.SETTINGS_KEY])
    for plugin, name in plugins:
        config.pluginmanager.register(plugin, name)


def _check_files(config: pytest.Config) -> None:
    """Refuse two options naming one file where either writes it (before any test runs)."""
    named: dict[str, tuple[str, bool]] = {}
    for feature in FEATURES:
        listed = getattr(feature, "files", None)
        for option, path, written in listed(config.stash[feature.SETTINGS_KEY]) if listed else ():
            if path is None:
                continue
            key = os.path.realpath(path)
            other = named.get(key)
            if other is not None and (written or other[1]):
                raise pytest.UsageError(
                    f"{other[0]} and {option} name the same file {path}: give each its own file"
                )
            named.setdefault(key, (option, written))


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


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Register the plugins features ask for once they see the collected items.

    A feature with ``collected(config, settings, items)`` registers its
    per-test hooks here only when a collected test needs them (a marker).
    """
    config = session.config
    for feature in FEATURES:
        collected = getattr(feature, "collected", None)
        if collected is not None:
            for plugin, name in collected(
                config, config.stash[feature.SETTINGS_KEY], session.items
            ):
                config.pluginmanager.register(plugin, name)


@pytest.fixture
def backend_flags() -> Generator[Any, None, None]:
    """Set torch backend flags inside a test; every flag is restored at teardown.

    ``backend_flags.set({"cudnn.benchmark": True})`` validates and applies the
    mapping; once a flag was set, the state from when the fixture was set up
    is restored when the test's teardown runs, whatever its outcome (a
    ``set`` inside ``override_flags()`` included).
    """
    handle = isolation.FlagSetter()
    handle.begin()
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
    from pytest_backends.matrix.api import config_for

    return config_for(request.node)


@pytest.fixture
def backend_device(backend_config: Any) -> Any:
    """A ``torch.device`` for the config's device axis (``cpu`` unless the config says)."""
    from pytest_backends.matrix.api import device_for

    return device_for(backend_config)


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
