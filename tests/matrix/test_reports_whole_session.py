"""The JSON and HTML reports count and list every problem of the run, not only matrix items.

One session has a leak error at teardown of an unmarked test, an unmarked
test's failure and a matrix item's failure: the reports' ``session`` counts
equal pytest's closing line, all three are listed, the page is not green, and
``pytest-backends merge`` keeps them (in either argument order). A run
stopped by Ctrl-C shows the interrupted item as interrupted, never passed.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_backends.matrix.merge import merge_reports

pytest_plugins = ["pytester"]

SUITE = """
import pytest, torch

def test_leaks():
    torch.backends.cudnn.benchmark = True

def test_unmarked_fails():
    assert 1 == 2, "unmarked failure"

def test_unmarked_passes():
    pass

@pytest.mark.backends("mkldnn")
def test_matrix(backend_config):
    assert torch.backends.mkldnn.enabled, "matrix failure"
"""

INTERRUPTED = """
import pytest

@pytest.mark.backends("mkldnn")
def test_a(backend_config):
    pass

@pytest.mark.backends("mkldnn")
def test_b(backend_config):
    if "off" in backend_config.id:
        raise KeyboardInterrupt
"""


class _Page(HTMLParser):
    """The run line's text and the failure list's rows of an HTML report."""

    def __init__(self) -> None:
        super().__init__()
        self.run = ""
        self.failures: list[list[str]] = []
        self._in_run = False
        self._in_failures = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "p" and a.get("id") == "run":
            self._in_run = True
            self.run_class = a.get("class") or ""
        if tag == "table" and "failures" in (a.get("class") or ""):
            self._in_failures = True
        if self._in_failures and tag == "tr":
            self.failures.append([])
        if self._in_failures and tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self._in_run = False
        if tag == "table":
            self._in_failures = False
        if tag == "td" and self._cell is not None:
            self.failures[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._in_run:
            self.run += data
        if self._cell is not None:
            self._cell.append(data)


def _closing_counts(stdout: str) -> dict[str, int]:
    line = [x for x in stdout.splitlines() if re.search(r"=+ .* in [\d.]+s", x)][-1]
    found = re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", line)
    return {("error" if k.startswith("error") else k): int(n) for n, k in found}


def _page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_reports_count_and_list_every_problem_and_merge_keeps_them(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--backends-matrix",
        "--backends-report=a.json",
        "--backends-html=a.html",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    pytest_counts = _closing_counts(result.stdout.str())
    assert pytest_counts == {"failed": 2, "passed": 3, "error": 1}

    report = json.loads((pytester.path / "a.json").read_text(encoding="utf-8"))
    session = report["session"]
    assert session["exitstatus"] == 1 and session["interrupted"] is False
    assert {k: n for k, n in session["outcomes"].items() if n} == pytest_counts
    listed = {(p["nodeid"], p["when"], p["outcome"]) for p in session["problems"]}
    assert listed == {
        ("test_suite.py::test_leaks", "teardown", "error"),
        ("test_suite.py::test_unmarked_fails", "call", "failed"),
        ("test_suite.py::test_matrix[mkldnn-off]", "call", "failed"),
    }
    assert (
        "cudnn.benchmark"
        in next(p for p in session["problems"] if p["when"] == "teardown")["detail"]
    )

    page = _page(pytester.path / "a.html")
    assert "bad" in page.run_class and "exit status 1" in page.run
    assert "2 failed" in page.run and "1 error" in page.run
    rows = [r for r in page.failures if r]
    assert {r[0] for r in rows} == {
        "test_suite.py::test_leaks",
        "test_suite.py::test_unmarked_fails",
        "test_suite.py::test_matrix",
    }
    assert "Failures (3)" in (pytester.path / "a.html").read_text(encoding="utf-8")

    # A second job: the same suite with the leak fixed and the matrix passing.
    (pytester.path / "b.json").write_text(
        json.dumps(
            {
                **report,
                "label": "other",
                "run": "another run",
                "session": {
                    "exitstatus": 0,
                    "interrupted": False,
                    "outcomes": {"passed": 4},
                    "problems": [],
                },
            }
        ),
        encoding="utf-8",
    )
    one = merge_reports([pytester.path / "a.json", pytester.path / "b.json"])
    other = merge_reports([pytester.path / "b.json", pytester.path / "a.json"])
    for merged in (one, other):
        assert merged.session is not None
        assert merged.session.exitstatus == 1
        assert merged.session.outcomes == {"passed": 7, "failed": 2, "error": 1}
        assert {(p["nodeid"], p["source"]) for p in merged.session.problems} == {
            (nodeid, report["label"]) for nodeid, _, _ in listed
        }
        again = json.loads(merged.to_json())["session"]
        assert len(again["problems"]) == 3
        html = merged.to_html()
        assert "Failures (3)" in html and 'class="run bad"' in html
        assert "(above)" not in html and "below" in html
    assert one.session == other.session


def test_an_interrupted_item_is_interrupted_never_passed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_stop=INTERRUPTED)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--backends-matrix",
        "--backends-report=r.json",
        "--backends-html=r.html",
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    outcomes = {t["nodeid"]: t["outcome"] for t in report["tests"]}
    assert outcomes["test_stop.py::test_b[mkldnn-off]"] == "interrupted"
    assert list(outcomes.values()).count("passed") == _closing_counts(result.stdout.str()).get(
        "passed", 0
    )
    assert report["session"]["interrupted"] is True
    assert report["session"]["exitstatus"] == 2
    assert report["grid_totals"]["interrupted"] == 1
    assert {k: n for k, n in report["totals"].items() if n} == _closing_counts(result.stdout.str())
    page = _page(pytester.path / "r.html")
    assert "interrupted" in page.run and "bad" in page.run_class
    assert any("test_stop.py::test_b" in r[0] and "interrupted" in r for r in page.failures if r)


def test_the_run_says_which_option_won_and_names_every_file_written(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_plain="""
        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--backends-determinism=off",
        "--backends-determinism-all",
        "--backends-report=r.json",
    )
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    assert "--backends-determinism=off wins over --backends-determinism-all" in out
    assert "the determinism check is off" in out
    report = pytester.path / "r.json"
    assert report.exists()
    assert f"report written to {report}" in out
    assert json.loads(report.read_text(encoding="utf-8"))["session"]["outcomes"] == {"passed": 1}


