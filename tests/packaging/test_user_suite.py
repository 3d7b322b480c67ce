"""A user's suite in an empty folder, run with whatever package pytest imports.

Under ``make test INSTALL=wheel`` (CI) that is the installed wheel, with the
native harness built from it: the leak guard, ``--backends-matrix``,
``assert_reproducible``, ``--backends-determinism`` with the native recorder,
and ``assert_close`` all work from site-packages.
"""

from __future__ import annotations

import os

import pytest

USER_SUITE = """
import pytest
import torch

from pytest_backends import assert_close, assert_reproducible, reference


def test_leaks():
    torch.backends.cudnn.benchmark = True


def test_sees_the_default():
    assert torch.backends.cudnn.benchmark is False


@pytest.mark.backends("mkldnn")
def test_matrix(backend_config):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(16, 64)
    with torch.no_grad():
        assert_close(lin(x), reference(lin, x), op="matmul", k=64)
    assert backend_config.axes["mkldnn"] in ("on", "off")


def test_reproducible():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    assert_reproducible(model, torch.randn(4, 8, requires_grad=True), runs=3)


def test_which_recorder():
    from pytest_backends.determinism import digest
    from pytest_backends.determinism.record_native import native_module

    print("DIGEST", digest.backend(), "RECORDER", "native" if native_module() else "python")
"""


def test_user_suite_with_the_imported_package(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_SUITE)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-s",
        "--backends-matrix",
        "--backends-determinism=2",
        "--backends-determinism-all",
        f"--backends-census={pytester.path / 'census.json'}",
    )
    out = result.stdout.str()
    assert "INTERNALERROR" not in out, out[-3000:]
    result.assert_outcomes(passed=6, errors=1)
    assert "cudnn.benchmark: False -> True" in out
    assert "mkldnn-on        1" in out and "mkldnn-off       1" in out  # the matrix grid
    assert "6 test(s) checked, 0 not checked" in out  # each ran twice, bit for bit
    if os.environ.get("PYTEST_BACKENDS_EXPECT_INSTALLED"):
        # CI builds the harness from the installed package before the suite
        assert "DIGEST native RECORDER native" in out, out[-3000:]
