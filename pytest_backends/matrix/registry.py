"""The run's axis registry: the built-in axes plus those ``pytest_backends_configurations`` adds.

Built once per run, on first use, and kept in ``config.stash``: the hooks
that expand tests and the report that orders and parses configuration ids
read the same registry, and neither reaches into the other for it.
"""

from __future__ import annotations

import pytest

from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import Axis, AxisRegistry, ConfigError

__all__ = ["axis_registry"]

_KEY: pytest.StashKey[AxisRegistry] = pytest.StashKey()


def axis_registry(config: pytest.Config) -> AxisRegistry:
    """The axes of this run (a ``pytest.UsageError`` names a bad hook result)."""
    registry = config.stash.get(_KEY, None)
    if registry is None:
        registry = builtin_registry()
        results = config.hook.pytest_backends_configurations(config=config)
        try:
            for result in results:
                if isinstance(result, Axis):
                    result = [result]
                if result:
                    registry = registry.extended(result)
        except ConfigError as exc:
            raise pytest.UsageError(f"pytest_backends_configurations: {exc}") from None
        config.stash[_KEY] = registry
    return registry
