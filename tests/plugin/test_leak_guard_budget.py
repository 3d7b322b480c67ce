"""The guard's per-test budget: one registry fingerprint at each phase boundary.

A plain test (no flags, no fixture) costs the guard one fingerprint before
its setup and one after its teardown; what happens after the teardown check
is found by the next boundary.  Counted, not timed: the count is a property
of the code, the time a property of the machine (``benchmarks/overhead.py``
measures that).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# Counts every fingerprint the registry takes in the session, from the moment
# the conftest is imported (torch is imported by then).
COUNTING_CONFTEST = """
import torch
from pytest_backends.flags import registry

CALLS = []
_reg = registry()
_fingerprint = _reg.fingerprint


def _counting():
    CALLS.append(1)
    return _fingerprint()


_reg.fingerprint = _counting


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"fingerprints taken: {len(CALLS)}")
"""


def _fingerprints(pytester: pytest.Pytester, tests: int, body: str = "pass") -> int:
    pytester.makeconftest(COUNTING_CONFTEST)
    source = "\n".join(f"def test_{i}():\n    {body}\n" for i in range(tests))
    pytester.makepyfile(test_plain="import torch\n\n" + source)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=tests)
    line = next(x for x in result.outlines if x.startswith("fingerprints taken: "))
    return int(line.rpartition(" ")[2])


def test_a_plain_test_costs_one_fingerprint_per_boundary(pytester: pytest.Pytester) -> None:
    one = _fingerprints(pytester, 1)
    eleven = _fingerprints(pytester, 11)
    assert (eleven - one) / 10 == 2, (one, eleven)


def test_a_change_after_the_teardown_check_is_still_reported(pytester: pytest.Pytester) -> None:
    """The fingerprint saved after teardown does not hide a change made later."""
    pytester.makeconftest(
        """
        import torch

        def pytest_runtest_logfinish(nodeid, location):
            if nodeid.endswith("::test_first"):
                torch.backends.cudnn.benchmark = True
        """
    )
    pytester.makepyfile(
        """
        import torch

        def test_first():
            pass

        def test_second():
            assert torch.backends.cudnn.benchmark is False
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-W", "default")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*torch backend flags changed between tests (before *::test_second started):",
            "*after *::test_first finished:",
            "*cudnn.benchmark: False -> True",
        ]
    )


# Fingerprints taken from one test's start to the next one's, per test.
PER_TEST_CONFTEST = """
import torch
from pytest_backends.flags import registry

CALLS = []
STARTS = {}
_reg = registry()
_fingerprint = _reg.fingerprint


def _counting():
    CALLS.append(1)
    return _fingerprint()


_reg.fingerprint = _counting


def pytest_runtest_logstart(nodeid, location):
    STARTS[nodeid] = len(CALLS)


def pytest_terminal_summary(terminalreporter):
    ids = list(STARTS)
    for this, following in zip(ids, ids[1:]):
        terminalreporter.write_line(f"per test {this}: {STARTS[following] - STARTS[this]}")
"""


def test_a_parametrized_test_costs_two_fingerprints_too(pytester: pytest.Pytester) -> None:
    """A ``parametrize`` argument's stand-in fixture runs no code: it is not fingerprinted.

    A real fixture still is (its changes are its own), so it costs two more.
    """
    pytester.makeconftest(PER_TEST_CONFTEST)
    pytester.makepyfile(
        test_param="""
        import pytest
        import torch

        @pytest.fixture
        def real():
            return 1

        @pytest.mark.parametrize("a", range(4))
        @pytest.mark.parametrize("b", range(2))
        def test_param(a, b):
            pass

        @pytest.mark.parametrize("a", range(3))
        def test_with_fixture(a, real):
            pass

        def test_last():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    counts = {
        line.split(": ")[0].removeprefix("per test "): int(line.rpartition(" ")[2])
        for line in result.outlines
        if line.startswith("per test ")
    }
    # the first test's count includes the session's first checks
    steady = {k: v for k, v in counts.items() if not k.endswith("test_param[0-0]")}
    params = {k: v for k, v in steady.items() if "test_param[" in k}
    fixtures = {k: v for k, v in steady.items() if "test_with_fixture[" in k}
    assert set(params.values()) == {2}, counts
    assert set(fixtures.values()) == {4}, counts
