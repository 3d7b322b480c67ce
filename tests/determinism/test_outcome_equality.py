"""Ordinary user code keeps its outcomes under the determinism check, and planted ops are caught.

The corpus (``user_corpus.py``) runs plain, under ``--backends-determinism-all
--backends-determinism=3`` with the Python recorder, and the same under ``-n 2``
with the native one: the outcome counts are identical. With the planted
nondeterministic op added to every case (``PLANT=1``), each test that passes
plainly is either failed with the planted op blamed or reported "not checked"
with its reason in the census: none passes as checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_backends.determinism.record_native import native_module

CORPUS = Path(__file__).with_name("user_corpus.py")
CHECK = ("--backends-determinism-all", "--backends-determinism=3")


@pytest.fixture
def corpus(planted_conftest: pytest.Pytester) -> pytest.Pytester:
    planted_conftest.makepyfile(test_corpus=CORPUS.read_text(encoding="utf-8"))
    return planted_conftest


def _counts(result: pytest.RunResult) -> dict[str, int]:
    counts = result.parseoutcomes()
    counts.pop("warnings", None)
    counts.pop("warning", None)
    return counts


@pytest.mark.slow
def test_outcomes_equal_plain_checked_and_under_xdist(
    corpus: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One plain run; the Python recorder serially, the native one (where built) under xdist."""
    plain = _counts(corpus.runpytest_subprocess("-p", "no:xdist"))
    assert plain.get("failed") == 1 and plain.get("skipped") == 1 and plain.get("xfailed") == 1
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    checked = corpus.runpytest_subprocess("-p", "no:xdist", *CHECK)
    assert "nondeterministic op" not in checked.stdout.str()
    assert _counts(checked) == plain
    native = native_module() is not None
    if native:
        monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "auto")
    xdist = corpus.runpytest_subprocess("-n", "2", *CHECK)
    assert "nondeterministic op" not in xdist.stdout.str()
    assert _counts(xdist) == plain
    # The summary names the recorder the workers used.
    checked.stdout.fnmatch_lines(["recorder: Python*not native*"])
    xdist.stdout.fnmatch_lines(["recorder: native*" if native else "recorder: Python*not native*"])


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_a_planted_op_in_every_case_is_caught_or_not_checked(
    corpus: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if recorder == "python":
        monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    elif native_module() is None:
        pytest.skip("the native extension is not built here")
    monkeypatch.setenv("PLANT", "1")
    result = corpus.runpytest_subprocess(
        "-p", "no:xdist", "-rA", *CHECK, "--backends-census=census.json"
    )
    census = json.loads((corpus.path / "census.json").read_text(encoding="utf-8"))
    not_checked: dict[str, str] = census["not_checked"]
    lines = result.stdout.lines
    passed = [line.split()[1] for line in lines if line.startswith("PASSED ")]
    failed = {line.split()[1] for line in lines if line.startswith("FAILED ")}
    blamed = {
        nodeid
        for row in census["entries"]
        if row["op"] == "pbtest::noisy"
        for nodeid in row.get("nondeterministic_in", [])
    }
    assert len(blamed) >= 10, census["entries"]
    assert blamed <= failed
    for nodeid in passed:
        assert nodeid in not_checked, f"{nodeid} passed as checked with a planted op"
        assert not_checked[nodeid].strip(), nodeid
    assert "test_corpus.py::test_not_repeatable" in not_checked
