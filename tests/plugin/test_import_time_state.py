"""Flags a test module sets while imported belong to that module's own tests.

Scientific suites start modules with ``torch.set_default_dtype(torch.float64)``:
the module's tests must run in float64 (as they do without the plugin), and
every other module's tests under the suite's baseline, whatever the order in
which pytest collects or xdist distributes them.  The change is reported once,
as a warning, and does not fail the run.
"""

from __future__ import annotations

import pytest
import torch  # here, not inside a test: pytester drops modules a test imports

pytest_plugins = ["pytester"]

# A float64 module whose tolerance only holds in float64 (an Euler step of an
# ODE compared with its closed form at rtol=1e-12), as in real SDE/ODE suites.
FLOAT64_MODULE = """
import math
import torch

torch.set_default_dtype(torch.float64)

def _euler(steps):
    y = torch.tensor(1.0)
    h = 1.0 / steps
    for _ in range(steps):
        y = y + h * (-y)
    return y

def test_default_is_float64():
    assert torch.get_default_dtype() == torch.float64
    assert torch.zeros(1).dtype == torch.float64

def test_tight_tolerance_holds_only_in_float64():
    exact = (1.0 - 1.0 / 1000) ** 1000
    torch.testing.assert_close(_euler(1000).item(), exact, rtol=1e-12, atol=1e-12)
    third = torch.tensor(1.0) / 3
    assert abs(third.item() - 1 / 3) < 1e-15
"""

# Another module with other import-time defaults.
OTHER_DEFAULTS_MODULE = """
import torch

torch.backends.mkldnn.enabled = False
torch.set_num_threads(1)

def test_sees_its_own_defaults():
    assert not torch.backends.mkldnn.enabled
    assert torch.get_num_threads() == 1
    assert torch.get_default_dtype() == torch.float32
"""

# A module with no import-time change: it sees torch's defaults.
PLAIN_MODULE = """
import torch

def test_sees_the_baseline():
    assert torch.get_default_dtype() == torch.float32
    assert torch.backends.mkldnn.enabled
    assert torch.get_num_threads() == {threads}
"""


def _suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a_float64=FLOAT64_MODULE,
        test_b_other=OTHER_DEFAULTS_MODULE,
        test_c_plain=PLAIN_MODULE.format(threads=torch.get_num_threads()),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "order",
    [
        ("test_a_float64.py", "test_b_other.py", "test_c_plain.py"),
        ("test_c_plain.py", "test_b_other.py", "test_a_float64.py"),
        ("test_b_other.py", "test_c_plain.py", "test_a_float64.py"),
    ],
    ids=["a-b-c", "c-b-a", "b-c-a"],
)
def test_module_import_flags_apply_to_that_module_only(
    pytester: pytest.Pytester, order: tuple[str, ...]
) -> None:
    _suite(pytester)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *order)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*torch backend flags set while importing test modules (warning)*",
            "test_a_float64.py changed torch backend flags while it was imported:",
            "  default_dtype: 'float32' -> 'float64'",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "test_b_other.py changed torch backend flags while it was imported:",
            "  mkldnn.enabled: True -> False",
        ]
    )
    # once per module, and never blamed on a test
    assert out.count("test_a_float64.py changed torch backend flags") == 1
    assert "left torch backend flags changed" not in out
    assert "the run fails because" not in out


@pytest.mark.slow
def test_same_verdicts_as_module_by_module_without_the_plugin(
    pytester: pytest.Pytester,
) -> None:
    _suite(pytester)
    for module in ("test_a_float64.py", "test_b_other.py", "test_c_plain.py"):
        alone = pytester.runpytest_subprocess("-p", "no:backends", "-p", "no:randomly", module)
        assert alone.ret == pytest.ExitCode.OK, alone.stdout.str()
    together = pytester.runpytest_subprocess("-p", "no:randomly")
    together.assert_outcomes(passed=4)


def test_module_import_flags_under_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    _suite(pytester)
    # spread the modules' tests over two workers, each of which imports every module
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-n", "2", "--dist", "load")
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    assert out.count("test_a_float64.py changed torch backend flags while it was imported") == 1
    assert out.count("test_b_other.py changed torch backend flags while it was imported") == 1


def test_a_test_that_changes_its_modules_import_flags_is_still_a_leak(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_mod="""
        import torch

        torch.set_default_dtype(torch.float64)

        def test_changes_it_back():
            torch.set_default_dtype(torch.float32)

        def test_next_sees_the_module_default():
            assert torch.get_default_dtype() == torch.float64
        """,
        test_other="""
        import torch

        def test_other_sees_the_baseline():
            assert torch.get_default_dtype() == torch.float32
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_mod.py::test_changes_it_back left torch backend flags changed:",
            "  default_dtype: 'float64' -> 'float32'",
        ]
    )


def test_a_wider_fixture_set_up_after_the_import_still_wins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mod="""
        import pytest
        import torch
        from pytest_backends import override_flags

        torch.set_default_dtype(torch.float64)
        torch.backends.mkldnn.enabled = False

        @pytest.fixture(scope="module", autouse=True)
        def half_default():
            with override_flags({"default_dtype": "bfloat16"}):
                yield

        def test_one():
            assert torch.get_default_dtype() == torch.bfloat16
            assert not torch.backends.mkldnn.enabled

        def test_two():
            assert torch.get_default_dtype() == torch.bfloat16
            assert not torch.backends.mkldnn.enabled
        """,
        test_other="""
        import torch

        def test_other():
            assert torch.get_default_dtype() == torch.float32
            assert torch.backends.mkldnn.enabled
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK
