"""xdist scheduling of CPU capability levels: each level's items go to that level's workers.

A level's workers are ordinary pytest-xdist workers whose spec sets
``ATEN_CPU_CAPABILITY`` (and the oneDNN/MKL caps) before the worker imports
anything.  Every worker collects the whole suite, so ids are identical
everywhere; this scheduler only decides which worker runs which item:

* an item whose id carries ``cap-<level>`` runs on a worker of that level,
  balanced over the level's workers like ``--dist load``;
* every other item (no level, or a level that has no worker because this CPU
  cannot run it) runs on the workers of the *home* level, the first level
  with workers, where it is run or reported as skipped with the reason.

Workers of one level must collect the same items; levels may differ (a
test whose parameters depend on the level runs under the ids its level sees).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import pytest

from pytest_backends.capability import levels

__all__ = ["LEVEL_ENV", "LevelScheduling", "Node", "level_in_nodeid", "node_level"]

#: The environment variable of a worker spec that names its level.
LEVEL_ENV = "ATEN_CPU_CAPABILITY"

_LEVEL_TOKEN = re.compile(
    r"(?<=[\[,\-])" + r"cap-(" + "|".join(map(re.escape, levels.LEVELS)) + r")(?=[\],\-@])"
)


def level_in_nodeid(nodeid: str) -> str | None:
    """The level named by the ``cap-<level>`` part of an item's parameter id, or ``None``."""
    bracket = nodeid.find("[")
    if bracket < 0:
        return None
    found = _LEVEL_TOKEN.findall(nodeid, bracket)
    return str(found[-1]) if found else None


class Node(Protocol):
    """The part of xdist's ``WorkerController`` the scheduler uses."""

    gateway: Any

    @property
    def shutting_down(self) -> bool: ...

    def send_runtest_some(self, indices: Sequence[int]) -> None: ...

    def shutdown(self) -> None: ...


def node_level(node: Node) -> str | None:
    """The level a worker was started for (from its spec's environment), or ``None``."""
    env = getattr(node.gateway.spec, "env", None) or {}
    level = env.get(LEVEL_ENV)
    return None if level is None else str(level)


