"""Nothing silently ignored: TestCase methods and hook-added markers in the matrix, options
that selected nothing, and the costs the summary states."""

from __future__ import annotations

import re
import unittest
from collections.abc import Callable, Generator, Iterator

import pytest

# Imported before any pytester snapshot (see test_matrix_e2e.py).
import torch  # noqa: F401

from pytest_backends import _selected, _shared, nothing_selected
from pytest_backends.determinism import runs
from pytest_backends.matrix import testcase, verify_cost

Run = Callable[..., pytest.RunResult]

CONFTEST = """
    import pytest

    @pytest.fixture(autouse=True)
    def _config_on_instance(request, backend_config):
        # How a unittest.TestCase reads its config: fixtures cannot be arguments there.
        if request.instance is not None:
            request.instance.backend_config = backend_config

    def pytest_collection_modifyitems(items):
        for item in items:
            if "by_hook" in item.name:
                item.add_marker(pytest.mark.backends("mkldnn"))
                item.add_marker(pytest.mark.backends_leaks("fail"))
            if item.name.startswith("test_changed"):
                item.add_marker(pytest.mark.backends("nnpack"))

    def pytest_generate_tests(metafunc):
        if metafunc.definition.name == "test_generated_late":
            metafunc.definition.add_marker(pytest.mark.backends("mkldnn"))
"""

SUITE = """
    import unittest

    import pytest
    import torch

    def conv():
        return torch.nn.functional.conv2d(torch.ones(1, 1, 6, 6), torch.ones(1, 1, 3, 3))

    class TestConv(unittest.TestCase):
        setups = 0

        @classmethod
        def setUpClass(cls):
            cls.setups += 1

        def setUp(self):
            self.expected = conv()

        def tearDown(self):
            print("TEARDOWN", self._testMethodName)

        @pytest.mark.backends("mkldnn")
        def test_conv(self):
            on = torch.backends.mkldnn.enabled
            print("RAN", self._testMethodName, self.backend_config.id, on, type(self).setups)
            for i in range(2):
                with self.subTest(i=i):
                    self.assertTrue(torch.equal(conv(), self.expected))

        def test_plain(self):
            assert torch.backends.mkldnn.enabled

        def test_by_hook(self):
            print("HOOKED", self._testMethodName, self.backend_config.id,
                  torch.backends.mkldnn.enabled)
            conv()

    @pytest.mark.parametrize("n", [1, 2])
    def test_by_hook_param(n, backend_config):
        print("HOOKED", n, backend_config.id, torch.backends.mkldnn.enabled)
        conv()

    @pytest.mark.backends("mkldnn")
    def test_changed():
        conv()

    def test_generated_late():
        pass
"""


def _ids(result: pytest.RunResult) -> list[str]:
    return sorted(
        {m.group(1) for line in result.outlines if (m := re.match(r"^(\S+\.py::\S+) ", line))}
    )