SLEEPER = """
import os, time
import pytest

@pytest.mark.backends("mkldnn")
def test_quick(backend_config):
    pass

@pytest.mark.backends("mkldnn")
def test_sleeps(backend_config):
    if "off" in backend_config.id:
        with open(os.environ["SLEEP_MARKER"], "w") as f:
            f.write("sleeping")
        time.sleep(60)
"""


def test_an_interrupted_item_is_interrupted_never_passed_under_xdist(
    pytester: pytest.Pytester,
) -> None:
    """Ctrl-C (SIGINT to the controller) under ``-n 2`` while an item runs on a worker."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("xdist")
    pytester.makepyfile(test_stop=SLEEPER)
    marker = pytester.path / "sleeping"
    env = {**os.environ, "SLEEP_MARKER": str(marker)}
    args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-n", "2", "--backends-matrix"]
    # A process started in the background by a shell without job control (CI launched
    # with `(cmd &)`) inherits SIGINT ignored, and Python then never turns it into
    # KeyboardInterrupt: the controller takes Ctrl-C as a terminal gives it.
    main = (
        "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.exit(pytest.main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", main, *args, "--backends-report=r.json"],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the sleeping test never started"
            time.sleep(0.05)
        # The controller learns that the item started from the worker's event, which
        # a loaded machine may deliver a while after the worker wrote the marker.
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            # The run went on as if the first Ctrl-C had not arrived: a user presses it
            # again; so does the test.
            proc.send_signal(signal.SIGINT)
            out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    outcomes = {t["nodeid"]: t["outcome"] for t in report["tests"]}
    assert outcomes.get("test_stop.py::test_sleeps[mkldnn-off]") == "interrupted", (outcomes, out)
    assert list(outcomes.values()).count("passed") == _closing_counts(out).get("passed", 0), (
        outcomes,
        out,
    )
    assert report["session"]["interrupted"] is True
    assert report["session"]["exitstatus"] == 2


FIXTURE_LEAK = """
import pytest, torch

