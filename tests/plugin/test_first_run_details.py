"""Small things a first run meets: what an option combination did is always said."""

from __future__ import annotations

import json

import pytest


def test_a_census_of_batch_invariant_tests_only_selected_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")  # no native build for this
    pytester.makepyfile(
        test_batch="""
        import pytest, torch
        from pytest_backends import assert_batch_invariant

        @pytest.mark.batch_invariant
        def test_softmax():
            assert_batch_invariant(lambda t: t.softmax(-1), torch.randn(8, 4))
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-strict", "--backends-census=census.json"
    )
    out = result.stdout.str()
    # The batch section of the census is what this run selected tests for.
    assert result.ret == pytest.ExitCode.OK, out
    assert "selected no test" not in out
    data = json.loads((pytester.path / "census.json").read_text(encoding="utf-8"))
    assert data["batch_invariance"]["entries"], data
