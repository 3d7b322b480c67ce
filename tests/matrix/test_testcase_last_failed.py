"""``--lf`` and ``--ff`` rerun a failed ``unittest.TestCase`` configuration item.

pytest's cache keeps failed node ids as text and compares them with each
item's structured id; a ``TestCase`` config item named ``test_x[mkldnn-off]``
must carry the same id as a parametrized test, or ``--lf`` drops it.
"""

from __future__ import annotations

import pytest

TESTS = """
import unittest

import pytest
import torch


class TestConv(unittest.TestCase):
    @pytest.mark.backends("mkldnn")
    def test_conv(self):
        x = torch.randn(2, 3, 8, 8)
        torch.nn.Conv2d(3, 4, 3)(x)
        assert torch.backends.mkldnn.enabled, "fails under mkldnn-off"


@pytest.mark.backends("mkldnn")
def test_function(backend_config):
    assert backend_config.axes["mkldnn"] == "on"
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "xdist"])
def test_last_failed_reruns_the_failed_testcase_config(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    pytester.makepyfile(test_lf=TESTS)
    first = pytester.runpytest_subprocess("-p", "no:randomly", "--backends-matrix")
    first.assert_outcomes(passed=2, failed=2)
    extra = ["-n", "2"] if xdist else []
    again = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-matrix", "--lf", "-rf", *extra
    )
    again.assert_outcomes(failed=2)
    # Both failures, in whichever order the workers finished them.
    again.stdout.fnmatch_lines(["FAILED test_lf.py::TestConv::test_conv[[]mkldnn-off[]]*"])
    again.stdout.fnmatch_lines(["FAILED test_lf.py::test_function[[]mkldnn-off[]]*"])
    assert "test_conv[mkldnn-on]" not in again.stdout.str()
