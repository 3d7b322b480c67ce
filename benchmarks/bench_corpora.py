"""The verdicts' generated corpora, run larger than CI runs them, with their counts.

Each corpus is a property test of the suite, run here with other examples than
CI's (``PYTEST_BACKENDS_CORPUS_SEEDED=1`` and ``--hypothesis-seed``), once per
seed:

* batch invariance (``tests/batch/test_batch_oracle_corpus.py``): generated
  functions, the check against the brute-force oracle over the slices it takes
  (disagreements must be 0), the cases variant only at offsets it does not
  take (the sampling's misses), and every blamed op replayed;
* determinism (``tests/determinism/test_generated_corpus.py``): generated test
  bodies under both recorders, each verdict one its steps allow, blamed ops
  only where the op oracle finds them;
* kernel paths (``tests/paths/test_oracle_corpus.py``): generated op chains
  run with oneDNN on and off, the blamed op against an oracle that replays
  every op on both paths (disagreements must be 0);
* call paths (``tests/paths/test_call_paths.py``): generated programs whose
  helper calls or flag-made tensors differ between the paths, the op named
  against where the program itself branches (disagreements must be 0).

Usage::

    python benchmarks/bench_corpora.py [--seeds 3] [--first-seed 1] [--batch 600]
        [--determinism 6] [--paths 100] [--call-paths 300] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_machine import describe, write_result

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results" / "corpora-cpu.txt"
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
CORPORA = {
    "batch": ("tests/batch/test_batch_oracle_corpus.py", "PYTEST_BACKENDS_BATCH_CORPUS"),
    "determinism": (
        "tests/determinism/test_generated_corpus.py",
        "DETERMINISM_CORPUS_EXAMPLES",
    ),
    "paths": ("tests/paths/test_oracle_corpus.py", "PATHS_CORPUS_EXAMPLES"),
    "call paths": ("tests/paths/test_call_paths.py", "PATHS_CORPUS_EXAMPLES"),
}


def run(name: str, examples: int, seed: int) -> str:
    path, variable = CORPORA[name]
    env = dict(os.environ, PYTEST_BACKENDS_CORPUS_SEEDED="1", **{variable: str(examples)})
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "-s",
            f"--hypothesis-seed={seed}",
            path,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    counts = next(
        (line for line in done.stdout.splitlines() if "corpus:" in line),
        "no counts printed: " + done.stdout[-2000:],
    )
    line = (
        f"  {name}, seed {seed}, {examples} examples: exit {done.returncode}, "
        f"{time.perf_counter() - start:.0f} s wall\n    {counts.strip()}"
    )
    if done.returncode != 0:  # what failed, for the result file: a failure may not come back
        failed = [
            text
            for text in done.stdout.splitlines()
            if text.lstrip(" |+").startswith(("E ", "FAILED", "AssertionError"))
            or "Falsifying" in text
        ]
        line += "".join(f"\n      {text}" for text in failed[-40:])
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=600)
    parser.add_argument("--determinism", type=int, default=6)
    parser.add_argument("--paths", type=int, default=100)
    parser.add_argument("--call-paths", type=int, default=300)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    lines = [
        "The verdicts' generated corpora against their oracles",
        f"CPU: {describe(FEATURES)}",
        f"torch {torch.__version__}",
    ]
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        lines.append(run("batch", args.batch, seed))
        lines.append(run("determinism", args.determinism, seed))
        lines.append(run("paths", args.paths, seed))
        lines.append(run("call paths", args.call_paths, seed))
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
