"""The leak guard's verdicts hold wherever torch is imported and whoever changes a flag.

Each suite below is a real pytest session in a subprocess; several cases share
one session to keep the runtime small.  Every case fails without its mechanism:
the snapshot taken when torch finishes importing, the conftest baseline, the
import-time check of test modules, the new registry rows (freeze switch,
autocast, opt_einsum, flush-denormal), fixture leaks reported once by fixture,
thread hints, the session-end check, markers validated per test, and warnings
that never escape as INTERNALERROR.
"""

from __future__ import annotations

import re

import pytest

from pytest_backends.flags import registry

pytest_plugins = ["pytester"]

NO_CRASH = ("INTERNALERROR", "UsageError", "Traceback (most recent call last)")


def _assert_no_crash(result: pytest.RunResult) -> None:
    text = result.stdout.str() + result.stderr.str()
    for marker in NO_CRASH:
        assert marker not in text, text


# -- torch imported by tests and fixtures; bad markers ---------------------

LAZY = """
import pytest


@pytest.fixture
def lazy_fixture():
    import torch

    torch.backends.cudnn.benchmark = True
    yield


def test_0_no_torch_yet():
    import sys

    assert "torch" not in sys.modules


def test_a():
    import torch

    torch.backends.mkldnn.enabled = False


def test_b():
    import torch

    assert torch.backends.mkldnn.enabled


def test_c(lazy_fixture):
    pass


def test_d():
    import torch

    assert not torch.backends.cudnn.benchmark


@pytest.mark.backends_leaks("bogus")
def test_m_bogus():
    pass


@pytest.mark.backends_leaks(None)
def test_m_none():
    pass


@pytest.mark.backends_leaks(123)
def test_m_int():
    pass


@pytest.mark.backends_leaks("warn", "off")
def test_m_two():
    pass


@pytest.mark.backends_leaks("warn")
def test_m_good():
    pass
"""


