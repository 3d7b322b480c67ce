"""The batch check's cost and memory against the passes it needs, and the oracle corpus.

Cost: ``assert_batch_invariant`` on small MLPs (4 x Linear(512, 512) and
3 x Linear(256, 256), with ReLU) at batch 8, forward only under ``torch.no_grad()``, against two
anchors timed in the same interleaved rounds (process CPU time, min and
median):

* *same calls*: the calls the check makes (the full batch; sizes 1, 2 and 4
  at three offsets; the batch permuted) made by hand on sub-batches selected
  ahead of time;
* *full + every row*: a full pass plus one pass per row, the passes a
  brute-force row-by-row check needs.

The check runs in report mode (``tolerance="report"``: the MLP's GEMMs may
be batch-variant here, and the bitwise check would then raise and locate)
and bitwise on a row-wise model (LayerNorm, tanh, LayerNorm, GELU) that is
invariant.

Memory: peak RSS (``ru_maxrss``) of a child process that runs a
TransformerEncoderLayer at batch 64 plainly (the passes the check makes),
through the check, and through a marked test's check (every sub-batch
recorded op by op for the census); ratios against the plain run.

Corpus: with ``--corpus N``, the oracle-vs-check property test runs N
generated cases (``PYTEST_BACKENDS_BATCH_CORPUS``) and its counts are
reported.

Usage::

    python benchmarks/bench_batch_check.py [--rounds 15] [--corpus 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pytest_backends import assert_batch_invariant
from pytest_backends.batch.runs import sub_batches

sys.path.append(str(Path(__file__).resolve().parent))
from bench_machine import describe, write_result

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results" / "batch-check-cpu.txt"
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
CLOCK = time.process_time

MEMORY_CHILD = r"""
import resource, sys, torch
from pytest_backends import assert_batch_invariant
from pytest_backends.batch import api
from pytest_backends.batch.plugin import TestCheck
from pytest_backends.batch.runs import sub_batches
from pytest_backends.determinism.census import Baseline
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True).eval()
x = torch.randn(64, 32, 256)
mode = sys.argv[1]
with torch.no_grad():
    if mode == "plain":
        for c in [None, *sub_batches(64, [1, 2, 32], None, True, 0)]:
            model(x if c is None else x[list(c.rows)])
    elif mode == "check":
        assert_batch_invariant(model, x, backward=False, tolerance="report")
    else:
        spec = {"sizes": None, "rtol": None, "atol": None, "tolerance": "report", "permute": True}
        token = api.ACTIVE_CHECK.set(TestCheck(spec, Baseline(), update=False))
        assert_batch_invariant(model, x, backward=False)
        api.ACTIVE_CHECK.reset(token)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


def rowwise(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.LayerNorm(width), torch.nn.Tanh(), torch.nn.LayerNorm(width), torch.nn.GELU()
    ).eval()


def _same_calls(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    n = x.shape[0]
    rows = [None, *[c.rows for c in sub_batches(n, sorted({1, 2, n // 2}), None, True, 0)]]
    inputs = [x if r is None else x[list(r)] for r in rows]

    def run() -> None:
        with torch.no_grad():
            for inp in inputs:
                model(inp)

    return run


def _every_row(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    inputs = [x] + [x[i : i + 1] for i in range(x.shape[0])]

    def run() -> None:
        with torch.no_grad():
            for inp in inputs:
                model(inp)

    return run


def _check(model: torch.nn.Module, x: torch.Tensor, **kwargs: object) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            assert_batch_invariant(model, x, backward=False, **kwargs)  # type: ignore[arg-type]

    return run


def _rounds(
    variants: dict[str, Callable[[], None]], rounds: int, inner: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            start = CLOCK()
            for _ in range(inner):
                fn()
            times[name].append((CLOCK() - start) / inner)
    return times


def _line(name: str, times: list[float], anchors: dict[str, list[float]]) -> str:
    lo, med = min(times), statistics.median(times)
    ratios = "; ".join(
        f"{label}: {lo / min(a):.2f}x min, {med / statistics.median(a):.2f}x median"
        for label, a in anchors.items()
    )
    return f"  {name:<28} {lo * 1e3:7.3f} ms min {med * 1e3:7.3f} ms median | {ratios}"


def cost(rounds: int) -> list[str]:
    lines = ["cost: batch 8, forward only, no_grad; 11 calls per check (9 for full + every row)"]
    for width, depth in ((512, 4), (256, 3)):
        torch.manual_seed(0)
        x = torch.randn(8, width)
        model, plain = mlp(width, depth), rowwise(width)
        times = _rounds(
            {
                "same calls": _same_calls(model, x),
                "full + every row": _every_row(model, x),
                "check (report)": _check(model, x, tolerance="report"),
                "row-wise same calls": _same_calls(plain, x),
                "row-wise full + every row": _every_row(plain, x),
                "row-wise check (bitwise)": _check(plain, x),
            },
            rounds,
            inner=10,
        )
        name = f"MLP {depth}x{width}"
        for anchor in ("same calls", "full + every row"):
            lines.append(f"  {name} {anchor:<18} {min(times[anchor]) * 1e3:7.3f} ms min")
        lines.append(
            _line(
                f"{name} check (report)",
                times["check (report)"],
                {
                    "vs same calls": times["same calls"],
                    "vs full + every row": times["full + every row"],
                },
            )
        )
        for anchor in ("row-wise same calls", "row-wise full + every row"):
            lines.append(
                f"  LayerNorm/tanh {width} {anchor:<26} {min(times[anchor]) * 1e3:7.3f} ms"
            )
        lines.append(
            _line(
                f"LayerNorm/tanh {width} check (bitwise)",
                times["row-wise check (bitwise)"],
                {
                    "vs same calls": times["row-wise same calls"],
                    "vs full + every row": times["row-wise full + every row"],
                },
            )
        )
    return lines


def memory() -> list[str]:
    peaks = {}
    for mode in ("plain", "check", "marked"):
        out = subprocess.run(
            [sys.executable, "-c", MEMORY_CHILD, mode],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.split()
        peaks[mode] = int(out[-1]) / 1024  # KiB -> MiB
    plain = peaks["plain"]
    return [
        "memory: peak RSS of one process, TransformerEncoderLayer d256 at batch 64 x 32 tokens",
        f"  plain passes {plain:7.0f} MiB",
        f"  check        {peaks['check']:7.0f} MiB ({peaks['check'] / plain:.2f}x plain)",
        f"  marked check {peaks['marked']:7.0f} MiB ({peaks['marked'] / plain:.2f}x plain; "
        "the op recording keeps at most 1 GiB of copies per run)",
    ]


def corpus(examples: int) -> list[str]:
    env = dict(os.environ, PYTEST_BACKENDS_BATCH_CORPUS=str(examples))
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-s",
            "tests/batch/test_batch_oracle_corpus.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    counts = next(
        (line for line in done.stdout.splitlines() if line.startswith("batch oracle corpus")),
        "no counts printed",
    )
    return [
        f"oracle corpus: {examples} examples, exit {done.returncode}, "
        f"{time.perf_counter() - start:.0f} s wall",
        f"  {counts}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--corpus", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "assert_batch_invariant: cost against the passes it needs, peak memory, oracle corpus",
        f"CPU: {describe(FEATURES)}",
        f"torch {torch.__version__}, {platform.machine()}, 1 thread, {args.rounds} interleaved "
        f"rounds (process CPU time), load average {load:.1f}",
        "",
        *cost(args.rounds),
        "",
        *memory(),
    ]
    if args.corpus:
        lines += ["", *corpus(args.corpus)]
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
