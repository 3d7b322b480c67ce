"""Cost of the backend matrix at collection time, and xdist speed-up on the examples.

1. Collection (``pytest --co -q``) of 200 tests marked
   ``@pytest.mark.backends("cudnn", "mkldnn", "nnpack", "deterministic")`` under
   ``--backends-matrix`` (200 x 16 = 3200 items), against the same 3200 items
   made by a plain ``@pytest.mark.parametrize("case", range(16))``.  Both
   files import torch, so the difference is the plugin's own work: binding
   markers, building configs, probing availability, stashing flags.
2. Wall time of ``pytest examples --backends-matrix --backends-verify`` with
   ``-n 0`` and with ``-n 2``.

Usage::

    python benchmarks/bench_collection.py [--repeat 3] [--out PATH]

Results go to stdout and to ``benchmarks/results/collection-cpu.txt``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import write_result

ROOT = Path(__file__).resolve().parents[1]
TESTS = 200

MARKED = """
import pytest
import torch

{tests}
"""
MARKED_TEST = """
@pytest.mark.backends("cudnn", "mkldnn", "nnpack", "deterministic")
def test_{i}(backend_config):
    assert backend_config.id
"""
PLAIN = """
import pytest
import torch

{tests}
"""
PLAIN_TEST = """
@pytest.mark.parametrize("case", range(16))
def test_{i}(case):
    assert case >= 0
"""


def _pytest(args: list[str], cwd: Path) -> tuple[float, float | None, str]:
    """(wall seconds, pytest's own "in X s" figure, output) of one pytest run."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    out = proc.stdout + proc.stderr
    if proc.returncode not in (0, 5):
        raise RuntimeError(f"pytest {' '.join(args)} failed ({proc.returncode}):\n{out[-3000:]}")
    match = re.search(r" in ([0-9.]+)s", out.splitlines()[-1] if out else "")
    return wall, float(match.group(1)) if match else None, out


def _count(out: str) -> int:
    match = re.search(r"(\d+) tests? collected", out)
    return int(match.group(1)) if match else -1


def bench_collection(repeat: int) -> list[str]:
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "marked").mkdir()
        (base / "plain").mkdir()
        (base / "marked" / "test_marked.py").write_text(
            MARKED.format(tests="".join(MARKED_TEST.format(i=i) for i in range(TESTS)))
        )
        (base / "plain" / "test_plain.py").write_text(
            PLAIN.format(tests="".join(PLAIN_TEST.format(i=i) for i in range(TESTS)))
        )
        cases = {
            "plain parametrize (16 ids)": (base / "plain", ["--co", "-q"]),
            "marked, no --backends-matrix": (base / "marked", ["--co", "-q"]),
            "marked, --backends-matrix (16 configs)": (
                base / "marked",
                ["--co", "-q", "--backends-matrix"],
            ),
        }
        results: dict[str, tuple[float, float, int]] = {}
        for name, (cwd, args) in cases.items():
            walls, inner, count = [], [], -1
            for _ in range(repeat):
                wall, own, out = _pytest(args, cwd)
                walls.append(wall)
                inner.append(own if own is not None else wall)
                count = _count(out)
            results[name] = (statistics.median(walls), statistics.median(inner), count)
        lines.append(f"# collection: {TESTS} tests, median of {repeat} runs (pytest --co -q)")
        lines.append(f"{'case':42} {'items':>6} {'wall s':>8} {'pytest s':>9} {'us/item':>8}")
        for name, (wall, own, count) in results.items():
            per_item = own / max(count, 1) * 1e6
            lines.append(f"{name:42} {count:>6} {wall:>8.2f} {own:>9.2f} {per_item:>8.0f}")
        plain = results["plain parametrize (16 ids)"][1]
        matrix = results["marked, --backends-matrix (16 configs)"][1]
        lines.append(
            f"# matrix collection overhead vs plain parametrize: {matrix - plain:+.2f} s "
            f"({matrix / plain:.2f}x)"
        )
    return lines


def bench_examples(repeat: int) -> list[str]:
    lines = [
        f"# examples/: pytest examples --backends-matrix --backends-verify, median of {repeat} runs"
    ]
    results = {}
    for workers in ("0", "2"):
        walls = []
        for _ in range(repeat):
            wall, _own, out = _pytest(
                ["examples", "-q", "--backends-matrix", "--backends-verify", "-n", workers],
                ROOT,
            )
            walls.append(wall)
        results[workers] = statistics.median(walls)
        summary = [line for line in out.splitlines() if " in " in line][-1:]
        lines.append(f"-n {workers}: {results[workers]:6.2f} s wall   {' '.join(summary)}")
    lines.append(f"# -n 2 speed-up: {results['0'] / results['2']:.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "collection-cpu.txt"
    )
    args = parser.parse_args()
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = (
        f"# backends matrix collection: torch {torch.__version__}, {platform.machine()}, "
        f"cpus={os.cpu_count()}, load={load:.1f}"
    )
    lines = [header, *bench_collection(args.repeat), "", *bench_examples(args.repeat)]
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
