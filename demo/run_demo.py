"""Run the demo suite with pytest-backends and explain what the output shows.

The suite (``demo/test_model.py``) has two tests that fail on purpose: one
leaves a torch backend flag changed, one calls an op that is not
reproducible.  This script runs it the way a CI job would, then checks that
the plugin reported exactly those problems and nothing else.  It exits 0 when
the plugin behaved as documented, and 1 (saying what differed) when it did
not: the demo's own failures are the point, not a reason to fail.

    python demo/run_demo.py [output directory]
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent

INTRO = """\
pytest-backends demo
====================
A small conv/norm/linear model, tested five ways (demo/test_model.py):
  test_block_matches_float64   marked @pytest.mark.backends("mkldnn", "deterministic"):
                               --backends-matrix runs it once per configuration, and
                               assert_close() takes its bound from the flags of each one
  test_training_step_...       assert_reproducible(): forward and backward, bit for bit
  test_uses_the_jittery_op     calls demo::jitter, an op that is not reproducible (the
                               stand-in for a nondeterministic kernel); it passes on its own
  test_leaves_onednn_off       sets torch.backends.mkldnn.enabled = False and never restores it
  test_runs_after_the_leak     expects torch's defaults
The run below uses --backends-matrix, --backends-determinism=3 --backends-determinism-all
(every test runs three times; each op's results are compared bit for bit) and writes a
census, a JSON report and an HTML grid.
"""


def run(out: Path) -> int:
    """Run the demo suite, writing its files into ``out`` (an absolute path)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(HERE),
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(HERE),
        "--backends-matrix",
        "--backends-determinism=3",
        "--backends-determinism-all",
        f"--backends-census={out / 'census.json'}",
        f"--backends-report={out / 'report.json'}",
        f"--backends-html={out / 'report.html'}",
        f"--junitxml={out / 'junit.xml'}",
        "-rfE",
    ]
    print(INTRO)
    print("$", " ".join(command[2:]), flush=True)
    return subprocess.run(command, cwd=HERE, check=False).returncode


def _cases(junit: Path) -> dict[str, ET.Element]:
    root = ET.parse(junit).getroot()
    return {
        f"{case.get('name')}": case
        for case in root.iter("testcase")
        if case.get("name") is not None
    }


def _text(case: ET.Element, tag: str) -> str:
    return " ".join(
        (child.get("message") or "") + " " + (child.text or "") for child in case.iter(tag)
    )


def _outcomes(case: ET.Element) -> list[str]:
    """The failure, error and skip elements of a test case (its properties are not outcomes)."""
    return [child.tag for child in case if child.tag in ("failure", "error", "skipped")]


def check(code: int, out: Path) -> list[tuple[bool, str]]:
    """Each expectation of the demo and whether the run met it."""
    cases = _cases(out / "junit.xml")
    report = json.loads((out / "report.json").read_text())
    census = json.loads((out / "census.json").read_text())
    jitter = [e for e in census["entries"] if e["op"] == "demo::jitter"]
    matrix = [t for t in report["tests"] if t["test"].endswith("test_block_matches_float64")]
    leak = cases.get("test_leaves_onednn_off")
    noisy = cases.get("test_uses_the_jittery_op")
    plain = ("test_training_step_is_reproducible", "test_runs_after_the_leak")
    return [
        (code == 1, f"pytest exited 1 (tests failed), not with an internal or usage error: {code}"),
        (
            leak is not None and "mkldnn.enabled: True -> False" in _text(leak, "error"),
            "the leak is an error at teardown of test_leaves_onednn_off, naming the flag",
        ),
        (
            all(n in cases and not _outcomes(cases[n]) for n in plain),
            "the test after the leak passed (the flag was restored), and so did "
            "assert_reproducible",
        ),
        (
            noisy is not None
            and "nondeterministic op demo::jitter" in _text(noisy, "failure")
            and "test_model.py:" in _text(noisy, "failure"),
            "test_uses_the_jittery_op failed under the check, naming demo::jitter and its line",
        ),
        (
            len(jitter) == 1 and jitter[0]["verdict"] == "nondeterministic",
            "the census lists demo::jitter as nondeterministic (a baseline would gate on it)",
        ),
        (
            len({t["config"] for t in matrix}) >= 2
            and all(t["outcome"] in ("passed", "skipped") for t in matrix)
            and any(t["outcome"] == "passed" for t in matrix),
            f"the marked test ran in {len(matrix)} configurations and passed wherever it ran",
        ),
    ]


def main(argv: list[str]) -> int:
    # pytest runs with cwd=demo/: a relative path given here means the caller's directory
    out = Path(argv[1]).resolve() if len(argv) > 1 else HERE.parent / "demo-output"
    code = run(out)
    print("\nWhat the run above shows")
    print("------------------------")
    results = check(code, out)
    for ok, line in results:
        print(f"  [{'ok' if ok else 'UNEXPECTED'}] {line}")
    print(
        f"\nFiles: {out / 'report.html'} (the config x outcome grid), {out / 'report.json'}, "
        f"{out / 'census.json'} (commit it as a baseline with "
        "`pytest-backends baseline --census census.json baseline.json`)"
    )
    if all(ok for ok, _ in results):
        print("The plugin reported exactly the two planted problems: demo OK.")
        return 0
    print("The plugin did not behave as documented (see UNEXPECTED above).")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
