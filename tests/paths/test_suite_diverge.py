"""``--backends-diverge``: a matrix test failing under one configuration names where paths part."""

from __future__ import annotations

import json

import pytest
import torch

pytest_plugins = ["pytester"]

SUITE = """
import pytest, torch

@torch.library.custom_op("suite_tests::bump", mutates_args=())
def bump(x: torch.Tensor) -> torch.Tensor:
    return x + (1e-2 if torch.backends.mkldnn.enabled else 0.0)

@pytest.mark.backends("mkldnn")
def test_model():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    y = bump(torch.relu(conv(x)))  # PLANTED
    expected = torch.relu(conv(x))
    torch.testing.assert_close(y, expected)

@pytest.mark.backends("mkldnn")
def test_fine():
    assert torch.ones(2).sum() == 2
"""


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
@pytest.mark.parametrize("recorder", ["none", "python", "native"])
def test_failing_config_names_the_op_in_failure_and_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, recorder: str
) -> None:
    """Also while the determinism check records every op, with either recorder."""
    determinism: tuple[str, ...] = ()
    if recorder != "none":
        from pytest_backends import _native

        if recorder == "native":
            if _native.load() is None:
                pytest.skip("the native harness is not built here")
            monkeypatch.setenv("PYTEST_BACKENDS_CACHE_DIR", str(_native._cache_root()))
        monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "auto" if recorder == "native" else "off")
        determinism = ("--backends-determinism=2", "--backends-determinism-all")
    path = pytester.makepyfile(test_suite=SUITE)
    planted = next(i for i, s in enumerate(SUITE.splitlines()[1:], 1) if s.endswith("# PLANTED"))
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--backends-matrix",
        "--backends-diverge",
        "--backends-report=r.json",
        *determinism,
    )
    result.assert_outcomes(passed=3, failed=1)
    if recorder != "none":
        result.stdout.fnmatch_lines(
            [f"recorder: {'native' if recorder == 'native' else 'Python'} *"]
        )
    out = result.stdout.str()
    assert f"the paths part at suite_tests::bump ({path}:{planted}, module <no module>)" in out
    assert "tolerance certificate" in out
    report = json.loads((pytester.path / "r.json").read_text())
    text = json.dumps(report)
    assert "the paths part at suite_tests::bump" in text
    assert "INTERNALERROR" not in out


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_a_failure_without_ops_is_not_called_a_numeric_difference(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_flags="""
        import pytest, torch

        @pytest.mark.backends("mkldnn")
        def test_flag_only():
            assert torch.backends.mkldnn.enabled

        @pytest.mark.backends("mkldnn")
        def test_close_enough():
            x = torch.randn(4, 4)
            y = torch.relu(x)
            assert torch.backends.mkldnn.enabled or y.sum() < -1
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-matrix", "--backends-diverge"
    )
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "no torch op ran under mkldnn-on (passes) or mkldnn-off (fails)" in out, out
    # test_close_enough: ``or`` ran more ops on the failing path, a branch on the flag.
    assert "ran under mkldnn-off only: the paths ran different ops" in out, out
    assert "the difference built up across ops\n" not in out


INTEGER = """
import pytest, torch

@torch.library.custom_op("diverge_tests::shift", mutates_args=())
def shift(x: torch.Tensor) -> torch.Tensor:
    return x + 1 if torch.backends.mkldnn.enabled else x.clone()

@pytest.mark.backends("mkldnn")
def test_int():
    x = (torch.arange(128) % 7).long()
    assert int(shift(x).sum()) == int(x.sum())  # PLANTED
"""


def test_an_integer_op_that_parts_is_named_in_process_and_offline(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "every op agrees": an integer output is compared exactly, with real figures."""
    from pytest_backends.__main__ import main

    pytester.makepyfile(test_int=INTEGER)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-matrix", "--backends-diverge", "--backends-trace=tr"
    )
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "the paths part at diverge_tests::shift" in out, out
    assert "agrees within its bound" not in out, out
    traces = sorted((pytester.path / "tr").iterdir())
    assert len(traces) == 2
    assert main(["diverge", *(str(next(t.glob("*.jsonl"))) for t in traces)]) == 1
    offline = capsys.readouterr().out
    assert "the paths part at diverge_tests::shift" in offline, offline
    assert ">= 32 of 128 elements differ" in offline, offline  # a count, not a rel error
    assert "max abs >= 1," in offline and "inf" not in offline.split("\n")[0], offline
