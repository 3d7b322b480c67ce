"""The idle plugin's cost per test in instructions: a figure the machine's load cannot move.

Process CPU time on a shared two-core machine moves by more than the few
percent this figure is about (``overhead.py`` shows run-to-run noise of a
third of a trivial test). Instructions do not: each session runs under
valgrind's callgrind, and a conftest (the same on both sides) zeroes the
counters when collection begins and dumps them when collection ends and when
the session finishes, through callgrind's client requests (a ten-line C
library built here with gcc). torch is imported before the counters start, so
what is counted is collection and the run loop, not interpreter start-up.
``PYTHONHASHSEED=0`` keeps dict and set layouts, and so the counts, the same
from run to run.

The suite is one parametrized test function of trivial torch tests (one flag
read), run with the plugin as installed (no option given: the idle guard) and
with ``-p no:backends``, at two suite sizes; the figure per test is the slope
between them, so fixed costs (the first fingerprint, the registry, the
summary) drop out. Extra variants (``--variant NAME=ARGS``) run the plugin
with parts of it blocked, to attribute the cost.

Usage::

    python benchmarks/bench_idle_instructions.py [--sizes 100 400]
        [--variant noguard="-p no:backends-isolation"]

Results go to stdout and ``benchmarks/results/idle-instructions-cpu.txt``.
Needs valgrind, its ``callgrind.h`` and gcc; says it is skipped where they are missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_machine import describe, write_result
from overhead import write_suite

OUT = Path(__file__).resolve().parent / "results" / "idle-instructions-cpu.txt"
GOAL = 1.03
HEADER = Path("/usr/include/valgrind/callgrind.h")

TOGGLE = r"""
#include <valgrind/callgrind.h>
void bench_zero(void) { CALLGRIND_ZERO_STATS; }
void bench_dump(const char* what) { CALLGRIND_DUMP_STATS_AT(what); }
"""

CONFTEST = """
import ctypes
import os

import pytest
import torch  # imported before the counters start, on both sides

_toggle = ctypes.CDLL(os.environ["BENCH_TOGGLE"])


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    _toggle.bench_zero()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    _toggle.bench_dump(b"collection")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    _toggle.bench_dump(b"run")
"""


def _suite(root: Path, size: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    write_suite(root, size, parametrized=True)  # overhead.py's suite, measured the same way
    (root / "conftest.py").write_text(CONFTEST)


def _counts(out: Path) -> dict[str, int]:
    """``{"collection": n, "run": n}`` from callgrind's dumps of one session."""
    found: dict[str, int] = {}
    for part in sorted(out.parent.glob(out.name + ".*")):
        text = part.read_text(errors="replace")
        what = re.search(r"^desc: Trigger: Client Request: (\w+)", text, re.M)
        total = re.search(r"^summary: (\d+)", text, re.M)
        if what and total:
            found[what.group(1)] = int(total.group(1))
    return found


def _session(root: Path, args: list[str], out: Path, toggle: Path) -> dict[str, int]:
    env = dict(os.environ, BENCH_TOGGLE=str(toggle), PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "pytest",
        "-q",
        *args,
    ]
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"session failed ({' '.join(args)}):\n{proc.stdout}{proc.stderr[-3000:]}")
    counts = _counts(out)
    if set(counts) != {"collection", "run"}:
        raise SystemExit(f"callgrind wrote no counts for {' '.join(args)}: {counts}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[100, 400])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    missing = [t for t in ("valgrind", "gcc") if shutil.which(t) is None]
    if missing or not HEADER.exists():
        print(f"skipped: needs valgrind, gcc and {HEADER}; missing {missing or [str(HEADER)]}")
        return
    sides: dict[str, list[str]] = {"bare (-p no:backends)": ["-p", "no:backends"], "plugin": []}
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        sides[f"plugin, {name}"] = shlex.split(extra)
    small, large = args.sizes
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "toggle.c").write_text(TOGGLE)
        toggle = root / "toggle.so"
        subprocess.run(
            ["gcc", "-O1", "-shared", "-fPIC", "-o", str(toggle), str(root / "toggle.c")],
            check=True,
        )
        jobs = []
        for size in (small, large):
            _suite(root / f"suite{size}", size)
            for k, (name, extra) in enumerate(sides.items()):
                jobs.append((name, size, root / f"suite{size}", extra, root / f"out{size}-{k}"))
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(lambda j: _session(j[2], j[3], j[4], toggle), jobs))
    counts = {(name, size): r for (name, size, *_), r in zip(jobs, results)}

    def per_test(name: str, phase: str) -> float:
        return (counts[name, large][phase] - counts[name, small][phase]) / (large - small)

    bare = "bare (-p no:backends)"
    base = per_test(bare, "collection") + per_test(bare, "run")
    lines = [
        "The idle plugin per test, in instructions (callgrind; collection and the run loop)",
        f"CPU: {describe(('avx2', 'avx512f', 'amx_tile'))}; Python {sys.version.split()[0]}",
        f"suite: one parametrized trivial torch test; slope between {small} and {large} tests; "
        f"PYTHONHASHSEED=0; goal <= {GOAL:.2f}x",
        "",
    ]
    for name in sides:
        c, r = per_test(name, "collection"), per_test(name, "run")
        extra = "" if name == bare else f" | +{c + r - base:,.0f} | {(c + r) / base:.3f}x"
        lines.append(
            f"  {name:34s} {c + r:>12,.0f} per test (collection {c:,.0f}, run {r:,.0f}){extra}"
        )
    ratio = (per_test("plugin", "collection") + per_test("plugin", "run")) / base
    lines.append(f"  goal (<= {GOAL:.2f}x a bare test): {'met' if ratio <= GOAL else 'not met'}")
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
