"""Options that do nothing say so; runs that ran nothing fail under --backends-strict."""

from __future__ import annotations

import pytest

# Imported before any pytester snapshot (pytester unloads modules first imported in a test).
import torch

from pytest_backends.capability import levels

SUITE = """
import pytest
import torch


@pytest.mark.backends("mkldnn")
def test_conv():
    assert torch.ones(2).sum() == 2


@pytest.mark.backends(device=["cuda"])
def test_cuda_only(backend_config):
    assert torch.ones(2, device=backend_config.device).sum() == 2


def test_unmarked():
    pass
"""

COMMON = ("-p", "no:randomly", "-p", "no:cacheprovider")


def test_sampling_without_the_matrix_warns_and_fails_strict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(*COMMON, "--backends-sample=2", "-k", "conv")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*PytestConfigWarning: --backends-sample does nothing without the matrix*"]
    )
    result = pytester.runpytest_subprocess(
        *COMMON, "--backends-sample=2", "--backends-strict", "-k", "conv"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--backends-sample does nothing without the matrix*"])
    # With the matrix, sampling acts and nothing is said.
    result = pytester.runpytest_subprocess(
        *COMMON, "--backends-sample=1", "--backends-matrix", "-k", "conv"
    )
    result.assert_outcomes(passed=1)
    assert "does nothing" not in result.stdout.str()


def test_tx_beside_n_warns(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(*COMMON, "-n", "2", "--tx", "popen", "-k", "unmarked")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*PytestConfigWarning: --tx popen is ignored: -n starts*"])
    result = pytester.runpytest_subprocess(
        *COMMON, "-n", "2", "--tx=popen", "--backends-strict", "-k", "unmarked"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tx popen is ignored*(--backends-strict)*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_every_selected_config_skipped_fails_strict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    args = (*COMMON, "--backends-config=device-cuda", "-k", "cuda_only")
    lenient = pytester.runpytest_subprocess(*args)
    assert lenient.ret == 0
    lenient.assert_outcomes(skipped=1)
    lenient.stdout.fnmatch_lines(
        [
            "--backends-config (device-cuda) ran no test: every item it selected was skipped "
            "(1 item(s)): device-cuda needs CUDA*"
        ]
    )
    strict = pytester.runpytest_subprocess(*args, "--backends-strict")
    assert strict.ret == pytest.ExitCode.USAGE_ERROR
    strict.stdout.fnmatch_lines(["*ran no test: every item it selected was skipped*"])


def test_a_level_this_cpu_lacks_fails_strict(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Remove AVX2 and AVX512 from the CPU features the plugin sees (the CPU itself may
    # have them): the avx2 level then has no worker and every item of it is skipped.
    monkeypatch.setenv(levels.FAKE_FEATURES_ENV, "-avx2,-avx512f")
    pytester.makepyfile(test_suite=SUITE)
    args = (*COMMON, "--backends-cpu-capability=avx2", "-k", "unmarked")
    result = pytester.runpytest_subprocess(*args, "--backends-strict")
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        ["CPU capability level avx2 ran no test: every item it selected was skipped (1 item(s))*"]
    )
