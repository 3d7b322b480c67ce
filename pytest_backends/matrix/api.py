"""The matrix's public helpers: an item's config, its device, and a config applied by hand.

``pytest_backends.use_config`` is :func:`use_config`; the ``backend_config``
and ``backend_device`` fixtures are :func:`config_for` and :func:`device_for`;
other plugins find an item's config under :data:`CONFIG_KEY`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_backends._shared import CONFIG_KEY
from pytest_backends.matrix import availability
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import (
    DEFAULT_CONFIG,
    AxisRegistry,
    BackendConfig,
    unavailable_reason,
)

# CONFIG_KEY (from the shared module, where every feature reads it) is public here: the
# ``pytest.StashKey`` under which each item's config is stored, for other plugins
# (``item.stash.get(CONFIG_KEY, None)``; absent for a test the matrix did not touch).
__all__ = ["CONFIG_KEY", "config_for", "device_for", "use_config"]


def config_for(node: pytest.Item) -> BackendConfig:
    """The config of an item: its matrix config, or ``default`` (torch's defaults)."""
    config = node.stash.get(CONFIG_KEY, None)
    return config if isinstance(config, BackendConfig) else DEFAULT_CONFIG


def device_for(config: BackendConfig) -> Any:
    """A ``torch.device`` for the config's device."""
    import torch

    return torch.device(config.device)


@contextlib.contextmanager
def use_config(
    config: BackendConfig, *, registry: AxisRegistry | None = None
) -> Iterator[BackendConfig]:
    """Apply a config's flags for the ``with`` block, then restore every flag.

    For hypothesis tests that draw a config per example
    (:func:`pytest_backends.strategies.backend_configs`): function-scoped
    fixtures such as ``backend_config`` wrap the whole test, not each example,
    so apply the drawn config inside the test body.  A config this machine
    cannot run calls ``pytest.skip`` with the reason.  ``registry`` is needed
    only for configs with axes that are not built in.
    """
    from pytest_backends.flags import override_flags

    registry = registry or builtin_registry()
    unknown = [axis for axis, _ in config.choices if axis not in registry]
    if unknown:
        raise ValueError(
            f"config {config.id!r} uses axes {unknown} that the registry does not know; "
            "pass registry= the registry that defines them"
        )
    if config.choices:
        why = unavailable_reason(config, registry, availability.probe())
        if why is not None:
            pytest.skip(why)
    with override_flags(config.flags):
        yield config
