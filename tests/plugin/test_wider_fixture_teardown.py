"""What a class-, module-, package- or session-scoped fixture does when its scope ends.

Which test finalises a wider scope depends on the order, so what the
fixture's teardown leaves changed is the fixture's, reported once in the
summary, never the error of the test that closed the scope, and never hidden
by that test's ``backends_leaks`` marker. Flags the plugin applied for the test
that set the fixture up (a matrix configuration) are no part of the state the
fixture restores.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest_plugins = ["pytester"]


def test_a_wider_fixtures_teardown_change_is_the_fixtures_not_the_closing_tests(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_w="""
        import unittest
        import pytest, torch

        @pytest.fixture(scope="module")
        def mod_fx():
            yield
            torch.backends.mkldnn.deterministic = True   # in teardown, never restored

        @pytest.fixture(scope="session")
        def sess_fx():
            yield
            torch.backends.nnpack.set_flags(False)       # in teardown, never restored

        @pytest.fixture(scope="module")
        def tidy_fx():
            yield
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.benchmark = False       # changed and put back

        def test_uses_fixtures(mod_fx, sess_fx, tidy_fx):
            pass

        def test_innocent():
            pass

        class TestTDC(unittest.TestCase):
            @classmethod
            def tearDownClass(cls):
                torch.set_default_dtype(torch.float64)    # in tearDownClass

            def test_x(self):
                pass
        """,
        test_zz_next="""
        import torch

        def test_next():
            assert torch.backends.mkldnn.deterministic is False
            assert torch.get_default_dtype() is torch.float32

        def test_last_is_off_marked_yet_does_not_hide_the_session_fixture():
            pass
        """,
    )
    pytester.makeconftest(
        """
        import pytest

        def pytest_collection_modifyitems(items):
            items[-1].add_marker(pytest.mark.backends_leaks("off"))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    out = result.stdout.str()
    # no test is blamed: the closing tests pass, the next module starts clean
    result.assert_outcomes(passed=5)
    assert "left torch backend flags changed" not in out
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*= torch backend flags leaked by fixtures =*",
            "setUpClass/tearDownClass of test_w.py::TestTDC (class scope*) changed torch "
            "backend flags in its teardown*",
            "*default_dtype: 'float32' -> 'float64'",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "fixture 'mod_fx' (module scope, defined in test_w.py) changed torch backend "
            "flags in its teardown*",
            "*mkldnn.deterministic: False -> True",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "fixture 'sess_fx' (session scope, defined in test_w.py) changed torch backend "
            "flags in its teardown*",
            "*nnpack.enabled: True -> False",
        ]
    )
    assert out.count("changed torch backend flags in its teardown") == 3  # once each
    assert "tidy_fx" not in out


