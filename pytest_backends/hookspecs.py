"""Hooks that pytest_backends adds to pytest (registered with ``add_hookspecs``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy
import pytest

if TYPE_CHECKING:
    from pytest_backends.matrix.configs import Axis

__all__ = ["pytest_backends_configurations"]

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_backends_configurations(config: pytest.Config) -> Iterable[Axis] | None:
    """Add axes, or values of existing axes, to the backend matrix.

        Return :class:`pytest_backends.matrix.configs.Axis` objects.  An axis with a new
        name is appended after the built-in ones (so existing ids do not change);
        an axis with a known name adds its values to that axis.  Called once per
        session, at session start, in every process (xdist workers included), so
        the result must not depend on the machine.  Implement it in a plugin or
        in the ``conftest.py`` at the root of the test run::

            from pytest_backends.matrix.configs import Axis, AxisValue

            @hookspec
    def pytest_backends_configurations(config):
                return [Axis("fastpath", (
                    AxisValue("on", "nn.MultiheadAttention fast path",
                              {"mha.fastpath_enabled": True}),
                    AxisValue("off", "no fast path", {"mha.fastpath_enabled": False}),
                ), "the MultiheadAttention fast path")]
    """