@pytest.mark.fresh_interpreter
@pytest.mark.parametrize("xdist", [False, True], ids=["serial", "xdist"])
def test_torch_imported_by_a_test_or_fixture_and_bad_markers(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    pytester.makepyfile(test_lazy=LAZY)
    args = ["-p", "no:randomly", "-p", "no:cacheprovider"]
    if xdist:  # one worker per file: the same order as serially, through xdist's path
        args += ["-n", "2", "--dist", "loadfile"]
    result = pytester.runpytest_subprocess(*args)
    _assert_no_crash(result)
    # every test ran: 6 passed; test_a and test_c leak; the 4 bad markers error
    result.assert_outcomes(passed=6, errors=6)
    result.stdout.fnmatch_lines(
        [
            "*test_lazy.py::test_a left torch backend flags changed:",
            "*mkldnn.enabled: True -> False",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*fixture 'lazy_fixture' (function scope*did not restore them*",
            "*cudnn.benchmark: False -> True",
        ]
    )
    for name, given in [
        ("bogus", "'bogus'"),
        ("none", "None"),
        ("int", "123"),
        ("two", "'warn', 'off'"),
    ]:
        result.stdout.fnmatch_lines(
            [
                f"*test_m_{name}: @pytest.mark.backends_leaks takes one mode, one of "
                f"'fail', 'warn', 'off'*got backends_leaks({given})"
            ]
        )
    errors = [line for line in result.outlines if line.startswith("ERROR ")]
    assert not any("test_b" in line or "test_d" in line for line in errors), errors
    assert result.ret == pytest.ExitCode.TESTS_FAILED


# -- conftest baseline, import-time changes, new state, threads, -W error ----

CONFTEST = """
import threading

import torch

torch.set_default_dtype(torch.float64)  # the suite's chosen baseline

GO, DONE = threading.Event(), threading.Event()


def _flipper():
    GO.wait(60)
    torch.backends.cudnn.deterministic = True
    DONE.set()


threading.Thread(target=_flipper, daemon=True, name="conftest-flipper").start()


def pytest_runtest_logfinish(nodeid, location):
    if nodeid.endswith("::test_between"):
        torch.backends.nnpack.set_flags(False)
    if nodeid.endswith("::test_zz_last"):
        late = threading.Thread(target=torch.set_warn_always, args=(True,), name="late")
        late.start()
        late.join()
"""

IMPORT_TIME = """
import torch

torch.backends.cudnn.benchmark = True  # while pytest imports the module


def test_sees_its_own_import_time_flags():
    assert torch.backends.cudnn.benchmark  # what this module set while imported
    assert torch.get_default_dtype() == torch.float64
"""

STATE = """
import torch
from conftest import DONE, GO


def test_freeze():
    torch.backends.disable_global_flags()


def test_set_after_freeze():
    torch.backends.cudnn.benchmark = True  # RuntimeError while frozen
    torch.backends.cudnn.benchmark = False


def test_autocast():
    torch.set_autocast_enabled("cpu", True)
    torch.set_autocast_dtype("cpu", torch.float16)
    torch.set_autocast_cache_enabled(False)


def test_mm_after_autocast():
    a = torch.ones(4, 4)
    assert (a @ a).dtype == torch.float64
    assert torch.is_autocast_cache_enabled()


def test_einsum_and_denormal():
    torch.backends.opt_einsum.strategy = "greedy"
    torch.set_flush_denormal(True)


def test_clean_after_einsum_and_denormal():
    assert torch.backends.opt_einsum.strategy != "greedy"
    tiny = torch.tensor([1e-310], dtype=torch.float64)
    assert (tiny * 1.0).item() != 0.0


def test_between():
    pass


def test_after_between():
    assert torch._C._get_nnpack_enabled()


def test_y():
    GO.set()
    assert DONE.wait(30)


def test_zz_last():
    pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [False, True], ids=["serial", "xdist"])
def test_baseline_import_time_new_state_threads_and_warnings_as_errors(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_import_time=IMPORT_TIME, test_state=STATE)
    args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-rN"]
    if xdist:
        args += ["-n", "2", "--dist", "loadfile", "-W", "error::pytest.PytestWarning"]
    else:
        pytester.makeini("[pytest]\nfilterwarnings = error\n")
    result = pytester.runpytest_subprocess(*args)
    out = result.stdout.str()
    _assert_no_crash(result)
    # leaks: freeze, autocast, einsum/denormal, the thread's change during test_y;
    # the change made between tests is test_after_between's setup error (-W error)
    result.assert_outcomes(passed=10, errors=5)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*session baseline differs from torch defaults: default_dtype=float64 (conftest.py)"]
    )
    result.stdout.fnmatch_lines(
        [
            "*torch backend flags set while importing test modules (warning)*",
            "test_import_time.py changed torch backend flags while it was imported:",
            "  cudnn.benchmark: False -> True",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*test_state.py::test_freeze left torch backend flags changed:",
            "  flags_frozen: False -> True",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*test_state.py::test_autocast left torch backend flags changed:",
            "  autocast.cpu.enabled: False -> True",
            "  autocast.cpu.dtype: 'bfloat16' -> 'float16'",
            "  autocast.cache_enabled: True -> False",
        ]
    )
    einsum = [
        "*test_state.py::test_einsum_and_denormal left torch backend flags changed:",
        "  opt_einsum.strategy: * -> 'greedy'",
    ]
    if "flush_denormal" in registry().by_name:
        einsum.append("  flush_denormal: False -> True")
    result.stdout.fnmatch_lines(einsum)
    result.stdout.fnmatch_lines(
        [
            "*BackendsLeakWarning (warnings are errors here): torch backend flags changed "
            "between tests (before test_state.py::test_after_between started):",
            "after test_state.py::test_between finished:",
            "  nnpack.enabled: True -> False",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*test_state.py::test_y left torch backend flags changed:",
            "  cudnn.deterministic: False -> True",
            "*thread 'conftest-flipper', started outside any test (running conftest._flipper)"
            ", was running during this test",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*torch backend flags changed after the last test*",
            "torch backend flags changed while no test was running:",
            "after test_state.py::test_zz_last finished:",
            "  warn_always: False -> True",
            "They were restored at session end.*",
        ]
    )
    errors = re.findall(r"ERROR at \w+ of (\S+)", out)
    assert sorted(errors) == sorted(
        ["test_freeze", "test_autocast", "test_einsum_and_denormal", "test_after_between", "test_y"]
    ), errors


# -- fixture leaks: once each, by fixture, in any order ----------------------

FIXTURE_CONFTEST = """
import pytest
import torch


@pytest.fixture(scope="session")
def sess_fx():
    torch.backends.nnpack.set_flags(False)
    yield
"""

FIXTURES = """
import pytest
import torch


@pytest.fixture(scope="module")
def mod_fx():
    torch.backends.mkldnn.deterministic = True
    yield


@pytest.fixture(scope="class")
def cls_fx():
    torch.set_warn_always(True)
    yield


@pytest.fixture
def fn_fx():
    torch.backends.cudnn.benchmark = True
    yield


@pytest.fixture(scope="module")
def tidy_mod_fx():
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = False


def test_1(mod_fx, sess_fx, tidy_mod_fx):
    assert torch.backends.mkldnn.deterministic and torch.backends.cudnn.deterministic


class TestC:
    def test_2(self, cls_fx, tidy_mod_fx):
        assert torch.is_warn_always_enabled()

    @pytest.mark.backends_leaks("off")
    def test_3(self, cls_fx, mod_fx):
        pass


def test_4(fn_fx):
    pass


def test_5_clean():
    assert not torch.backends.cudnn.benchmark


@pytest.mark.backends_leaks("off")
def test_6_last(mod_fx, sess_fx):
    assert torch.backends.mkldnn.deterministic and not torch._C._get_nnpack_enabled()
"""

LEAKY_FIXTURES = {"sess_fx": "session", "mod_fx": "module", "cls_fx": "class", "fn_fx": "function"}


def _fixture_reports(result: pytest.RunResult) -> list[tuple[str, str]]:
    return re.findall(r"fixture '(\w+)' \((\w+) scope", result.stdout.str())


@pytest.mark.slow
def test_fixture_leaks_reported_once_by_fixture_in_any_order(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FIXTURE_CONFTEST)
    pytester.makepyfile(test_fx=FIXTURES)
    seen = []
    # file order serially; a random order through xdist (the wider fixtures'
    # reports then travel from the worker to the controller's summary)
    for order in (
        ["-p", "no:randomly"],
        ["-p", "randomly", "--randomly-seed=7", "-n", "2", "--dist", "loadfile"],
    ):
        result = pytester.runpytest_subprocess(*order, "-p", "no:cacheprovider", "-rN")
        out = result.stdout.str()
        _assert_no_crash(result)
        # the function-scoped fixture is part of its test; the wider ones are no
        # test's error (which test finalises a scope depends on the order)
        result.assert_outcomes(passed=6, errors=1)
        assert re.findall(r"ERROR at \w+ of (\S+)", out) == ["test_4"], out
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        reports = _fixture_reports(result)
        # the last tests of the class, the module and the session are marked
        # "off" in file order: their own marker must not hide the fixtures' leaks
        assert sorted(reports) == sorted(LEAKY_FIXTURES.items()), out
        summary = out[out.index("torch backend flags leaked by fixtures") :]
        assert sorted(_fixture_reports_in(summary)) == sorted(
            (name, scope) for name, scope in LEAKY_FIXTURES.items() if scope != "function"
        ), out
        assert "tidy_mod_fx" not in out
        assert "left torch backend flags changed" not in out
        seen.append(sorted(reports))
    assert seen[0] == seen[1]


def _fixture_reports_in(text: str) -> list[tuple[str, str]]:
    return re.findall(r"fixture '(\w+)' \((\w+) scope", text)


BROKEN_READER = """
import torch

from pytest_backends.flags import registry


def test_a_breaks_a_getter():
    def broken():
        raise NotImplementedError("a getter dispatched to a leaked mode")

    registry()._read_all = broken


def test_b_still_runs():
    pass
"""


def test_a_getter_that_raises_after_a_test_is_reported_not_an_internal_error(
    pytester: pytest.Pytester,
) -> None:
    # Seen on a GPU: a per-device getter dispatched to a TorchFunctionMode a test
    # left pushed, and the guard's reading after the test was an INTERNALERROR.
    pytester.makepyfile(test_suite=BROKEN_READER)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    _assert_no_crash(result)
    text = result.stdout.str()
    assert "after test_suite.py::test_a_breaks_a_getter finished: NotImplementedError" in text
    # the next test still runs, and says its flags could not be read
    assert "ERROR at setup of test_b_still_runs" in text
    assert result.ret != 0