@pytest.mark.slow
def test_testcase_methods_and_hook_markers_expand_like_functions(
    pytester: pytest.Pytester, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = run("--backends-matrix", "--backends-verify", "-v", "-s", "-rw")
    result.assert_outcomes(passed=12)
    assert _ids(result) == sorted(
        [
            "test_suite.py::TestConv::test_conv[mkldnn-on]",
            "test_suite.py::TestConv::test_conv[mkldnn-off]",
            "test_suite.py::TestConv::test_plain",
            "test_suite.py::TestConv::test_by_hook[mkldnn-on]",
            "test_suite.py::TestConv::test_by_hook[mkldnn-off]",
            "test_suite.py::test_by_hook_param[mkldnn-on-1]",
            "test_suite.py::test_by_hook_param[mkldnn-off-1]",
            "test_suite.py::test_by_hook_param[mkldnn-on-2]",
            "test_suite.py::test_by_hook_param[mkldnn-off-2]",
            "test_suite.py::test_changed[mkldnn-on]",
            "test_suite.py::test_changed[mkldnn-off]",
            "test_suite.py::test_generated_late",
        ]
    )
    out = result.stdout.str()
    # Each config ran through unittest's protocol with its flags; setUpClass ran once.
    for line in (
        "RAN test_conv[mkldnn-on] mkldnn-on True 1",
        "RAN test_conv[mkldnn-off] mkldnn-off False 1",
        "HOOKED test_by_hook[mkldnn-on] mkldnn-on True",
        "HOOKED test_by_hook[mkldnn-off] mkldnn-off False",
        "HOOKED 1 mkldnn-on True",
        "HOOKED 2 mkldnn-off False",
        "TEARDOWN test_conv[mkldnn-off]",
    ):
        assert line in out, line
    assert "4 subtests passed" in out or "SUBPASSED(i=1)" in out
    result.stdout.fnmatch_lines(
        [
            "backends: 3 test(s) marked by hooks expanded into their configs after collection",
        ]
    )
    # What could not be honoured is said, per test, with the fix.
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.backends on test_suite.py::test_changed[[]mkldnn-on[]] is not "
            "expanded: its markers changed after the matrix expanded it*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.backends on test_suite.py::test_generated_late is not expanded: a "
            "pytest_generate_tests hook added it after*tryfirst=True*",
        ]
    )
    # The matrix grid and the verifier see the TestCase and hook-expanded items.
    result.stdout.fnmatch_lines(
        [
            "*backends matrix*",
            "mkldnn-on *5 *0 *0*",
            "mkldnn-off *5 *0 *0*",
            "*backends verify cost*",
            "verified 10 test(s): the verifier's own time * s (mean * ms per test, slowest *",
            "call phases of the verified tests: * s, the profiler's per-op cost included*",
            "the profiler's one-time start-up: * s in 1 process, before the first test (in no "
            "test's time)",
        ]
    )
    # The start-up (seconds) is not charged to the slowest test (milliseconds).
    out = result.stdout.str()
    slowest = float(re.search(r"slowest ([\d.]+) ms in", out).group(1)) / 1000  # type: ignore[union-attr]
    startup = float(re.search(r"one-time start-up: ([\d.]+) s", out).group(1))  # type: ignore[union-attr]
    assert slowest < startup, out

    # The same collection in every xdist worker (xdist refuses to run otherwise).
    # The verifier's times travel on the reports to the controller.
    result = run("--backends-matrix", "--backends-verify", "-n", "2", "-q")
    result.assert_outcomes(passed=12)
    assert "Different tests were collected" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["verified 10 test(s): the verifier's own time *"])


@pytest.mark.slow
def test_options_that_selected_nothing_are_said_and_fail_when_strict(
    pytester: pytest.Pytester, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = run("--backends-determinism", "--backends-matrix", "--backends-verify")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*backends: options that selected no test*",
            "--backends-determinism selected no test: no collected test is marked "
            "@pytest.mark.backends(deterministic=...)*--backends-determinism-all",
            "--backends-matrix selected no test: no collected test is marked "
            "@pytest.mark.backends with any axis",
            "--backends-verify selected no test: *needs --backends-matrix*",
        ]
    )
    assert "the run fails" not in result.stdout.str()

    # The ini twin, under xdist: the workers' counts reach the controller.
    pytester.makeini("[pytest]\nbackends_strict = true\n")
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.backends("mkldnn")
        def test_marked():
            pass
    """
    )
    result = run("-n", "2", "--backends-census=census.json", "--backends-matrix=mkldnn")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        [
            "--backends-census selected no test: *",
            "--backends-strict: the run fails because of the above "
            "(exit code 4, or 1 where tests failed too)",
            "*3 passed*",
        ]
    )
    assert "--backends-matrix selected no test" not in result.stdout.str()

    # Strict: a marker the matrix cannot honour fails its test instead of warning.
    pytester.makeconftest("""
        import pytest

        def pytest_collection_modifyitems(items):
            for item in items:
                item.add_marker(pytest.mark.backends("nnpack"))
    """)
    result = run("--backends-matrix", "-k", "marked")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*is not expanded: its markers changed*(--backends-strict)*"])


SUBTESTS = """
    import unittest

    import pytest
    import torch

    class TestSub(unittest.TestCase):
        @pytest.mark.backends(deterministic="on")
        def test_unittest_subtests(self):
            for i in range(2):
                with self.subTest(i=i):
                    torch.ones(3).sum()

    @pytest.mark.backends(deterministic="on")
    def test_fixture_subtests(subtests):
        for i in range(3):
            with subtests.test(i=i):
                torch.ones(3).sum()

    @pytest.mark.backends(deterministic="on")
    def test_failing_subtest(subtests):
        with subtests.test("bad"):
            assert torch.ones(1).item() == 2