def test_a_wider_fixture_leak_is_not_hidden_by_the_closing_tests_marker(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_hidden="""
        import pytest, torch

        @pytest.fixture(scope="module")
        def mod_fx():
            yield
            torch.backends.mkldnn.deterministic = True   # in teardown, never restored

        def test_uses_fixture(mod_fx):
            pass

        @pytest.mark.backends_leaks("off")
        def test_last_is_off():
            pass
        """,
        test_next="""
        import torch

        def test_next():
            assert torch.backends.mkldnn.deterministic is False
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "test_hidden.py", "test_next.py")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*= torch backend flags leaked by fixtures =*",
            "fixture 'mod_fx' (module scope*) changed torch backend flags in its teardown*",
            "*mkldnn.deterministic: False -> True",
        ]
    )


@pytest.mark.parametrize("scope", ["module", "session"])
def test_override_flags_in_a_wider_fixture_under_the_matrix(
    pytester: pytest.Pytester, scope: str
) -> None:
    pytester.makeconftest(
        f"""
        import pytest
        from pytest_backends import override_flags

        @pytest.fixture(scope={scope!r})
        def float64():                      # the pattern of docs/howto/flags.rst
            with override_flags({{"default_dtype": "float64", "printoptions.precision": 6}}):
                yield
        """
    )
    # a session-scoped fixture is still set up after the module (test_b)
    dtype = "float64" if scope == "session" else "float32"
    pytester.makepyfile(
        test_a="""
        import pytest, torch

        @pytest.mark.backends(deterministic="on", mkldnn="off")
        def test_matrix(float64):
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.backends.mkldnn.enabled
            assert torch.get_default_dtype() is torch.float64

        def test_innocent(float64):
            assert not torch.are_deterministic_algorithms_enabled()
            assert torch.get_default_dtype() is torch.float64
        """,
        test_b=f"""
        import torch

        def test_after_the_module():
            assert not torch.are_deterministic_algorithms_enabled()
            assert torch.backends.mkldnn.enabled
            assert torch.get_default_dtype() is torch.{dtype}
        """,
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "test_a.py", "test_b.py", "--backends-matrix"
    )
    out = result.stdout.str()
    assert "left torch backend flags changed" not in out
    assert "leaked by fixtures" not in out
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.OK


def test_xunit_setup_and_teardown_are_named_as_the_test_module_spells_them(
    pytester: pytest.Pytester,
) -> None:
    # pytest runs each of these through a fixture of its own; a report names the
    # functions the user wrote, in their spelling, never pytest's generic pair.
    pytester.makepyfile(
        test_a="""
        import unittest
        import torch

        def setUpModule():
            torch.backends.mkldnn.deterministic = True    # never restored

        def tearDownModule():
            pass

        class TestA(unittest.TestCase):
            def test_a(self):
                pass
        """,
        test_b="""
        import unittest
        import torch

        def tearDownModule():
            torch.backends.nnpack.set_flags(False)        # in teardown, never restored

        class TestB(unittest.TestCase):
            def test_b(self):
                pass
        """,
        test_c="""
        import torch

        def setup_module():
            torch.backends.mkldnn.deterministic = True

        def test_c():
            pass
        """,
        test_d="""
        import unittest
        import torch

        class TestD(unittest.TestCase):
            def teardown_method(self, method):
                torch.backends.mkldnn.deterministic = True

            def test_d(self):
                pass
        """,
        test_e="""
        import torch

        def teardown_function(function):
            torch.backends.mkldnn.deterministic = True

        def test_e():
            pass
        """,
        test_zz_next="""
        import torch

        def test_next():
            assert torch.backends.mkldnn.deterministic is False
            assert torch._C._get_nnpack_enabled()
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "INTERNALERROR" not in out
    result.assert_outcomes(passed=6, errors=2)  # the function-scoped ones are their tests'
    for line in [
        "setUpModule/tearDownModule of test_a.py (module scope, pytest's "
        "'_xunit_setup_module_fixture_test_a') changed torch backend flags and did not "
        "restore them*",
        "setUpModule/tearDownModule of test_b.py (module scope*) changed torch backend flags "
        "in its teardown*",
        "setup_module/teardown_module of test_c.py (module scope*) changed torch backend "
        "flags and did not restore them*",
        "setup_method/teardown_method of test_d.py::TestD (function scope, pytest's "
        "'_unittest_setup_method_fixture_TestD') changed torch backend flags in its teardown*",
        "setup_function/teardown_function of test_e.py (function scope*) changed torch "
        "backend flags in its teardown*",
    ]:
        result.stdout.fnmatch_lines([line])
    # The advice names the teardown the module would define, not a fixture's yield.
    result.stdout.fnmatch_lines(["Restore them in tearDownModule, or set them inside*"])
    result.stdout.fnmatch_lines(["Restore them in teardown_module, or set them inside*"])
    assert "Restore them after the fixture's yield" not in out


def _closure_of(setup: object, teardown: object) -> Callable[..., object]:
    """A fixture function that keeps what it calls in its closure, as pytest's xunit ones do."""

    def xunit_setup_module_fixture(request: object) -> object:
        return setup, teardown

    return xunit_setup_module_fixture


def _named(name: str) -> Callable[[], None]:
    """A function called ``name`` (not defined under that name here: pytest would run it)."""

    def function() -> None:
        pass

    function.__name__ = function.__qualname__ = name
    return function


@pytest.fixture
def a_fixture() -> None:
    """A fixture under an xunit name, which pytest does not run as xunit code."""


#: What a test module may define: ``fixture:NAME`` is a fixture under NAME.
_DEFINED: dict[str, tuple[str, object]] = {
    "setUpModule": ("setUpModule", _named("setUpModule")),
    "fixture:setUpModule": ("setUpModule", a_fixture),
    # another name for a function (``setup_module = setUpModule``): named as pytest finds it
    "setup_module": ("setup_module", _named("setUpModule")),
    "teardown_module": ("teardown_module", _named("teardown_module")),
}


@pytest.mark.parametrize(
    ("defined", "node", "expected"),
    [
        (["setUpModule", "teardown_module"], True, "setUpModule/teardown_module"),
        (["setup_module", "teardown_module"], True, "setup_module/teardown_module"),
        (["setUpModule"], True, "setUpModule/tearDownModule"),
        (["fixture:setUpModule", "teardown_module"], True, "setup_module/teardown_module"),
        (["setUpModule"], False, "setUpModule/tearDownModule"),
        (["teardown_module"], False, "setup_module/teardown_module"),
        ([], False, "setup_module/teardown_module"),
    ],
)
def test_xunit_labels_name_what_the_module_defines_on_every_pytest(
    defined: list[str], node: bool, expected: str
) -> None:
    # With ``node`` the fixture knows its module (pytest >= 9.1); without it the label
    # comes from what pytest's function calls (older pytest), never a fixture.
    from types import SimpleNamespace

    from pytest_backends.isolation.teardown import fixture_label

    attrs = dict(_DEFINED[d] for d in defined)
    runs = {n: f for n, f in attrs.items() if f is not a_fixture}
    setup = runs.get("setUpModule", runs.get("setup_module"))
    fixturedef = SimpleNamespace(
        argname="_xunit_setup_module_fixture_test_m",
        scope="module",
        baseid="test_m.py",
        func=_closure_of(setup, runs.get("teardown_module")),
        **({"node": SimpleNamespace(obj=SimpleNamespace(**attrs))} if node else {}),
    )
    assert fixture_label(fixturedef) == (
        f"{expected} of test_m.py (module scope, pytest's '_xunit_setup_module_fixture_test_m')"
    )


@pytest.mark.parametrize("scope", ["class", "module"])
@pytest.mark.parametrize("restore", ["override_flags", "saved and put back"])
def test_a_wider_fixture_closing_in_a_later_matrix_configuration_restores_its_own_state(
    pytester: pytest.Pytester, scope: str, restore: str
) -> None:
    """Set up under torch's default (``mkldnn-on``), finalised under ``mkldnn-off``.

    Its teardown puts back the flags it found, ``mkldnn.enabled`` among them: that
    is the fixture restoring its own state, not a leak, whichever configuration
    ran first (a value it never found is reported: the tests above).
    """
    if restore == "override_flags":
        body = ['with override_flags({"cudnn.benchmark": True}):', "    yield"]
    else:
        body = [
            "old = torch.backends.mkldnn.enabled",
            "yield",
            "torch.backends.mkldnn.enabled = old",
        ]
    test = ["@pytest.mark.backends('mkldnn')", "def test_held(held):", "    pass"]
    if scope == "class":
        test = ["class TestHeld:"] + [
            "    " + line.replace("(held)", "(self, held)") for line in test
        ]
    source = [
        "import pytest, torch",
        "from pytest_backends import override_flags",
        f"@pytest.fixture(scope={scope!r})",
        "def held():",
        *("    " + line for line in body),
        *test,
    ]
    pytester.makepyfile(test_held="\n".join(source) + "\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--backends-matrix")
    out = result.stdout.str()
    assert "leaked by fixtures" not in out, out
    assert "left torch backend flags changed" not in out, out
    result.assert_outcomes(passed=2)
    assert result.ret == 0
