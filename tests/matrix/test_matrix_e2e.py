"""The matrix end to end: real pytest runs of marked test files."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest

# Imported before any pytester snapshot: pytester drops modules first imported during a
# test from sys.modules, and importing torch a second time in one process corrupts it.
import torch

Run = Callable[..., pytest.RunResult]

MKLDNN_TEST = """
    import pytest
    import torch

    @pytest.mark.backends("mkldnn")
    def test_conv(backend_config, backend_device):
        expected = backend_config.axes.get("mkldnn", "on") == "on"
        assert torch.backends.mkldnn.enabled is expected
        assert backend_device == torch.device("cpu") == torch.device(backend_config.device)
        print("CONFIG", backend_config.id, dict(backend_config.flags))

    def test_after():
        assert torch.backends.mkldnn.enabled is True
"""


def _ids(result: pytest.RunResult, *, ordered: bool = False) -> list[str]:
    ids = [m.group(1) for line in result.outlines if (m := re.match(r"^(\S+\.py::\S+) ", line))]
    return ids if ordered else sorted(ids)


@pytest.mark.fresh_interpreter
def test_mkldnn_axis_runs_once_per_value_with_the_flag_set(
    pytester: pytest.Pytester, run: Run
) -> None:
    pytester.makepyfile(test_mk=MKLDNN_TEST)
    result = run("--backends-matrix", "-v", "-s", "--junitxml=junit.xml")
    result.assert_outcomes(passed=3)
    assert _ids(result) == [
        "test_mk.py::test_after",
        "test_mk.py::test_conv[mkldnn-off]",
        "test_mk.py::test_conv[mkldnn-on]",
    ]
    result.stdout.fnmatch_lines(
        [
            "backends: torch *; CUDA: *",
            "backends: CPU capability: *",
            "*CONFIG mkldnn-on {'mkldnn.enabled': True}*",
            "*CONFIG mkldnn-off {'mkldnn.enabled': False}*",
        ]
    )
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    props = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in cases
    }
    assert props["test_conv[mkldnn-off]"] == {"backend_config": "mkldnn-off"}
    assert props["test_after"] == {}

    plain = run("-v", "-s")
    plain.assert_outcomes(passed=2)
    assert _ids(plain) == ["test_mk.py::test_after", "test_mk.py::test_conv"]
    plain.stdout.fnmatch_lines(
        [
            "backends: availability not probed (torch is not imported yet)*",
            "*collected 2 items",
            "backends: torch *; CUDA: *",  # a collected test carries the marker
            "*CONFIG default {}*",
        ]
    )


CUDNN_SDPA_TEST = """
    import pytest
    import torch
    import torch.nn.functional as F

    @pytest.mark.backends("cudnn", "sdpa")
    def test_attention(backend_device):
        q = torch.randn(1, 2, 4, 8, device=backend_device)
        F.scaled_dot_product_attention(q, q, q)
"""
ALL_EIGHT = [
    f"test_cs.py::test_attention[{c},{s}]"
    for c in ("cudnn-on", "cudnn-off")
    for s in ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
]


@pytest.mark.slow
def test_cuda_configs_are_collected_and_skipped_here_identically_under_xdist(
    pytester: pytest.Pytester, run: Run
) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks skip reasons on a machine without CUDA")
    pytester.makepyfile(test_cs=CUDNN_SDPA_TEST)
    serial = run("--backends-matrix", "-p", "no:xdist", "-v", "-rs")
    serial.assert_outcomes(passed=2, skipped=6)
    assert _ids(serial, ordered=True) == ALL_EIGHT  # axis order, values in their order
    serial.stdout.fnmatch_lines(
        [
            "SKIPPED [[]4] test_cs.py:*: cudnn-on needs CUDA: torch.cuda.is_available() is False*",
            "SKIPPED [[]1] test_cs.py:*: sdpa-efficient needs CUDA: torch.cuda.is_available() is "
            "False*",
            "SKIPPED [[]1] test_cs.py:*: sdpa-cudnn needs CUDA: "
            "torch.cuda.is_available() is False*",
        ]
    )

    # two workers, a random sampling seed: each worker must collect the same items
    xdist = run(
        "--backends-matrix", "-n", "2", "-v", "--backends-sample=5", "--backends-report=r.json"
    )
    outcomes = xdist.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 5
    seed = re.search(r"--backends-seed=(\d+)", xdist.stdout.str())
    assert seed is not None
    report = json.loads((pytester.path / "r.json").read_text())
    assert sum(sum(c["counts"].values()) for c in report["configs"]) == 5
    assert report["settings"]["seed"] == int(seed.group(1))
    sampled = sorted(t["nodeid"] for t in report["tests"])
    again = run(
        "--backends-matrix",
        "-p",
        "no:xdist",
        "--co",
        "-q",
        "--backends-sample=5",
        f"--backends-seed={seed.group(1)}",
    )
    assert sorted(line for line in again.outlines if line.startswith("test_cs.py::")) == sampled


def test_marker_typo_is_an_error_naming_the_test_and_the_rest_runs(
    pytester: pytest.Pytester, run: Run
) -> None:
    pytester.makepyfile(
        test_typo="""
        import pytest

        @pytest.mark.backends("mkldn")
        def test_axis_typo():
            pass

        @pytest.mark.backends(sdpa=["math", "flsh"])
        def test_value_typo():
            pass

        @pytest.mark.backends("mkldnn")
        def test_fine():
            pass
    """
    )
    result = run("--backends-matrix")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "ERROR invalid @pytest.mark.backends on test_typo.py::test_axis_typo: unknown axis "
            "'mkldn' (did you mean 'mkldnn'?); valid axes: cudnn, cudnn_benchmark, mkldnn, *",
            "*test_typo.py::test_value_typo: axis 'sdpa' has no value 'flsh' (did you mean "
            "'flash'?); valid values: math, flash, efficient, cudnn",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_plugin_axes_from_conftest_set_their_flags(pytester: pytest.Pytester, run: Run) -> None:
    pytester.makeconftest("""
        from pytest_backends.matrix.configs import Axis, AxisValue

        def pytest_backends_configurations(config):
            return [Axis("fastpath", (
                AxisValue("on", "fast path", {"mha.fastpath_enabled": True}),
                AxisValue("off", "no fast path", {"mha.fastpath_enabled": False}),
            ), "the MultiheadAttention fast path")]
    """)
    pytester.makepyfile(
        test_fp="""
        import pytest
        import torch

        @pytest.mark.backends("fastpath", mkldnn="off")
        def test_fastpath(backend_config):
            want = backend_config.axes["fastpath"] == "on"
            assert torch.backends.mha.get_fastpath_enabled() is want
            assert torch.backends.mkldnn.enabled is False
    """
    )
    result = run("--backends-matrix", "-v")
    result.assert_outcomes(passed=2)
    assert _ids(result) == [
        "test_fp.py::test_fastpath[mkldnn-off,fastpath-off]",
        "test_fp.py::test_fastpath[mkldnn-off,fastpath-on]",
    ]


@pytest.mark.fresh_interpreter
def test_header_hint_without_torch_and_without_the_matrix(
    pytester: pytest.Pytester, run: Run
) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_no_torch():
            assert "torch" not in sys.modules
    """
    )
    result = run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["backends: availability not probed (torch is not imported*"])


