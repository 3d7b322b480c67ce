"""Bad ``@pytest.mark.backends`` input on every level a marker can sit on: a clear error that
names the test and the fix, never an INTERNALERROR, and the rest of the session still runs."""

from __future__ import annotations

import re

import pytest

# Imported before any pytester snapshot (see test_matrix_e2e.py).
import torch  # noqa: F401

CONFTEST = """
    import pytest

    def pytest_collection_modifyitems(items):
        for item in items:
            if item.name == "test_hooked":
                item.add_marker(pytest.mark.backends(nnpack=["on", "of"]))
"""

MODULE_MARKED = """
    import pytest
    import torch

    pytestmark = [pytest.mark.backends(mkldnm="off")]

    @pytest.fixture
    def weight():
        return torch.ones(2, 1, 3, 3)

    def test_conv(weight):
        out = torch.nn.functional.conv2d(torch.ones(1, 1, 4, 4), weight)
        assert out.sum().item() == 72

    def test_sum():
        assert torch.arange(4).sum().item() == 6
"""

LEVELS = """
    import unittest

    import pytest
    import torch

    @pytest.fixture
    def x():
        return torch.ones(1, 2, 4, 8)

    @pytest.mark.backends(sdpa="fast")
    class TestAttention:
        def test_one(self, x):
            torch.nn.functional.scaled_dot_product_attention(x, x, x)

        @pytest.mark.parametrize("heads", [1, 2])
        def test_heads(self, heads):
            assert torch.ones(heads).sum().item() == heads

    @pytest.mark.backends(["mkldnn", "nnpack"])
    class TestCaseClass(unittest.TestCase):
        def test_case(self):
            self.assertEqual(torch.ones(2).sum().item(), 2)

    @pytest.mark.backends("mkldnn-off")
    def test_config_id_as_axis(x):
        assert x.sum().item() == 64

    @pytest.mark.parametrize("n", [1, 2])
    @pytest.mark.backends(cpu_capability="avx9000")
    def test_level(n):
        assert torch.ones(n).sum().item() == n

    @pytest.mark.backends(mkldnn=("on", 3))
    def test_mixed_values():
        pass

    def test_hooked():
        pass

    @pytest.mark.backends("mkldnn")
    def test_good(backend_config, x):
        assert torch.backends.mkldnn.enabled is (backend_config.axes["mkldnn"] == "on")
        out = torch.nn.functional.conv2d(x, torch.ones(1, 2, 3, 3))
        assert out.flatten().tolist() == [18.0] * 12

    def test_plain(x):
        assert x.mean().item() == 1
"""

# Where each bad marker comes from -> what the error says (problem and next step).
EXPECTED = {
    "test_module_mark.py::test_conv": "unknown axis 'mkldnm' (did you mean 'mkldnn'?); "
    "valid axes: cudnn, cudnn_benchmark, mkldnn, ",
    "test_module_mark.py::test_sum": "unknown axis 'mkldnm' (did you mean 'mkldnn'?)",
    "test_levels.py::TestAttention::test_one": "axis 'sdpa' has no value 'fast' (did you mean "
    "'flash'?); valid values: math, flash, efficient, cudnn",
    "test_levels.py::TestAttention::test_heads": "axis 'sdpa' has no value 'fast'",
    "test_levels.py::TestCaseClass::test_case": "axis names are strings, got ['mkldnn', "
    "'nnpack'] (list); pick values with keywords",
    "test_levels.py::test_config_id_as_axis": "unknown axis 'mkldnn-off' (did you mean 'mkldnn'?)",
    "test_levels.py::test_level": "axis 'cpu_capability' has no value 'avx9000'; valid values: "
    "default, avx2, avx512, vsx, zvector, sve256",
    "test_levels.py::test_mixed_values": "mkldnn=('on', 3): values are a string or a list of "
    "strings",
    "test_levels.py::test_hooked": "axis 'nnpack' has no value 'of' (did you mean 'off'?)",
}
ERRORED = {
    "test_module_mark.py::test_conv",
    "test_module_mark.py::test_sum",
    "test_levels.py::TestAttention::test_one",
    "test_levels.py::TestAttention::test_heads[1]",
    "test_levels.py::TestAttention::test_heads[2]",
    "test_levels.py::TestCaseClass::test_case",
    "test_levels.py::test_config_id_as_axis",
    "test_levels.py::test_level[1]",
    "test_levels.py::test_level[2]",
    "test_levels.py::test_mixed_values",
    "test_levels.py::test_hooked",
}