@pytest.fixture(scope="module")
def module_fixture():
    torch.backends.mkldnn.enabled = False
    yield

def test_uses_it(module_fixture):
    pass
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in process", "xdist"])
def test_a_run_failed_outside_any_test_lists_why(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    """Every test passes, but a module fixture's leak fails the run: the reports say so."""
    pytester.makepyfile(test_fixture=FIXTURE_LEAK)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", *workers, "--backends-report=r.json", "--backends-html=r.html"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    session = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))["session"]
    assert session["outcomes"] == {"passed": 1}
    [problem] = session["problems"]
    assert problem["nodeid"] == "(session)" and problem["when"] == "session"
    assert "torch backend flags leaked by fixtures" in problem["message"]
    assert "module_fixture" in problem["message"] and "mkldnn.enabled" in problem["detail"]
    page = _page(pytester.path / "r.html")
    assert "bad" in page.run_class
    assert any("module_fixture" in " ".join(row) for row in page.failures), page.failures
    merged = merge_reports([pytester.path / "r.json"])
    assert merged.session is not None and len(merged.session.problems) == 1


def test_a_narrowed_run_counts_its_deselected_items_as_pytest_does(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--backends-config=mkldnn-on",
        "-k",
        "not leaks",
        "--backends-report=r.json",
        "--backends-html=r.html",
    )
    # -k drops test_leaks, --backends-config drops test_matrix[mkldnn-off]
    counts = result.parseoutcomes()
    assert counts == {"failed": 1, "passed": 2, "deselected": 2}, counts
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    assert report["session"]["outcomes"] == counts
    assert report["totals"] == counts
    page = _page(pytester.path / "r.html")
    assert "1 failed, 2 passed, 2 deselected" in page.run, page.run


FLAKY = """
import pathlib

import pytest


@pytest.mark.backends("mkldnn")
def test_flaky(backend_config):
    marker = pathlib.Path("ran-" + backend_config.id)
    if not marker.exists():
        marker.write_text("x")
        raise AssertionError("fails on its first try")
"""


def test_reruns_are_counted_as_pytest_counts_them(pytester: pytest.Pytester) -> None:
    """A test that passed only on a rerun is not reported as a plain pass."""
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(test_flaky=FLAKY)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--backends-matrix",
        "--reruns=1",
        "--backends-report=r.json",
        "--backends-html=r.html",
    )
    counts = result.parseoutcomes()
    assert counts == {"passed": 2, "rerun": 2}, counts
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    assert report["session"]["outcomes"] == counts
    assert report["totals"] == counts
    assert "2 passed, 2 rerun" in _page(pytester.path / "r.html").run


def test_a_module_that_fails_to_import_is_summed_up_by_its_exception(
    pytester: pytest.Pytester,
) -> None:
    """``SyntaxError: invalid syntax``, not the first traceback entry (pytest's own frame)."""
    pytester.makepyfile(test_bad="def test_x(:\n    pass\n", test_missing="import no_such_mod\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-report=r.json", "--backends-html=r.html"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    problems = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))["session"][
        "problems"
    ]
    messages = {p["nodeid"]: p["message"] for p in problems}
    assert messages["test_bad.py"].startswith("SyntaxError"), messages
    assert "no_such_mod" in messages["test_missing.py"], messages
    assert not any(": in " in m for m in messages.values()), messages
    page = _page(pytester.path / "r.html")
    assert any("SyntaxError" in " ".join(row) for row in page.failures), page.failures
    # pytest's own closing line, word for word: "2 errors", never "2 error".
    assert "2 errors" in result.stdout.lines[-1] and "2 errors" in page.run, page.run
