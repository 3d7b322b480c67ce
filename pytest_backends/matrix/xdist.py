"""xdist integration: hand the controller's sampling seed to every worker.

Registered only when pytest-xdist is active, in the controller.  Each worker
then expands the matrix with the same seed (read back in
:meth:`pytest_backends.matrix.settings.MatrixSettings.from_config`), so every
process collects the same items with the same ids (xdist refuses to run
otherwise).
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_backends import _xdist
from pytest_backends.matrix.settings import SEED_CHANNEL, MatrixSettings

__all__ = ["XdistHooks"]


class XdistHooks:
    """Controller-side xdist hooks."""

    def __init__(self, settings: MatrixSettings) -> None:
        self.settings = settings

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Send the resolved seed (random unless given) to the new worker."""
        if self.settings.seed is not None:
            _xdist.send(node, SEED_CHANNEL, self.settings.seed)
