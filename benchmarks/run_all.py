"""Run every benchmark and write its figures to benchmarks/results/ (``make bench``).

Each benchmark measures ratios side by side in one run; see the module
docstring of each script. ``--quick`` runs smaller sizes for a smoke check.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"


def benchmarks(quick: bool) -> list[tuple[str, list[str]]]:
    """(name, argv) for each benchmark, writing into ``benchmarks/results``."""
    trials = "200" if quick else "1000"
    return [
        (
            "overhead",
            [
                "overhead.py",
                "--repeats",
                "2" if quick else "5",
                "--out",
                str(RESULTS / "overhead-cpu.txt"),
            ],
        ),
        (
            "idle-instructions",
            ["bench_idle_instructions.py", "--out", str(RESULTS / "idle-instructions-cpu.txt")],
        ),
        (
            "collection",
            [
                "bench_collection.py",
                "--repeat",
                "1" if quick else "3",
                "--out",
                str(RESULTS / "collection-cpu.txt"),
            ],
        ),
        ("paths", ["bench_paths.py", "--out", str(RESULTS / "paths-cpu.txt")]),
        ("digest", ["bench_digest.py", "--out", str(RESULTS / "digest-cpu.txt")]),
        ("repeat", ["bench_repeat.py", "--out", str(RESULTS / "repeat-cpu.txt")]),
        ("reproducible", ["bench_reproducible.py", "--out", str(RESULTS / "reproducible-cpu.txt")]),
        (
            "suite-determinism",
            [
                "bench_suite_determinism.py",
                "--repeat",
                "1" if quick else "3",
                "--out",
                str(RESULTS / "suite-determinism-cpu.txt"),
            ],
        ),
        (
            "train-step",
            [
                "bench_train_step.py",
                "--rounds",
                "1" if quick else "3",
                "--out",
                str(RESULTS / "train-step-cpu.txt"),
            ],
        ),
        ("hook-floor", ["bench_hook_floor.py", "--out", str(RESULTS / "hook-floor-cpu.txt")]),
        (
            "batch-check",
            [
                "bench_batch_check.py",
                "--out",
                str(RESULTS / "batch-check-cpu.txt"),
            ],
        ),
        (
            "corpora",
            [
                "bench_corpora.py",
                "--seeds",
                "1" if quick else "3",
                "--out",
                str(RESULTS / "corpora-cpu.txt"),
            ],
        ),
        ("capability", ["bench_capability.py"]),
        (
            "calibration",
            [
                "calibrate_tolerance.py",
                "--trials",
                trials,
                "--out",
                str(RESULTS / "calibration-cpu.txt"),
            ],
        ),
        (
            "leak-soak",
            [
                "leak_soak.py",
                "--seeds",
                "3" if quick else "20",
                "--out",
                str(RESULTS / "leak-soak.txt"),
            ],
        ),
        (
            "fuzz",
            [
                "fuzz_inputs.py",
                "--sessions",
                "6" if quick else "45",
                "--out",
                str(RESULTS / "fuzz-cpu.txt"),
            ],
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("only", nargs="*", help="names of benchmarks to run (default: all)")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    failed = []
    for name, argv in benchmarks(args.quick):
        if args.only and name not in args.only:
            continue
        print(f"=== {name}", flush=True)
        start = time.perf_counter()
        env = dict(os.environ)
        deps = os.environ.get("PYTEST_BACKENDS_BENCH_DEPS")
        if name == "reproducible" and deps:
            # pytest-torch, the comparison point, lives outside the venv
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [deps, env.get("PYTHONPATH")]))
        code = subprocess.call(
            [sys.executable, str(ROOT / argv[0]), *argv[1:]], cwd=ROOT.parent, env=env
        )
        print(f"=== {name}: exit {code} in {time.perf_counter() - start:.0f} s", flush=True)
        if code:
            failed.append(name)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
