"""A conftest hook that changes flags in a test's setup, call or teardown is named, not the test.

The hooks run inside each test's protocol, between the guard's two boundaries:
without attribution the change was blamed on every test, or (in teardown) on
whichever fixture was finalized next. Real sessions in subprocesses, serially
and under ``-n 2`` (the report travels from the workers to the controller).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
import torch


@pytest.fixture(autouse=True)
def does_nothing():
    yield


def pytest_runtest_setup(item):
    if item.name == "test_after_setup_hook":
        torch.backends.cudnn.benchmark = True


def pytest_runtest_call(item):
    if item.name == "test_after_call_hook":
        torch.set_num_interop_threads  # a read: no change
        torch.backends.mkldnn.enabled = False


def pytest_runtest_teardown(item):
    if item.name == "test_after_teardown_hook":
        torch.backends.cudnn.deterministic = True
"""

TESTS = """
import torch


def test_after_setup_hook():
    assert torch.backends.cudnn.benchmark  # the hook's value holds in its test


def test_after_call_hook():
    assert not torch.backends.mkldnn.enabled


def test_after_teardown_hook():
    pass


def test_sees_the_start():
    assert not torch.backends.cudnn.benchmark
    assert torch.backends.mkldnn.enabled
    assert not torch.backends.cudnn.deterministic


def test_a_real_leak():
    torch.backends.cudnn.allow_tf32 = False
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_hooks_change_is_the_hooks(pytester: pytest.Pytester, workers: list[str]) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_hooked=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *workers)
    out = result.stdout.str()
    assert "INTERNALERROR" not in out, out
    # only the real leak is a test's error; the run fails for the hooks' changes
    result.assert_outcomes(passed=5, errors=1)
    assert "test_a_real_leak left torch backend flags changed" in out, out
    for name in ("setup_hook", "call_hook", "teardown_hook"):
        assert f"test_after_{name} left" not in out, out
    assert "fixture 'does_nothing'" not in out, out
    summary = out[out.index("torch backend flags changed by hooks") :]
    for hook, phase, row in (
        ("pytest_runtest_setup", "setup", "cudnn.benchmark: False -> True"),
        ("pytest_runtest_call", "call", "mkldnn.enabled: True -> False"),
        ("pytest_runtest_teardown", "teardown", "cudnn.deterministic: False -> True"),
    ):
        assert f"the {hook} hook in conftest.py changed torch backend flags in the {phase}" in (
            summary
        ), out
        assert row in summary, out
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_hook_that_restores_is_no_finding(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
import torch

def pytest_runtest_setup(item):
    item.saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True

def pytest_runtest_teardown(item):
    torch.backends.cudnn.benchmark = item.saved
"""
    )
    pytester.makepyfile(
        test_paired="""
import torch

def test_one():
    assert torch.backends.cudnn.benchmark

def test_two():
    assert torch.backends.cudnn.benchmark
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    out = result.stdout.str()
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK, out
    assert "changed by hooks" not in out and "left torch backend flags" not in out, out