def _summary(result: pytest.RunResult, word: str) -> set[str]:
    """The node ids of the short test summary lines starting with ``word``."""
    found = (re.match(rf"^{word} (\S+\.py::\S+)", line) for line in result.outlines)
    return {m.group(1) for m in found if m}


@pytest.mark.parametrize("extra", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_bad_markers_on_every_level_error_their_tests_and_the_rest_runs(
    pytester: pytest.Pytester, extra: list[str]
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_module_mark=MODULE_MARKED, test_levels=LEVELS)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--backends-matrix", "-rA", *extra
    )
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out and "Traceback" not in out, out[-3000:]
    # Every item of a bad marker is an error of its own, named by its node id ...
    result.assert_outcomes(passed=3, errors=len(ERRORED))
    assert _summary(result, "ERROR") == ERRORED
    # ... and the good tests ran, the matrix one once per config with its flags set.
    assert _summary(result, "PASSED") == {
        "test_levels.py::test_good[mkldnn-on]",
        "test_levels.py::test_good[mkldnn-off]",
        "test_levels.py::test_plain",
    }
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    for test, message in EXPECTED.items():
        line = f"invalid @pytest.mark.backends on {test}: {message}"
        assert any(line in text for text in result.outlines), (line, out[-4000:])
    # The broken tests are not in the matrix: the grid counts only what expanded.
    result.stdout.fnmatch_lines(["mkldnn-on *1 *0 *0", "mkldnn-off *1 *0 *0", "total *2 *0 *0"])


def test_bad_configuration_names_in_the_ini_file_are_usage_errors_naming_the_key(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    pytester.makeini("[pytest]\nbackends_config = mkldnn-off cap-avx9000\n")
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "INTERNALERROR" not in err + result.stdout.str()
    assert re.search(
        r"ERROR: ini option backends_config: unknown configuration token 'cap-avx9000'; "
        r"valid tokens: cudnn-on, .*, cap-default, cap-avx2, cap-avx512, ",
        err,
    ), err
    assert "passed" not in result.stdout.str()  # nothing ran on a half-understood selection


def _run_inprocess(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    """A session of marker checks only (no torch state changes): in process, for speed."""
    pytester.makepyfile(test_marks=source)
    return pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args)


def test_a_marker_naming_no_axis_is_reported_on_its_test(pytester: pytest.Pytester) -> None:
    result = _run_inprocess(
        pytester,
        """
        import pytest

        @pytest.mark.backends()
        def test_empty():
            pass

        def test_plain():
            pass
        """,
        "--backends-matrix",
    )
    assert "INTERNALERROR" not in result.stdout.str()
    # An error or a BackendsMarkerWarning on the test, either of them with the fix.
    named = [line for line in result.outlines if "test_marks.py::test_empty" in line]
    assert any("no axis" in line or "names no" in line for line in named), result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) >= 1  # test_plain still ran


@pytest.mark.parametrize(
    ("marker", "fix"),
    [
        pytest.param(
            'sdpa=[], mkldnn="off"',
            "backends(",
            id="no-value",
        ),
        pytest.param(
            '"sdpa", sdpa="math"',
            "backends(",
            id="axis-twice",
        ),
        pytest.param(
            'cpu_capability="AVX512"',
            "did you mean 'avx512'",
            id="level-case",
        ),
        pytest.param('nnpack="onn"', "did you mean 'on'", id="value-typo"),
    ],
)
def test_each_marker_error_names_the_test_and_the_fix(
    pytester: pytest.Pytester, marker: str, fix: str
) -> None:
    result = _run_inprocess(
        pytester,
        f"""
        import pytest

        @pytest.mark.backends({marker})
        def test_bad():
            pass

        def test_plain():
            pass
        """,
        "--backends-matrix",
    )
    result.assert_outcomes(passed=1, errors=1)
    errors = [line for line in result.outlines if "on test_marks.py::test_bad: " in line]
    assert errors, result.stdout.str()
    assert all(fix in line for line in errors), errors


