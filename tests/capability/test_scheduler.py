"""The level scheduler, driven the way xdist's controller drives it (no processes)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from pytest_backends.capability.scheduler import LevelScheduling, level_in_nodeid, node_level


class FakeNode:
    """What the scheduler sees of a worker: its spec's environment, commands sent to it."""

    def __init__(self, worker: str, level: str | None) -> None:
        env = {} if level is None else {"ATEN_CPU_CAPABILITY": level}
        self.gateway = SimpleNamespace(id=worker, spec=SimpleNamespace(env=env))
        self.sent: list[int] = []
        self.down = False

    @property
    def shutting_down(self) -> bool:
        return self.down

    def send_runtest_some(self, indices: Sequence[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.down = True

    def __repr__(self) -> str:
        return f"<FakeNode {self.gateway.id}>"


COLLECTION = [
    "t.py::test_a[cap-default]",
    "t.py::test_a[cap-avx2]",
    "t.py::test_b[mkldnn-on,cap-default]",
    "t.py::test_b[mkldnn-on,cap-avx2]",
    "t.py::test_b[mkldnn-off,cap-default]",
    "t.py::test_b[mkldnn-off,cap-avx2]",
    "t.py::test_c[cap-avx512]",
    "t.py::T::test_unittest",
    *(f"t.py::test_many[{i}-cap-default]" for i in range(10)),
    *(f"t.py::test_many[{i}-cap-avx2]" for i in range(10)),
]


@pytest.fixture
def config(pytester: pytest.Pytester) -> pytest.Config:
    return pytester.parseconfig()


def start(
    config: pytest.Config, nodes: Sequence[FakeNode], levels: Sequence[str | None]
) -> LevelScheduling:
    sched = LevelScheduling(config, levels, expected=len(nodes))
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        assert not sched.collection_is_completed
        sched.add_node_collection(node, COLLECTION)
    assert sched.collection_is_completed
    sched.schedule()
    return sched


def drain(sched: LevelScheduling, nodes: Sequence[FakeNode]) -> dict[str, list[str]]:
    """Complete items as a worker would (all but the last held, until shutdown)."""
    ran: dict[str, list[str]] = {node.gateway.id: [] for node in nodes}
    progress = True
    while progress:
        progress = False
        for node in nodes:
            held = sched.node2pending.get(node, [])
            if len(held) >= 2 or (held and node.down):
                index = held[0]
                ran[node.gateway.id].append(COLLECTION[index])
                sched.mark_test_complete(node, index)
                progress = True
    return ran


@pytest.mark.parametrize(
    ("nodeid", "level"),
    [
        ("t.py::test_a[cap-avx2]", "avx2"),
        ("t.py::test_b[mkldnn-on,cap-avx512]", "avx512"),
        ("t.py::test_many[3-cap-default]", "default"),
        ("t.py::test_many[cap-sve256-3]", "sve256"),
        ("t.py::C::test_g[cap-avx2]@group", "avx2"),
        ("t.py::test_a", None),
        ("t.py::test_a[cap-avx9]", None),
        ("t.py::test_a[mycap-avx2]", None),
        ("cap-avx2/t.py::test_a", None),
    ],
)
def test_level_in_nodeid(nodeid: str, level: str | None) -> None:
    assert level_in_nodeid(nodeid) == level


def test_each_level_runs_only_its_items_and_the_home_level_the_rest(
    config: pytest.Config,
) -> None:
    nodes = [FakeNode("gw0", "default"), FakeNode("gw1", "avx2")]
    sched = start(config, nodes, ["default", "avx2"])
    ran = drain(sched, nodes)
    assert sched.tests_finished or all(n.down for n in nodes)
    assert all("cap-avx2" in nodeid for nodeid in ran["gw1"])
    home = set(ran["gw0"])
    # Items of a level without workers and items without a level run at home.
    assert {"t.py::test_c[cap-avx512]", "t.py::T::test_unittest"} <= home
    assert sorted(ran["gw0"] + ran["gw1"]) == sorted(COLLECTION), "each item exactly once"
    assert all(node.down for node in nodes), "a worker whose level is done is shut down"


def test_a_level_is_balanced_over_its_workers(config: pytest.Config) -> None:
    nodes = [FakeNode(f"gw{i}", "default" if i < 2 else "avx2") for i in range(4)]
    sched = start(config, nodes, ["default", "avx2"])
    ran = drain(sched, nodes)
    assert ran["gw0"] and ran["gw1"], ran
    assert ran["gw2"] and ran["gw3"], ran
    assert {n for n in ran["gw0"] + ran["gw1"]} & {n for n in ran["gw2"] + ran["gw3"]} == set()
    assert sorted(n for items in ran.values() for n in items) == sorted(COLLECTION)


def test_a_crash_returns_the_crashed_item_and_a_replacement_runs_the_rest(
    config: pytest.Config,
) -> None:
    nodes = [FakeNode("gw0", "default"), FakeNode("gw1", "avx2")]
    sched = start(config, nodes, ["default", "avx2"])
    avx2 = nodes[1]
    running = sched.node2pending[avx2][0]
    crashed = sched.remove_node(avx2)
    assert crashed == COLLECTION[running]
    assert not sched.tests_finished
    replacement = FakeNode("gw2", "avx2")
    sched.add_node(replacement)
    sched.add_node_collection(replacement, COLLECTION)
    assert sched.collection_is_completed
    sched.schedule()
    assert replacement.sent, "the replacement got the level's remaining items"
    ran = drain(sched, [nodes[0], replacement])
    avx2_items = [n for n in COLLECTION if "cap-avx2" in n]
    done = set(ran["gw2"]) | {COLLECTION[i] for i in avx2.sent if i != running}
    assert crashed not in ran["gw2"], "a crashed item is not run again"
    assert set(avx2_items) - {crashed} <= done | set(ran["gw2"])
    assert all("cap-avx2" in n for n in ran["gw2"])


def test_a_finished_worker_is_removed_without_a_crash_item(config: pytest.Config) -> None:
    nodes = [FakeNode("gw0", "default"), FakeNode("gw1", "avx2")]
    sched = start(config, nodes, ["default", "avx2"])
    drain(sched, nodes)
    assert sched.remove_node(nodes[0]) is None
    assert nodes[0] not in sched.nodes


def test_workers_of_one_level_must_agree(config: pytest.Config, pytester: pytest.Pytester) -> None:
    reports: list[pytest.CollectReport] = []

    class Catch:
        def pytest_collectreport(self, report: pytest.CollectReport) -> None:
            reports.append(report)

    config.pluginmanager.register(Catch())
    nodes = [FakeNode("gw0", "default"), FakeNode("gw1", "default")]
    sched = LevelScheduling(config, ["default"], expected=2)
    for node in nodes:
        sched.add_node(node)
    sched.add_node_collection(nodes[0], COLLECTION)
    sched.add_node_collection(nodes[1], [*COLLECTION, "t.py::test_new[cap-default]"])
    assert sched.collection_is_completed
    sched.schedule()
    assert nodes[1].down and not nodes[1].sent
    assert len(reports) == 1 and reports[0].failed
    assert "cap-default workers collected different tests" in str(reports[0].longrepr)
    assert "t.py::test_new[cap-default]" in str(reports[0].longrepr)
    ran = drain(sched, nodes[:1])
    # avx2 has no workers in this run: its items are reported at home.
    assert sorted(ran["gw0"]) == sorted(COLLECTION)


def test_a_plain_worker_runs_everything_when_no_level_can_run(config: pytest.Config) -> None:
    node = FakeNode("gw0", None)
    assert node_level(node) is None
    sched = start(config, [node], [None])
    ran = drain(sched, [node])
    assert sorted(ran["gw0"]) == sorted(COLLECTION)


def test_mark_test_pending_runs_an_item_again_on_its_level(config: pytest.Config) -> None:
    nodes = [FakeNode("gw0", "default"), FakeNode("gw1", "avx2")]
    sched = LevelScheduling(config, ["default", "avx2"], expected=2)
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, COLLECTION)
    sched.schedule()
    sched.mark_test_pending("t.py::test_a[cap-avx2]")
    assert sched.has_pending
    drain(sched, nodes)
    assert nodes[1].sent.count(COLLECTION.index("t.py::test_a[cap-avx2]")) == 2
    assert COLLECTION.index("t.py::test_a[cap-avx2]") not in nodes[0].sent
