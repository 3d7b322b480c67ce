"""The leak guard, end to end in a real pytest subprocess."""

from __future__ import annotations

import sys

import pytest

pytest_plugins = ["pytester"]


def test_leak_is_named_and_next_test_starts_clean(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_a():
            torch.backends.cudnn.benchmark = True

        def test_b():
            assert torch.backends.cudnn.benchmark is False
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a*",
            "*test_*.py::test_a left torch backend flags changed:",
            "*cudnn.benchmark: False -> True",
        ]
    )
    assert "test_b" not in "".join(line for line in result.outlines if "ERROR" in line)


def test_leak_after_raising_is_still_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_a():
            torch.backends.cudnn.benchmark = True
            raise RuntimeError("boom")

        def test_b():
            assert torch.backends.cudnn.benchmark is False
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*cudnn.benchmark: False -> True*"])
    result.stdout.fnmatch_lines(["*RuntimeError: boom*"])


def test_new_style_precision_and_determinism_leaks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_precision():
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.mkldnn.conv.fp32_precision = "bf16"

        def test_deterministic():
            assert torch.backends.cuda.matmul.fp32_precision == "none"
            torch.use_deterministic_algorithms(True, warn_only=True)

        def test_clean():
            assert not torch.are_deterministic_algorithms_enabled()
            assert torch.backends.mkldnn.conv.fp32_precision == "none"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*cuda.matmul.fp32_precision: 'none' -> 'tf32'",
            "*mkldnn.conv.fp32_precision: 'none' -> 'bf16'",
            "*deterministic_algorithms: False -> True",
            "*deterministic_algorithms.warn_only: False -> True",
        ]
    )


def test_wider_fixtures_own_their_changes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.fixture(scope="module")
        def no_mkldnn():
            torch.backends.mkldnn.enabled = False
            yield
            torch.backends.mkldnn.enabled = True

        @pytest.fixture(scope="module")
        def sloppy():
            torch.backends.nnpack.set_flags(False)
            yield

        def test_one(no_mkldnn):
            assert torch.backends.mkldnn.enabled is False

        def test_two(no_mkldnn):
            assert torch.backends.mkldnn.enabled is False

        def test_three(sloppy):
            assert not torch._C._get_nnpack_enabled()
        """
    )
    pytester.makepyfile(
        test_after="""
        import torch

        def test_after():
            assert torch._C._get_nnpack_enabled()
            assert torch.backends.mkldnn.enabled
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    # a wider fixture's leak is no test's error: it is reported once in the
    # summary, and the run fails
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*= torch backend flags leaked by fixtures =*",
            "fixture 'sloppy' (module scope*did not restore them*",
            "*nnpack.enabled: True -> False",
        ]
    )
    assert "no_mkldnn" not in result.stdout.str()


def test_a_conftest_fixture_is_named_by_its_file(pytester: pytest.Pytester) -> None:
    # a fixture of a conftest.py is named by that file, not by its directory's
    # node id ("tests/sub") or its module's name ("conftest")
    pytester.makeconftest(
        """
        import pytest, torch

        @pytest.fixture(scope="session")
        def root_fx():
            torch.backends.nnpack.set_flags(False)
        """
    )
    pytester.mkpydir("tests")
    sub = pytester.mkpydir("tests/sub")
    (pytester.path / "tests" / "conftest.py").write_text(
        "import pytest, torch\n\n"
        "@pytest.fixture(scope='session')\n"
        "def tests_fx():\n"
        "    torch.set_default_dtype(torch.float64)\n"
    )
    (sub / "conftest.py").write_text(
        "import pytest, torch\n\n"
        "@pytest.fixture(scope='module')\n"
        "def sub_fx():\n"
        "    torch.backends.mkldnn.enabled = False\n"
    )
    (sub / "test_s.py").write_text(
        "class TestC:\n"
        "    import pytest\n\n"
        "    @pytest.fixture(scope='class')\n"
        "    @classmethod\n"
        "    def cls_fx(cls):\n"
        "        import torch\n"
        "        torch.backends.cudnn.benchmark = True\n\n"
        "    def test_s(self, root_fx, tests_fx, sub_fx, cls_fx):\n"
        "        pass\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "fixture 'root_fx' (session scope, defined in conftest.py)" in out, out
    assert "fixture 'tests_fx' (session scope, defined in tests/conftest.py)" in out, out
    assert "fixture 'sub_fx' (module scope, defined in tests/sub/conftest.py)" in out, out
    # a test module's fixture keeps the node it is defined in, its class included
    assert "fixture 'cls_fx' (class scope, defined in tests/sub/test_s.py::TestC)" in out, out


def test_a_fixture_teardown_change_is_the_fixtures_not_the_test_body(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.fixture
        def after_yield():
            yield
            torch.backends.cudnn.benchmark = True

        @pytest.fixture(autouse=True)
        def in_a_finalizer(request):
            request.addfinalizer(lambda: torch.set_num_threads(torch.get_num_threads()))

        @pytest.fixture
        def restores():
            yield
            torch.backends.nnpack.set_flags(False)
            torch.backends.nnpack.set_flags(True)

        def test_body_clean(after_yield, restores):
            pass

        def test_body_leaks(restores):
            torch.backends.mkldnn.enabled = False
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2, errors=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "fixture 'after_yield' (function scope*) changed torch backend flags in its "
            "teardown (after its yield, or in a finalizer) and did not restore them:",
            "*cudnn.benchmark: False -> True",
        ]
    )
    assert "test_body_clean left torch backend flags changed" not in out
    assert "test_body_leaks left torch backend flags changed" in out
    assert "'restores'" not in out and "'in_a_finalizer'" not in out