"""


@pytest.mark.skipif(not hasattr(pytest, "Subtests"), reason="needs pytest's subtests fixture")
def test_subtests_are_counted_once_over_determinism_runs(
    pytester: pytest.Pytester, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makepyfile(test_sub=SUBTESTS)
    result = run("--backends-determinism=3", "-v")
    out = result.stdout.str()
    assert out.count("SUBPASSED(i=1)") == 1, out  # the fixture's, once, not once per run
    assert out.count("SUBFAILED[bad]") == 2  # the progress line and the short summary
    # 2 unittest subTests + 3 fixture subtests, each once; the failing one stops the runs.
    result.stdout.fnmatch_lines(
        [
            "FAILED test_sub.py::test_failing_subtest - contains 1 failed subtest",
            "*2 failed, 2 passed, 5 subtests passed in*",
        ]
    )


# --- units ----------------------------------------------------------------------------------


class _Case(unittest.TestCase):
    """A class for the subclass checks."""

    __test__ = False

    @pytest.mark.backends("mkldnn")
    def test_a(self) -> None:
        pass

    def test_b(self) -> None:
        pass


def test_matrix_subclass_runs_each_config_as_a_method_and_hides_the_original() -> None:
    names = testcase.config_names("test_a", ["mkldnn-on", "mkldnn-off"])
    sub = testcase.matrix_subclass(_Case, {"test_a": names})
    assert (sub.__name__, sub.__qualname__, sub.__module__) == (
        _Case.__name__,
        _Case.__qualname__,
        _Case.__module__,
    )
    assert issubclass(sub, _Case)
    assert testcase.unittest_names(sub) == ["test_a[mkldnn-off]", "test_a[mkldnn-on]", "test_b"]
    assert testcase.unittest_names(_Case) == ["test_a", "test_b"]  # the user's class is unchanged
    outcome = unittest.TestResult()
    sub("test_a[mkldnn-on]").run(outcome)
    assert outcome.wasSuccessful() and outcome.testsRun == 1
    assert sub("test_a[mkldnn-on]").id().endswith("_Case.test_a[mkldnn-on]")
    assert testcase.is_testcase(sub) and not testcase.is_testcase(object)
    assert testcase.expandable(_Case, "test_a")


def test_selection_merges_worker_counts_and_names_empty_options() -> None:
    first, second = _selected.Selection(), _selected.Selection()
    first.add("--backends-matrix", 0, "mark a test")
    first.add("--backends-verify", 0, "mark an axis")
    second.add("--backends-matrix", 3, "mark a test")
    first.merge(second.to_plain())
    assert first.empty() == [("--backends-verify", "mark an axis")]
    assert first.counts == {"--backends-matrix": 3, "--backends-verify": 0}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Item:
    def __init__(self) -> None:
        self.stash = pytest.Stash()


def _wrapper(clock: _Clock, log: list[str]) -> Generator[None, object, object]:
    clock.now += 2.0  # the verifier's own work before the test
    try:
        result = yield
    except ValueError:
        log.append("saw the error")
        clock.now += 1.0
        raise
    clock.now += 3.0  # and after it
    return f"wrapped {result}"


def _drive(item: _Item, clock: _Clock, log: list[str], body: Callable[[], object]) -> object:
    driver = verify_cost._drive(_wrapper(clock, log), item)  # type: ignore[arg-type]
    next(driver)
    try:
        value = body()
    except ValueError as exc:
        try:
            driver.throw(exc)
        except ValueError:
            return "raised"
        raise AssertionError("the error was swallowed") from None
    try:
        driver.send(value)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the driver did not stop")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    fake = _Clock()
    monkeypatch.setattr(verify_cost.time, "perf_counter", fake)
    yield fake


def test_verify_timer_counts_the_wrapper_not_the_test(clock: _Clock) -> None:
    item, log = _Item(), []

    def body() -> str:
        clock.now += 100.0  # the test itself
        return "result"

    assert _drive(item, clock, log, body) == "wrapped result"
    assert item.stash[verify_cost.SECONDS_KEY] == 5.0

    def failing() -> str:
        clock.now += 50.0
        raise ValueError("test failed")

    item = _Item()
    assert _drive(item, clock, log, failing) == "raised"
    assert log == ["saw the error"]
    assert item.stash[verify_cost.SECONDS_KEY] == 3.0


def test_cost_summary_lines() -> None:
    summary = verify_cost.CostSummary()
    assert summary.lines() == []
    for nodeid, seconds in (("t.py::a", 0.5), ("t.py::b", 1.5)):
        report = pytest.TestReport(
            nodeid, ("t.py", 1, nodeid), {}, "passed", None, "call", duration=2.0
        )
        _shared.attach(report, verify_cost.SECONDS_PROPERTY, seconds)
        summary.pytest_runtest_logreport(report)
    assert summary.lines()[0] == (
        "verified 2 test(s): the verifier's own time 2.00 s (mean 1000.0 ms per test, "
        "slowest 1500.0 ms in t.py::b)"
    )
    assert summary.lines()[1].startswith("call phases of the verified tests: 4.00 s")


def test_cost_summary_gives_the_start_up_apart() -> None:
    summary = verify_cost.CostSummary()
    for nodeid, startup in (("t.py::a", 2.5), ("t.py::b", None), ("t.py::c", 1.0)):
        report = pytest.TestReport(nodeid, ("t.py", 1, nodeid), {}, "passed", None, "call")
        _shared.attach(report, verify_cost.SECONDS_PROPERTY, 0.01)
        if startup is not None:
            _shared.attach(report, verify_cost.STARTUP_PROPERTY, startup)
        summary.pytest_runtest_logreport(report)
    assert summary.lines()[2] == (
        "the profiler's one-time start-up: 3.50 s in 2 processes, before the first test "
        "(in no test's time)"
    )
    assert summary.own == pytest.approx(0.03)


def test_cost_summary_ignores_reruns_other_phases_and_unverified_reports() -> None:
    summary = verify_cost.CostSummary()
    for when, outcome, tagged in (
        ("setup", "passed", True),
        ("call", "rerun", True),
        ("call", "passed", False),
    ):
        report = pytest.TestReport("t.py::a", ("t.py", 1, "a"), {}, outcome, None, when)
        if tagged:
            _shared.attach(report, verify_cost.SECONDS_PROPERTY, 1.0)
        summary.pytest_runtest_logreport(report)
    assert summary.tests == 0 and summary.lines() == []


# --- subtests over determinism runs -----------------------------------------------------------


class _Context:
    def __init__(self, msg: str | None, **kwargs: object) -> None:
        self.msg, self.kwargs = msg, kwargs


def _subreport(
    nodeid: str, run: int | None, outcome: str, msg: str | None = None, **kwargs: object
) -> pytest.TestReport:
    report = pytest.TestReport(nodeid, ("t.py", 1, nodeid), {}, outcome, None, "call")
    report.context = _Context(msg, **kwargs)  # type: ignore[attr-defined]
    if run is not None:
        runs.tag(report, run)
    return report


def test_subtest_counter_hides_repeats_of_the_first_run_only() -> None:
    counter = runs.SubtestCounter()
    config: pytest.Config = None  # type: ignore[assignment]  # not read

    def status(report: pytest.TestReport) -> tuple[str, str, str] | None:
        return counter.pytest_report_teststatus(report, config)

    counter.pytest_runtest_logstart("t.py::a", None)
    assert status(_subreport("t.py::a", 0, "passed", i=1)) is None  # run 0 counts
    assert status(_subreport("t.py::a", 0, "failed", "bad")) is None
    assert status(_subreport("t.py::a", 1, "passed", i=1)) == ("", "", "")  # a repeat
    assert status(_subreport("t.py::a", 2, "failed", "bad")) == ("", "", "")
    assert status(_subreport("t.py::a", 1, "failed", i=1)) is None  # a new outcome is news
    assert status(_subreport("t.py::a", 1, "passed", i=2)) is None  # not seen in run 0
    assert status(_subreport("t.py::b", 1, "passed", i=1)) is None  # another test
    assert status(_subreport("t.py::a", None, "passed", i=1)) is None  # not a determinism run
    plain = pytest.TestReport("t.py::a", ("t.py", 1, "a"), {}, "passed", None, "call")
    runs.tag(plain, 1)
    assert status(plain) is None  # the test's own report is never hidden
    counter.pytest_runtest_logfinish("t.py::a", None)
    assert status(_subreport("t.py::a", 1, "passed", i=1)) is None  # forgotten at the end


# --- helpers of the matrix hooks ---------------------------------------------------------------


class _Unequal:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("ambiguous, like a tensor")

    __hash__ = object.__hash__


class _Spec:
    def __init__(self, id: str, **params: object) -> None:
        self.id = id
        self.params = params


class _Fake:
    def __init__(self, id: str, **params: object) -> None:
        self.callspec = _Spec(id, **params)


def test_same_params_matches_by_id_never_by_value() -> None:
    from pytest_backends.matrix.configs import BackendConfig
    from pytest_backends.matrix.items import same_params

    config = BackendConfig((("mkldnn", "off"),), tokens=("mkldnn-off",))
    odd = _Unequal()
    old = _Fake("1-v1", n=1, t=odd)
    assert same_params(old, _Fake("1-v1-mkldnn-off", n=1, t=odd, backend_config=config))  # type: ignore[arg-type]
    assert same_params(old, _Fake("mkldnn-off-1-v1", n=1, t=_Unequal(), backend_config=config))  # type: ignore[arg-type]
    # Equal values under another id are another test.
    assert not same_params(old, _Fake("1-v2-mkldnn-off", n=1, t=odd, backend_config=config))  # type: ignore[arg-type]
    assert not same_params(old, _Fake("2-v1", n=2, t=odd))  # type: ignore[arg-type]
    assert same_params(object(), _Fake("mkldnn-off", backend_config=config))  # type: ignore[arg-type]


class _Odd(unittest.TestCase):
    __test__ = False

    @staticmethod
    def test_static() -> None:
        pass

    def test_plain(self) -> None:
        pass


def test_only_plain_methods_are_expandable_and_hidden_originals_still_work() -> None:
    assert not testcase.expandable(_Odd, "test_static")
    assert testcase.expandable(_Odd, "test_plain")
    sub = testcase.matrix_subclass(_Odd, {"test_plain": ["test_plain[x-on]"]})
    assert getattr(sub.test_plain, "__test__", True) is False
    assert sub("runTest").test_plain() is None  # the original name still calls the method
    assert sub.__dict__["test_plain[x-on]"] is _Odd.__dict__["test_plain"]


def test_strict_resolves_command_line_over_ini(pytester: pytest.Pytester) -> None:
    def strict(*args: str) -> bool:
        return nothing_selected.Settings.from_config(pytester.parseconfig(*args)).strict

    assert not strict()
    assert strict("--backends-strict")
    pytester.makeini("[pytest]\nbackends_strict = true\n")
    assert strict()


CASES = """
    import unittest

    import pytest

    pytestmark = pytest.mark.backends(deterministic="on")

    class Base(unittest.TestCase):
        __test__ = False

        @pytest.mark.backends("mkldnn")
        def test_inherited(self):
            pass

    class TestChild(Base):
        __test__ = True

    @pytest.mark.backends(mkldnn="off")
    class TestClassMarked(unittest.TestCase):
        @pytest.mark.backends(nnpack="on")
        def test_both(self):
            pass

        def test_class_only(self):
            pass

    @unittest.skip("whole class skipped")
    class TestSkipped(unittest.TestCase):
        @pytest.mark.backends("mkldnn")
        def test_never(self):
            pass
