"""The report reads the run's axis registry from the config, not from the collection hooks.

An axis a conftest adds with ``pytest_backends_configurations`` orders the
report's rows (in the axis's value order, not alphabetically) and names the
config of a crashed item, whose report carries no properties; the report
plugin needs no ``MatrixPlugin`` for either.
"""

from __future__ import annotations

import json

import pytest

# Imported before any pytester snapshot (see test_matrix_e2e.py).
import torch  # noqa: F401

from pytest_backends import _shared
from pytest_backends.matrix import feature
from pytest_backends.matrix.registry import axis_registry
from pytest_backends.matrix.report_plugin import ReportPlugin

# Values in the order "on", "off": alphabetical order would put "off" first.
CONFTEST = """
    from pytest_backends.matrix.configs import Axis, AxisValue

    def pytest_backends_configurations(config):
        return Axis("fastpath", (
            AxisValue("on", "fast path", {"mha.fastpath_enabled": True}),
            AxisValue("off", "no fast path", {"mha.fastpath_enabled": False}),
        ), "the MultiheadAttention fast path")
"""


def _report(nodeid: str, when: str, outcome: str, config_id: str | None) -> pytest.TestReport:
    longrepr = None if outcome == "passed" else "boom"
    report = pytest.TestReport(nodeid, ("t.py", 1, nodeid), {}, outcome, longrepr, when)
    if config_id is not None:
        _shared.attach(report, _shared.PROPERTY_CONFIG, config_id)
    return report


def test_report_plugin_orders_and_parses_plugin_axes_without_the_matrix_plugin(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    config = pytester.parseconfigure("--backends-matrix", "-p", "no:randomly")
    # Whatever the collection hooks hold is out of reach: the report stands alone.
    config.pluginmanager.unregister(name="backends-matrix")
    assert config.pluginmanager.get_plugin("backends-matrix") is None
    report = ReportPlugin(config, config.stash[feature.SETTINGS_KEY])
    for nodeid, config_id in (
        ("t.py::test_x[fastpath-off]", "fastpath-off"),
        ("t.py::test_x[fastpath-on]", "fastpath-on"),
    ):
        for when in ("setup", "call", "teardown"):
            report.pytest_runtest_logreport(_report(nodeid, when, "passed", config_id))
    # A worker that died leaves a report of no phase and no properties: the config
    # comes from the node id, read with the run's registry.
    report.pytest_runtest_logreport(_report("t.py::test_y[fastpath-on]", "???", "failed", None))

    assert [row.config for row in report.rows()] == ["fastpath-on", "fastpath-off"]
    crashed = report.results["t.py::test_y[fastpath-on]"]
    assert (crashed.config, crashed.outcome, crashed.crashed) == ("fastpath-on", "failed", True)
    assert "fastpath" in axis_registry(config)


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_plugin_axis_orders_the_json_report(
    pytester: pytest.Pytester, xdist: tuple[str, ...]
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_fp="""
        import pytest

        @pytest.mark.backends("fastpath")
        def test_fastpath(backend_config):
            assert backend_config.axes["fastpath"] in ("on", "off")
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--backends-matrix",
        "--backends-report=report.json", *xdist,
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    data = json.loads((pytester.path / "report.json").read_text())
    assert [c["id"] for c in data["configs"]] == ["fastpath-on", "fastpath-off"]
    assert sorted(data["coverage"]["collected"].values()) == ["fastpath-off", "fastpath-on"]
