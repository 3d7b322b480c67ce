"""TestCase classes in the matrix: the user's class machinery runs once, as without it."""

from __future__ import annotations

import pytest

TESTS = """
import unittest

import pytest

REGISTRY = []


class Meta(type):
    def __init__(cls, name, bases, namespace, **kwargs):
        super().__init__(name, bases, namespace, **kwargs)
        REGISTRY.append(("meta", name))


class Base(unittest.TestCase):
    def __init_subclass__(cls, *, flavor, **kwargs):
        super().__init_subclass__(**kwargs)
        REGISTRY.append(("flavor", cls.__name__, flavor))


class TestFlavored(Base, flavor="vanilla"):
    @pytest.mark.backends("mkldnn")
    def test_conv(self):
        assert self.__class__.__name__ == "TestFlavored"


class TestMeta(unittest.TestCase, metaclass=Meta):
    @pytest.mark.backends("mkldnn")
    def test_meta(self):
        pass


def test_unmarked():
    pass


def test_registries_record_each_class_once():
    assert REGISTRY == [("flavor", "TestFlavored", "vanilla"), ("meta", "TestMeta")]
"""


@pytest.mark.parametrize("matrix", ["--backends-matrix=all", "--backends-matrix=off"])
def test_class_hooks_run_once_under_the_matrix(pytester: pytest.Pytester, matrix: str) -> None:
    pytester.makepyfile(test_cases=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", matrix, "-v")
    expanded = matrix.endswith("all")
    result.assert_outcomes(passed=6 if expanded else 4)
    assert "TypeError" not in result.stdout.str()
    if expanded:
        assert "test_cases.py::TestFlavored::test_conv[mkldnn-off] PASSED" in result.stdout.str()