"""


def _collect(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest_inprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--co", "-q", *args
    )
    return [line for line in result.outlines if "::" in line and " " not in line]


def test_testcase_markers_merge_from_module_class_and_method_and_select_by_config(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_cases=CASES)
    assert _collect(pytester, "--backends-matrix") == [
        "test_cases.py::TestChild::test_inherited[mkldnn-off,deterministic-on]",
        "test_cases.py::TestChild::test_inherited[mkldnn-on,deterministic-on]",
        "test_cases.py::TestClassMarked::test_both[mkldnn-off,nnpack-on,deterministic-on]",
        "test_cases.py::TestClassMarked::test_class_only[mkldnn-off,deterministic-on]",
        "test_cases.py::TestSkipped::test_never[mkldnn-off,deterministic-on]",
        "test_cases.py::TestSkipped::test_never[mkldnn-on,deterministic-on]",
    ]
    assert _collect(pytester, "--backends-config=mkldnn-on") == [
        "test_cases.py::TestChild::test_inherited[mkldnn-on,deterministic-on]",
        "test_cases.py::TestSkipped::test_never[mkldnn-on,deterministic-on]",
    ]
    assert _collect(pytester, "--backends-matrix=nnpack") == [
        "test_cases.py::TestChild::test_inherited",
        "test_cases.py::TestClassMarked::test_both[nnpack-on]",
        "test_cases.py::TestClassMarked::test_class_only",
        "test_cases.py::TestSkipped::test_never",
    ]
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--backends-matrix", "-k", "Skipped")
    result.assert_outcomes(skipped=2)


def test_a_typo_in_a_testcase_marker_errors_that_test_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_typo="""
        import unittest

        import pytest

        class TestTypo(unittest.TestCase):
            @pytest.mark.backends("mkldnm")
            def test_typo(self):
                pass

            def test_fine(self):
                pass
    """
    )
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--backends-matrix", "-rE")
    result.assert_outcomes(passed=1, errors=1)  # an error at setup, as for functions
    result.stdout.fnmatch_lines(
        [
            "*invalid @pytest.mark.backends on test_typo.py::TestTypo::test_typo: unknown axis "
            "'mkldnm' (did you mean 'mkldnn'?)*",
        ]
    )