def test_leak_modes_and_bad_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_a():
            torch.backends.cudnn.deterministic = True
        """
    )
    warn = pytester.runpytest_subprocess("--backends-leaks=warn")
    warn.assert_outcomes(passed=1)
    warn.stdout.fnmatch_lines(["*BackendsLeakWarning*", "*cudnn.deterministic: False -> True*"])
    off = pytester.runpytest_subprocess("--backends-leaks=off")
    off.assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nbackends_leaks = off\n")
    assert pytester.runpytest_subprocess().ret == 0
    cli_wins = pytester.runpytest_subprocess("--backends-leaks=fail")
    cli_wins.assert_outcomes(passed=1, errors=1)
    bad = pytester.runpytest_subprocess("--backends-leaks=maybe")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--backends-leaks*'maybe'*fail, warn, off*"])
    assert "INTERNALERROR" not in bad.stdout.str() + bad.stderr.str()


def test_backend_flags_fixture_sets_and_restores(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest, torch

        def test_set(backend_flags):
            backend_flags.set({"cudnn.benchmark": True, "mkldnn.matmul.fp32_precision": "bf16"})
            assert torch.backends.cudnn.benchmark
            assert backend_flags.get("mkldnn.matmul.fp32_precision") == "bf16"

        def test_bad(backend_flags):
            with pytest.raises(ValueError, match="cuda.matmul.fp32_precision.*'ieee'"):
                backend_flags.set({"cuda.matmul.fp32_precision": "bf16"})

        def test_set_inside_override_flags(backend_flags):
            from pytest_backends import override_flags

            with override_flags({"mkldnn.enabled": False}):
                backend_flags.set({"mkldnn.enabled": True})
            assert torch.backends.mkldnn.enabled

        def test_after():
            assert not torch.backends.cudnn.benchmark
            assert torch.backends.mkldnn.matmul.fp32_precision == "none"
            assert torch.backends.mkldnn.enabled
        """
    )
    for leaks in ("fail", "off"):  # no leak reported, and none left for the next test
        result = pytester.runpytest_subprocess("-p", "no:randomly", f"--backends-leaks={leaks}")
        result.assert_outcomes(passed=4)


def test_marker_overrides_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.backends_leaks("off")
        def test_a():
            torch.backends.cudnn.benchmark = True

        def test_b():
            assert not torch.backends.cudnn.benchmark
        """
    )
    pytester.runpytest_subprocess("-p", "no:randomly").assert_outcomes(passed=2)


def test_thread_changing_flags_after_the_test_is_reported(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import threading, time, torch

        GO = threading.Event()

        def test_starts_thread():
            def later():
                GO.wait(30)
                torch.backends.cudnn.benchmark = True
            threading.Thread(target=later, daemon=True).start()

        def test_waits():
            GO.set()  # the earlier test's thread changes the flag while this test runs
            deadline = time.monotonic() + 30
            while not torch.backends.cudnn.benchmark and time.monotonic() < deadline:
                time.sleep(0.01)

        def test_sees_clean_flags():
            assert not torch.backends.cudnn.benchmark
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_waits*",
            "*cudnn.benchmark: False -> True",
            "*thread 'Thread-* (later)', started by *test_starts_thread, was running during*",
        ]
    )


def test_a_thread_that_finished_before_its_change_was_found_is_still_named(
    pytester: pytest.Pytester,
) -> None:
    """A thread that outlived its test, changed a flag and ended before the check is named.

    A thread that ended before a check that found no change is no suspect of a later one.
    """
    pytester.makeconftest(
        """
        import threading, pytest

        DONE = threading.Event()

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_protocol(item, nextitem):
            if item.name == "test_last":  # 'quick' outlived its test and ends before this one
                for thread in threading.enumerate():
                    if thread.name == "quick":
                        thread.join(5)
            return (yield)

        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionfinish(session):
            DONE.wait(5)  # the late thread changes the flag and ends before the final check
        """
    )
    pytester.makepyfile(
        """
        import threading, time, torch
        from conftest import DONE

        def test_quick():
            threading.Thread(target=lambda: time.sleep(0.3), name="quick").start()

        def _later():
            time.sleep(0.05)
            torch.backends.mkldnn.enabled = False
            DONE.set()

        def test_last():
            threading.Thread(target=_later, name="late", daemon=True).start()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*torch backend flags changed after the last test*",
            "*mkldnn.enabled: True -> False",
            "*thread 'late', started by test_*.py::test_last, was still running when that test "
            "ended (it has finished since)",
        ]
    )
    assert "'quick'" not in out, out


@pytest.mark.fresh_interpreter
def test_unused_plugin_does_not_import_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_plain():
            assert "torch" not in sys.modules
        """
    )
    pytester.makeconftest(
        """
        import sys

        def pytest_unconfigure(config):
            print("TORCH_IMPORTED=" + str("torch" in sys.modules))
        """
    )
    result = pytester.runpytest_subprocess("-s", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*TORCH_IMPORTED=False*"])
    version = pytester.run(
        sys.executable,
        "-c",
        "import sys, pytest; pytest.main(['--version']); "
        "import pytest_backends.plugin; print('torch' in sys.modules)",
    )
    assert version.outlines[-1] == "False"