# --- collection-only checks run in process: they change no torch state ---------------------


def _collect(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, list[str]]:
    result = pytester.runpytest_inprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--co", "-q", *args
    )
    return result, [line for line in result.outlines if "::" in line and " " not in line]


OPTIONS_TEST = """
    import pytest

    pytestmark = pytest.mark.backends(deterministic="on")

    @pytest.mark.backends("mkldnn", "sdpa")
    def test_ms():
        pass

    @pytest.mark.backends("mkldnn")
    class TestClass:
        @pytest.mark.backends(mkldnn="off", device=["cpu", "cuda"])
        def test_method(self):
            pass

        @pytest.mark.parametrize("n", [1, 2])
        def test_param(self, n):
            pass

    def test_unmarked():
        pass
"""


def test_markers_merge_from_module_class_and_function(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_opt=OPTIONS_TEST)
    _, ids = _collect(pytester, "--backends-matrix")
    assert ids == [
        *(
            f"test_opt.py::test_ms[mkldnn-{m},sdpa-{s},deterministic-on]"
            for m in ("on", "off")
            for s in ("math", "flash", "efficient", "cudnn")
        ),
        "test_opt.py::TestClass::test_method[mkldnn-off,deterministic-on,device-cpu]",
        "test_opt.py::TestClass::test_method[mkldnn-off,deterministic-on,device-cuda]",
        "test_opt.py::TestClass::test_param[mkldnn-on,deterministic-on-1]",
        "test_opt.py::TestClass::test_param[mkldnn-on,deterministic-on-2]",
        "test_opt.py::TestClass::test_param[mkldnn-off,deterministic-on-1]",
        "test_opt.py::TestClass::test_param[mkldnn-off,deterministic-on-2]",
        "test_opt.py::test_unmarked[deterministic-on]",
    ]


def test_restrict_select_and_ini_twins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_opt=OPTIONS_TEST)
    _, ids = _collect(pytester, "--backends-matrix=mkldnn", "-k", "test_ms or unmarked")
    assert ids == [
        "test_opt.py::test_ms[mkldnn-on]",
        "test_opt.py::test_ms[mkldnn-off]",
        "test_opt.py::test_unmarked",
    ]
    result, ids = _collect(pytester, "--backends-config=sdpa-math,mkldnn-off")
    # --backends-config narrows only the tests marked with the axes it names.
    assert ids == [
        "test_opt.py::test_ms[mkldnn-off,sdpa-math,deterministic-on]",
        "test_opt.py::test_unmarked[deterministic-on]",
    ]
    assert "2/15 tests collected (13 deselected)" in result.stdout.str()

    pytester.makeini("[pytest]\nbackends_matrix = sdpa\nbackends_config = sdpa-flash\n")
    _, ids = _collect(pytester, "-k", "test_ms")
    assert ids == ["test_opt.py::test_ms[sdpa-flash]"]
    _, ids = _collect(pytester, "-k", "test_ms", "--backends-matrix=off")
    assert ids == ["test_opt.py::test_ms"]  # the command line wins over ini


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--backends-matrix=mkldnn,bogus",),
            "ERROR: --backends-matrix: unknown axis 'bogus'; valid axes: cudnn, *",
        ),
        (
            ("--backends-matrix", "sub/"),
            "ERROR: --backends-matrix: 'sub/' is not an axis name*looks like a path*",
        ),
        (("--backends-sample=0",), "ERROR: --backends-sample: expected a positive integer*"),
        (
            ("--backends-config=mkldnn-maybe",),
            "ERROR: --backends-config: unknown configuration token 'mkldnn-maybe'; valid tokens:*",
        ),
        (("--backends-verify=sometimes",), "ERROR: --backends-verify: expected one of off, on*"),
    ],
)
def test_bad_options_are_usage_errors(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    pytester.mkdir("sub")
    result = pytester.runpytest_inprocess("-p", "no:randomly", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()
