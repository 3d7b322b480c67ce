"""A small always-on sample of the end-to-end input fuzz (``benchmarks/fuzz_inputs.py``).

The benchmark runs 45 sessions of 40 generated tests, serially and under
``-n 2`` (figures in ``benchmarks/results/fuzz-cpu.txt``); this runs one
session of generated marker arguments under ``-n 2``
and checks the same promises: no INTERNALERROR, no traceback through the
plugin's code, every other test still runs, no file destroyed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fuzz_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fuzz_inputs", ROOT / "benchmarks" / "fuzz_inputs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_inputs", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fuzz() -> ModuleType:
    return _fuzz_module()


def test_the_fuzz_judge_catches_lost_tests_and_plugin_tracebacks(
    fuzz: ModuleType, tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="test_gen" name="test_g0[mkldnn-on]"/>'
        '<testcase classname="test_gen" name="test_g0[mkldnn-off]"><failure/></testcase>'
        '<testcase classname="test_gen" name="test_g1"><error/></testcase>'
        '<testcase classname="test_gen" name="test_g2"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    assert fuzz.outcomes_from_junit(junit) == {
        "test_g0": "failure",
        "test_g1": "error",
        "test_g2": "skipped",
    }
    assert fuzz._OWN_FRAME.search('  File "/x/pytest_backends/matrix/markers.py", line 3')
    assert fuzz._OWN_FRAME.search("pytest_backends/isolation.py:120: in pytest_runtest_protocol")
    assert not fuzz._OWN_FRAME.search("test_gen.py:12: in test_g3")
    source = fuzz.render_tests(
        [
            (
                [("backends", [float("nan"), b"\x00", (1,)], {"not an identifier": {"k": None}})],
                "leak",
            )
        ]
    )
    compile(source, "test_gen.py", "exec")


def test_generated_markers_options_and_ini_values_under_xdist(fuzz: ModuleType) -> None:
    surface = fuzz.discover()
    # Session 0 of a stream carries no hostile option, so its markers all run.
    session = fuzz.sessions(surface, 1, 12, 12)[0]
    assert session.marker_values >= 12
    session.options.append("--backends-matrix")  # expand the generated matrix markers
    verdict = fuzz.run_session(session, ["-n", "2"], timeout=240)
    assert verdict.ok, "\n".join(verdict.problems)
    assert verdict.ret in (0, 1)
