"""Reports say why: whole failure text, crash signal and config, merged grid first, hints."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from pytest_backends.__main__ import main

SUITE = """
import os
import signal

import pytest
import torch


@pytest.mark.backends("mkldnn")
def test_close(backend_config):
    torch.testing.assert_close(torch.ones(3), torch.full((3,), 1.5))


@pytest.mark.backends("mkldnn")
def test_crash(backend_config):
    if backend_config.id == "mkldnn-off":
        os.kill(os.getpid(), signal.SIGSEGV)
"""

COMMON = ("-p", "no:randomly", "-p", "no:cacheprovider")


@pytest.mark.skipif(sys.platform != "linux", reason="reads the worker's exit status in /proc")
def test_whole_failure_text_and_crash_signal_in_html_and_json(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_why=SUITE)
    result = pytester.runpytest_subprocess(
        *COMMON,
        "--backends-matrix",
        "-n",
        "2",
        "--backends-report=r.json",
        "--backends-html=r.html",
        "--backends-label=job",
    )
    result.assert_outcomes(passed=1, failed=3)
    report = json.loads((pytester.path / "r.json").read_text())
    tests = {t["nodeid"]: t for t in report["tests"]}
    close = tests["test_why.py::test_close[mkldnn-on]"]
    assert close["message"] == "AssertionError: Tensor-likes are not close!"
    assert "Greatest absolute difference: 0.5" in close["detail"]
    assert "Mismatched elements: 3 / 3" in close["detail"]
    crash = tests["test_why.py::test_crash[mkldnn-off]"]
    assert crash["crashed"] is True
    assert crash["message"].startswith(
        f"crashed (killed by signal {signal.SIGSEGV.name}) under mkldnn-off"
    )
    page = (pytester.path / "r.html").read_text()
    assert "<details><summary>AssertionError: Tensor-likes are not close!</summary>" in page
    assert "Greatest absolute difference: 0.5" in page
    assert '<span class="crash">crashed SIGSEGV<br>mkldnn-off</span>' in page

    # The merged page puts the grid and the failures before what was merged.
    other = dict(report, label="other", run="another run")
    (pytester.path / "r2.json").write_text(json.dumps(other))
    assert (
        main(
            [
                "merge",
                "--html",
                str(pytester.path / "m.html"),
                str(pytester.path / "r.json"),
                str(pytester.path / "r2.json"),
            ]
        )
        == 0
    )
    merged = (pytester.path / "m.html").read_text()
    grid = merged.index("<h2>Tests &times; configurations</h2>")
    assert grid < merged.index('<h2 id="failures">') < merged.index('<h2 id="sources">Sources</h2>')
    assert grid < merged.index("<h2>Configurations</h2>")
    assert "Greatest absolute difference: 0.5" in merged


def test_backend_config_axis_in_an_unmarked_test_names_the_marker(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_unmarked="""
        def test_reads_axis(backend_config):
            assert backend_config.axes["mkldnn"] == "on"

        def test_get_is_fine(backend_config):
            assert backend_config.axes.get("mkldnn") is None
        """
    )
    result = pytester.runpytest_subprocess(*COMMON)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*'mkldnn': the configuration 'default' has no 'mkldnn' axis*"
            "not marked @pytest.mark.backends('mkldnn') (add the marker)*"
        ]
    )


def test_a_misspelt_marker_gets_a_did_you_mean(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_typo="""
        import pytest

        @pytest.mark.backend("mkldnn")
        def test_typo():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*COMMON)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*BackendsMarkerWarning: @pytest.mark.backend on test_typo.py::test_typo is not a "
            "pytest-backends marker: did you mean @pytest.mark.backends?"
        ]
    )
    strict = pytester.runpytest_subprocess(*COMMON, "--backends-strict")
    strict.assert_outcomes(errors=1)
    strict.stdout.fnmatch_lines(["*did you mean @pytest.mark.backends? (--backends-strict)*"])
