"""Every object the plugin registers with pytest is one that every supported pytest can handle.

pytest's fixture manager inspects each registered plugin object: it keeps the
objects in a set (so they must be hashable) and, on pytest 8.0 to 8.3.2, reads
every attribute of the object with ``getattr`` (so a property that probes torch
or does other work runs merely because the plugin was registered).  This test
registers every feature in one real session and checks each object.
"""

from __future__ import annotations

import json

import pytest

CONFTEST = """
import inspect, json, os

import pytest


def pytest_collection_finish(session):
    found = []
    for name, plugin in session.config.pluginmanager.list_name_plugin():
        if not type(plugin).__module__.startswith("pytest_backends"):
            continue
        try:
            hash(plugin)
            hashable = True
        except TypeError:
            hashable = False
        props = sorted(
            attr
            for attr, value in inspect.getmembers_static(type(plugin))
            if isinstance(value, property)
        )
        found.append({"name": name, "type": type(plugin).__qualname__,
                      "hashable": hashable, "properties": props})
    with open(os.environ["PLUGIN_OBJECTS_OUT"], "w") as f:
        json.dump(found, f)
"""

TEST = """
import pytest

@pytest.mark.backends("mkldnn")
def test_marked(backend_config):
    assert backend_config.id

def test_plain():
    pass
"""


def test_registered_objects_are_hashable_and_have_no_properties(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = pytester.path / "objects.json"
    monkeypatch.setenv("PLUGIN_OBJECTS_OUT", str(out))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_objects=TEST)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "--backends-matrix",
        "--backends-verify",
        "--backends-determinism=2",
        f"--backends-census={pytester.path / 'census.json'}",
        f"--backends-report={pytester.path / 'report.json'}",
        f"--backends-html={pytester.path / 'report.html'}",
        "--backends-label=objects",
    )
    assert result.ret == 0, result.stdout.str()
    found = json.loads(out.read_text())
    # the run really had the features on: the verify cost summary and the matrix
    types = {entry["type"] for entry in found}
    assert {"CostSummary", "MatrixPlugin"} <= types, types
    bad = [e for e in found if not e["hashable"] or e["properties"]]
    assert not bad, bad
