"""Run test paths under pytest-randomly with many seeds; expect no leaks, same outcomes.

    python benchmarks/random_orders.py --seeds 20 tests examples -- -n 2

Each seed is a separate pytest process (``-p randomly --randomly-seed=S``).
Per-test outcomes come from JUnit XML; leak reports are counted from the
output. The script exits non-zero if any seed reports a leak or if the
outcomes differ between seeds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

LEAK_MARKERS = (
    "left torch backend flags changed",
    "changed between tests",
    "did not restore them",
    "changed torch backend flags while it was imported",
    "changed while no test was running",
)


def outcomes_from_junit(path: Path) -> dict[str, str]:
    """``{classname::name: outcome}`` from a JUnit XML file."""
    result: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        tags = sorted({c.tag for c in case if c.tag in ("failure", "error", "skipped")})
        outcome = "+".join(tags) or "passed"
        result[key] = outcome
    return result


def run_seed(seed: int, paths: list[str], extra: list[str]) -> tuple[dict[str, str], int, str]:
    """Run one seed; return outcomes, the number of leak reports and the summary line."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "randomly",
                f"--randomly-seed={seed}",
                "-p",
                "no:cacheprovider",
                "-q",
                f"--junitxml={junit}",
                *extra,
                *paths,
            ],
            capture_output=True,
            text=True,
        )
        output = proc.stdout + proc.stderr
        leaks = sum(output.count(marker) for marker in LEAK_MARKERS)
        summary = output.strip().splitlines()[-1] if output.strip() else ""
        return outcomes_from_junit(junit), leaks, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after "--" goes to pytest
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    reference: dict[str, str] | None = None
    lines: list[str] = []
    total_leaks = 0
    printed: set[str] = set()
    differing: set[str] = set()
    for seed in seeds:
        outcomes, leaks, summary = run_seed(seed, args.paths, extra)
        total_leaks += leaks
        if reference is None:
            reference = outcomes
        else:
            differing |= {
                k for k in reference.keys() | outcomes.keys() if reference.get(k) != outcomes.get(k)
            }
        lines.append(f"seed {seed:>3}: {len(outcomes)} tests, {leaks} leak reports | {summary}")
        lines.extend(
            f"    {outcome}: {name}"
            for name, outcome in sorted(outcomes.items())
            if outcome not in ("passed", "skipped")
        )
        print(
            "\n".join(
                line for line in lines if line.startswith(("seed", "    ")) and line not in printed
            ),
            flush=True,
        )
        printed.update(lines)
    verdict = (
        f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]}) over {' '.join(args.paths)}: "
        f"{total_leaks} leak reports, {len(differing)} tests with differing outcomes"
    )
    lines.append(verdict)
    if differing:
        lines.extend(f"  differs: {name}" for name in sorted(differing))
    print(verdict)
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    return 1 if total_leaks or differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
