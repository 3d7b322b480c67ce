"""The determinism verdict on a generated corpus of ordinary test bodies, against its oracle.

Each example renders a test module of generated bodies (``generated_corpus.py``)
and runs it three times: once plainly under the op oracle (``oracle.py``, which
reruns every op alone on clones of its inputs), and once per recorder under
``--backends-determinism-all``. Every body's verdict must be one its steps
allow (:func:`generated_corpus.expected`), the two recorders must agree where
no thread races, and every blamed op must be one the oracle found
nondeterministic. ``DETERMINISM_CORPUS_EXAMPLES`` (default 2) sets the number
of modules; ``make bench`` runs more.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from generated_corpus import Body, bodies, expected, nodeid, render
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessions import RECORDERS, checked_session

from pytest_backends.determinism.record_native import native_module

EXAMPLES = int(os.environ.get("DETERMINISM_CORPUS_EXAMPLES", "2"))
# ``PYTEST_BACKENDS_CORPUS_SEEDED=1`` (with ``--hypothesis-seed``): other examples than CI's.
DERANDOMIZE = os.environ.get("PYTEST_BACKENDS_CORPUS_SEEDED") != "1"
PER_MODULE = 12
TALLY: Counter[str] = Counter()


def _oracle(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    here = Path(__file__).parent
    pytester.makepyfile(oracle=(here / "oracle.py").read_text(encoding="utf-8"))
    out = pytester.path / "oracle.json"
    with monkeypatch.context() as m:
        m.setenv("ORACLE_OUT", str(out))
        m.setenv("PYTHONPATH", str(pytester.path))
        pytester.runpytest_subprocess("-p", "no:xdist", "-p", "oracle", "--backends-leaks=off")
    return set(json.loads(out.read_text(encoding="utf-8")))


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    derandomize=DERANDOMIZE,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(st.lists(bodies(), min_size=PER_MODULE, max_size=PER_MODULE))
def test_generated_bodies_get_the_verdict_their_steps_allow(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cases: list[Body]
) -> None:
    if native_module() is None:
        pytest.skip("the native extension is not built here")
    pytest.importorskip("numpy")
    for old in planted_conftest.path.glob("*.json"):
        old.unlink()
    planted_conftest.makepyfile(test_generated=render(cases))
    oracle = _oracle(planted_conftest, monkeypatch)
    seen: dict[str, dict[str, str]] = {}
    wrong: list[str] = []
    for recorder in RECORDERS:
        result, found, blamed_ops, blamed_in = checked_session(
            planted_conftest, recorder, monkeypatch
        )
        seen[recorder] = found
        assert blamed_ops <= oracle, (recorder, blamed_ops - oracle, result.stdout.str()[-3000:])
        for i, body in enumerate(cases):
            test = nodeid(i, body)
            verdict = found.get(test, "missing")
            TALLY[f"{recorder} {verdict}"] += 1
            if verdict not in expected(body):
                wrong.append(f"{recorder} {test} {body.steps}: {verdict}")
            if test in blamed_in and not body.planted:
                wrong.append(f"{recorder} {test} {body.steps}: an op blamed")
    for i, body in enumerate(cases):
        test = nodeid(i, body)
        TALLY["bodies"] += 1
        TALLY["TestCase methods"] += body.testcase
        if "thread" not in body.steps and seen["python"].get(test) != seen["native"].get(test):
            wrong.append(
                f"{test} {body.steps}: python {seen['python'].get(test)}, "
                f"native {seen['native'].get(test)}"
            )
    TALLY["disagreements"] += len(wrong)
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_report_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints the corpus counts (after the property, in file order)."""
    with capsys.disabled():
        print(f"\ndeterminism generated corpus: {dict(TALLY)}")
    assert TALLY["disagreements"] == 0