class LevelScheduling:
    """Routes each level's items to that level's workers and balances within a level.

    Implements xdist's ``Scheduling`` protocol.  ``worker_levels`` are the
    levels that have workers, home level first; ``expected`` the number of
    workers started at session start (collection is complete once they all
    reported theirs).
    """

    def __init__(
        self, config: pytest.Config, worker_levels: Sequence[str | None], expected: int
    ) -> None:
        self.config = config
        self.worker_levels = tuple(dict.fromkeys(worker_levels))
        self.home = self.worker_levels[0] if self.worker_levels else None
        self.expected = expected
        self.node2collection: dict[Any, list[str]] = {}
        self.node2pending: dict[Any, list[int]] = {}
        self.collections: dict[str | None, list[str]] = {}
        self.pending: dict[str | None, list[int]] = {}
        self.scheduled = False
        self.reported = 0
        chunk = config.getoption("maxschedchunk", None)
        self.max_chunk = int(chunk) if chunk else None

    # ------------------------------------------------------------------ protocol

    @property
    def nodes(self) -> list[Any]:
        """The workers currently known to the scheduler."""
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        """Whether as many collections arrived as workers were started at session start."""
        return self.reported >= self.expected

    @property
    def tests_finished(self) -> bool:
        """Whether nothing is left to send and every worker holds at most its last item."""
        if not self.collection_is_completed or not self.scheduled:
            return False
        if any(self.pending.values()):
            return False
        return all(len(pending) < 2 for pending in self.node2pending.values())

    @property
    def has_pending(self) -> bool:
        """Whether any item waits to be sent or to finish."""
        return any(self.pending.values()) or any(self.node2pending.values())

    def add_node(self, node: Any) -> None:
        """A worker is ready; it collects next."""
        self.node2pending[node] = []

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        """Record a worker's collection; the first worker of a level defines the level's."""
        self.reported += 1
        level = self._route_level(node)
        known = self.collections.get(level)
        if known is None:
            self.collections[level] = list(collection)
        elif known != list(collection):
            self._report_mismatch(node, level, known, collection)
            self.node2pending.pop(node, None)
            node.shutdown()
            return
        self.node2collection[node] = list(collection)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        """A worker finished an item: send it more of its level's items."""
        self.node2pending[node].remove(item_index)
        self._refill(node)

    def mark_test_pending(self, item: str) -> None:
        """Run ``item`` again (a plugin asked to rerun a crashed item)."""
        for level, collection in self.collections.items():
            if item in collection and self._owns(level, item):
                self.pending.setdefault(level, []).append(collection.index(item))
                for node in self._nodes_of(level):
                    self._refill(node)
                return

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        """Take ``indices`` back from a worker and give them to its level again."""
        pending = self.node2pending[node]
        for index in indices:
            pending.remove(index)
        self.pending.setdefault(self._route_level(node), []).extend(indices)

    def remove_node(self, node: Any) -> str | None:
        """Forget a worker; return the item it was running if it died while running one."""
        pending = self.node2pending.pop(node, [])
        collection = self.node2collection.pop(node, None)
        if not pending or collection is None:
            return None
        crashed = collection[pending.pop(0)]
        level = self._route_level(node)
        self.pending.setdefault(level, [])[:0] = pending
        for other in self._nodes_of(level):
            self._refill(other)
        return crashed

    def schedule(self) -> None:
        """Split each level's items over its workers (called again as replacements arrive)."""
        if not self.scheduled:
            for level, collection in self.collections.items():
                self.pending[level] = [
                    index for index, nodeid in enumerate(collection) if self._owns(level, nodeid)
                ]
            self.scheduled = True
            for level in self.collections:
                self._initial(level)
        for node in list(self.node2collection):
            if not self.node2pending.get(node):
                self._refill(node)

    # ------------------------------------------------------------------ routing

    def _route_level(self, node: Any) -> str | None:
        level = node_level(node)
        return level if level in self.worker_levels else self.home

    def _owns(self, level: str | None, nodeid: str) -> bool:
        wanted = level_in_nodeid(nodeid)
        if wanted in self.worker_levels:
            return wanted == level
        return level == self.home

    def _nodes_of(self, level: str | None) -> list[Any]:
        return [
            node
            for node in self.node2collection
            if node in self.node2pending and self._route_level(node) == level
        ]

    def _initial(self, level: str | None) -> None:
        nodes = [node for node in self._nodes_of(level) if not node.shutting_down]
        pending = self.pending.get(level, [])
        if not nodes:
            return
        # A quarter of the level up front, split evenly; the rest on demand.
        share = max(1, len(pending) // (4 * len(nodes)))
        if self.max_chunk:
            share = min(share, self.max_chunk)
        for node in nodes:
            self._send(node, pending[:share])
            del pending[:share]
        for node in nodes:
            self._refill(node)

    def _refill(self, node: Any) -> None:
        if node.shutting_down or node not in self.node2collection or not self.scheduled:
            return
        level = self._route_level(node)
        pending = self.pending.get(level, [])
        held = self.node2pending[node]
        if len(held) >= 2:
            return
        if not pending:
            # Nothing left for this level: the worker runs what it holds and stops.
            node.shutdown()
            return
        workers = max(1, len(self._nodes_of(level)))
        count = max(1, len(pending) // (2 * workers))
        if len(held) == 0:
            count = max(count, 2)
        if self.max_chunk:
            count = min(count, self.max_chunk)
        self._send(node, pending[:count])
        del pending[:count]

    def _send(self, node: Any, indices: Iterable[int]) -> None:
        batch = list(indices)
        if batch:
            self.node2pending[node].extend(batch)
            node.send_runtest_some(batch)

    def _report_mismatch(
        self, node: Any, level: str | None, known: Sequence[str], got: Sequence[str]
    ) -> None:
        missing = sorted(set(known) - set(got))[:5]
        extra = sorted(set(got) - set(known))[:5]
        tag = levels.level_id(level) if level else "the"
        text = (
            f"{tag} workers collected different tests, so {node.gateway.id} runs none "
            f"(does collection depend on the worker?). Only in another worker: {missing}; "
            f"only in {node.gateway.id}: {extra}"
        )
        report = pytest.CollectReport(nodeid="", outcome="failed", longrepr=text, result=None)
        self.config.hook.pytest_collectreport(report=report)
