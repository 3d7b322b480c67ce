"""Markers added in collection hooks behave like decorator markers.

Re-collected items are matched to their originals by identity (parameter
indices), so each config item exists exactly once; node-id selection,
``--deselect``, ``-k`` and the collected count see the expanded items.
"""

from __future__ import annotations

import pytest

CONFTEST = """
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.originalname in ("test_p", "test_conv_a", "test_conv_b"):
            item.add_marker(pytest.mark.backends("mkldnn"))
"""

TESTS = """
import pytest


@pytest.mark.parametrize("v", [[1.5], [2.0], [2.0]])
def test_p(v, backend_config):
    assert backend_config.id in ("mkldnn-on", "mkldnn-off")


def test_conv_a(backend_config):
    assert backend_config.id in ("mkldnn-on", "mkldnn-off")


def test_conv_b():
    pass


def test_other():
    pass
"""

COMMON = ("-p", "no:randomly", "-p", "no:cacheprovider")


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_h=TESTS)
    return pytester


def _ids(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if line.startswith("test_h.py::")]


def test_equal_parameter_values_give_each_config_item_once(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*COMMON, "--backends-matrix", "-v")
    result.assert_outcomes(passed=11)
    ran = [line.split()[0] for line in result.outlines if " PASSED" in line]
    assert len(ran) == len(set(ran)) == 11
    assert "test_h.py::test_p[mkldnn-off-v1]" in ran
    assert "test_h.py::test_p[mkldnn-off-v2]" in ran
    # The header counts the items that run.
    result.stdout.fnmatch_lines(["collecting ... collected 11 items"])


def test_equal_values_under_xdist(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*COMMON, "--backends-matrix", "-n", "2")
    result.assert_outcomes(passed=11)


def test_node_id_of_a_hook_added_config_selects_it(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(
        *COMMON, "--backends-matrix", "-v", "test_h.py::test_conv_a[mkldnn-off]"
    )
    result.assert_outcomes(passed=1)
    assert [line.split()[0] for line in result.outlines if " PASSED" in line] == [
        "test_h.py::test_conv_a[mkldnn-off]"
    ]


def test_deselect_and_k_see_hook_added_configs(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(
        *COMMON,
        "--backends-matrix",
        "--co",
        "-q",
        "--deselect",
        "test_h.py::test_conv_a[mkldnn-off]",
        "-k",
        "conv",
    )
    assert _ids(result) == [
        "test_h.py::test_conv_a[mkldnn-on]",
        "test_h.py::test_conv_b[mkldnn-on]",
        "test_h.py::test_conv_b[mkldnn-off]",
    ]
    result = suite.runpytest_subprocess(*COMMON, "--backends-matrix", "--co", "-q", "-k", "off")
    assert _ids(result) == [
        "test_h.py::test_p[mkldnn-off-v0]",
        "test_h.py::test_p[mkldnn-off-v1]",
        "test_h.py::test_p[mkldnn-off-v2]",
        "test_h.py::test_conv_a[mkldnn-off]",
        "test_h.py::test_conv_b[mkldnn-off]",
    ]


PARAM_MARKED = """
import pytest

@pytest.mark.parametrize("x", [
    pytest.param(1, marks=pytest.mark.backends("mkldnn"), id="marked"),
    pytest.param(2, id="unmarked"),
])
def test_param(x):
    pass

def test_plain():
    pass
"""


@pytest.mark.parametrize("config", ["mkldnn-on", "mkldnn-off"])
def test_config_keeps_an_unmarked_param_beside_a_marked_one(
    pytester: pytest.Pytester, config: str
) -> None:
    """Each job narrowed by --backends-config still runs the unmarked case, as documented."""
    pytester.makepyfile(test_p=PARAM_MARKED)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-v", f"--backends-config={config}")
    result.assert_outcomes(passed=3, deselected=1)
    result.stdout.fnmatch_lines([f"*test_param*{config}* PASSED*"])
    result.stdout.fnmatch_lines(["*test_param*unmarked* PASSED*"])


PARAM_AND_TEST_MARKED = """
import pytest

@pytest.mark.backends("mkldnn")
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.backends("deterministic"))])
def test_x(n, backend_config):
    pass
"""


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
def test_a_param_marker_beside_the_tests_own_is_named_as_such(
    pytester: pytest.Pytester, strict: bool
) -> None:
    """The warning names pytest.param and the fix the docs give, not a late hook."""
    pytester.makepyfile(test_p=PARAM_AND_TEST_MARKED)
    args = ["-p", "no:randomly", "--backends-matrix", *(["--backends-strict"] if strict else [])]
    result = pytester.runpytest_subprocess(*args)
    result.stdout.fnmatch_lines(
        [
            "*test_x[[]mkldnn-*-2[]] is not expanded: a backends marker given to "
            "pytest.param(..., marks=...) is not combined with the test's own*"
        ]
    )
    assert "add them all in the same hook" not in result.stdout.str()
    if strict:
        result.assert_outcomes(errors=4)
    else:
        assert result.ret == pytest.ExitCode.OK
        assert result.parseoutcomes()["passed"] == 4
