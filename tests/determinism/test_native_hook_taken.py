"""Where another library holds the native recorder's dispatch key, the Python recorder records.

The native recorder hooks the dispatcher with a fallback on a dispatch key no
torch op uses. In a process where another library registered a fallback for
that key first, the check must not be lost: the plugin records with the
Python recorder, and a planted nondeterministic op is still caught.
"""

from __future__ import annotations

import pytest

from pytest_backends.determinism.record_native import native_module

TAKE_THE_KEY = """

_OTHER = torch.library.Library("_", "IMPL")


def _pass_on(keyset, op, *args, **kwargs):
    raise AssertionError("the other library's fallback was never meant to run here")


_OTHER.fallback(_pass_on, dispatch_key="DeferredInit", with_keyset=True)
"""


def test_a_taken_key_falls_back_to_the_python_recorder(planted_conftest: pytest.Pytester) -> None:
    if native_module() is None:
        pytest.skip(
            "the native extension is not built here (python -m pytest_backends build-native)"
        )
    conftest = planted_conftest.path / "conftest.py"
    conftest.write_text(conftest.read_text(encoding="utf-8") + TAKE_THE_KEY, encoding="utf-8")
    planted_conftest.makepyfile(
        test_taken="""
        import torch

        from pytest_backends import _native
        from pytest_backends.determinism.record_native import native_module


        def test_the_native_recorder_steps_aside():
            assert "fallback" in _native.load().recorder_hook_error()
            assert native_module() is None


        def test_noisy():
            torch.ops.pbtest.noisy(torch.ones(4, dtype=torch.float64))


        def test_clean():
            torch.ones(4, dtype=torch.float64).cumsum(0)
        """
    )
    result = planted_conftest.runpytest_subprocess("--backends-determinism-all", "-p", "no:xdist")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_taken.py::test_noisy - nondeterministic op*"])
