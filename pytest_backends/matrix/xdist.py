"""xdist integration: hand the controller's sampling seed to every worker.

Registered only when pytest-xdist is active, in the controller.  Each worker
then expands the matrix with the same seed, so every process collects the
same items with the same ids (xdist refuses to run otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_backends.matrix.plugin import MatrixSettings

__all__ = ["WORKERINPUT_SEED", "WORKEROUTPUT_COLLECTED", "XdistHooks"]

#: The ``workerinput`` key carrying the seed of ``--backends-sample``.
WORKERINPUT_SEED = "backends_seed"
#: The ``workeroutput`` key carrying a worker's collected items (node id -> config id).
WORKEROUTPUT_COLLECTED = "backends_collected"


class XdistHooks:
    """Controller-side xdist hooks."""

    def __init__(self, settings: MatrixSettings) -> None:
        self.settings = settings

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Send the resolved seed (random unless given) to the new worker."""
        if self.settings.seed is not None:
            node.workerinput[WORKERINPUT_SEED] = self.settings.seed