def test_collect_only_shows_invalid_markers(pytester: pytest.Pytester) -> None:
    result = _run_inprocess(
        pytester,
        """
        import pytest

        @pytest.mark.backends("mkldnm")
        def test_typo():
            pass
        """,
        "--backends-matrix",
        "--co",
        "-q",
    )
    assert "INTERNALERROR" not in result.stdout.str()
    assert "unknown axis 'mkldnm'" in result.stdout.str() + result.stderr.str()


def test_a_selection_with_two_values_of_one_axis_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    result = _run_inprocess(
        pytester,
        """
        import pytest

        @pytest.mark.backends("mkldnn")
        def test_marked():
            pass
        """,
        "--backends-config=mkldnn-off,mkldnn-on",
    )
    # No config has two values of one axis: repeat the option to select both.
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert "--backends-config" in err and "mkldnn" in err and "INTERNALERROR" not in err


DUPLICATES = """
    import unittest

    import pytest
    import torch

    @pytest.mark.backends(mkldnn=["on", "on"])
    def test_list():
        pass

    @pytest.mark.backends("mkldnn", sdpa=("math", "flash", "math"))
    def test_tuple():
        pass

    @pytest.mark.backends(cpu_capability=["default", "avx2", "default"])
    class TestLevels:
        @pytest.mark.parametrize("n", [1, 2])
        def test_level(self, n):
            pass

    class TestCaseClass(unittest.TestCase):
        @pytest.mark.backends(nnpack=["off", "on", "off", "on"])
        def test_case(self):
            pass

    def test_hooked():
        pass

    @pytest.mark.backends(mkldnn=["on", "off"])
    def test_good(backend_config):
        assert torch.backends.mkldnn.enabled is (backend_config.axes["mkldnn"] == "on")

    def test_plain():
        pass
"""


def test_a_value_repeated_on_one_axis_is_an_error_naming_test_axis_and_value(
    pytester: pytest.Pytester,
) -> None:
    # Any form that lists values (a list, a tuple, the CPU capability levels, a marker
    # on a class, on a TestCase method or added by a hook) goes through one check.
    pytester.makeconftest(
        """
        import pytest

        def pytest_collection_modifyitems(items):
            for item in items:
                if item.name == "test_hooked":
                    item.add_marker(pytest.mark.backends(deterministic=["on", "on"]))
        """
    )
    pytester.makepyfile(test_dups=DUPLICATES)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--backends-matrix", "-rA"
    )
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out and "Traceback" not in out, out[-3000:]
    expected = {
        "test_list": "axis 'mkldnn' lists value 'on' more than once: name each "
        "value once, backends(mkldnn=['on'])",
        "test_tuple": "axis 'sdpa' lists value 'math' more than once: name each "
        "value once, backends(sdpa=['math', 'flash'])",
        "TestLevels::test_level": "axis 'cpu_capability' lists value 'default' more than once: "
        "name each value once, backends(cpu_capability=['default', 'avx2'])",
        "TestCaseClass::test_case": "axis 'nnpack' lists values 'off', 'on' more than once: "
        "name each value once, backends(nnpack=['off', 'on'])",
        "test_hooked": "axis 'deterministic' lists value 'on' more than once",
    }
    for test, message in expected.items():
        line = f"invalid @pytest.mark.backends on test_dups.py::{test}: {message}"
        assert any(line in text for text in result.outlines), (line, out[-4000:])
    assert _summary(result, "ERROR") == {
        "test_dups.py::test_list",
        "test_dups.py::test_tuple",
        "test_dups.py::TestLevels::test_level[1]",
        "test_dups.py::TestLevels::test_level[2]",
        "test_dups.py::TestCaseClass::test_case",
        "test_dups.py::test_hooked",
    }
    assert _summary(result, "PASSED") == {
        "test_dups.py::test_good[mkldnn-on]",
        "test_dups.py::test_good[mkldnn-off]",
        "test_dups.py::test_plain",
    }
    assert result.ret == pytest.ExitCode.TESTS_FAILED
