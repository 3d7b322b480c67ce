"""The batch check's cost and memory against the passes it needs, and the oracle corpus.

Cost: ``assert_batch_invariant`` on small MLPs (4 x Linear(512, 512) and
3 x Linear(256, 256), with ReLU) at batch 8, forward only under ``torch.no_grad()``, against two
anchors timed in the same interleaved rounds (process CPU time, min and
median):

* *by hand*: the calls the check makes (the full batch; sizes 1 and 4 at
  three offsets; the batch permuted) as a user writes them, each sub-batch
  sliced in the timed loop (``x[i:i + k]``, a view, as the check takes it;
  ``x[order]`` for the permuted batch);
* *same calls*: those calls on sub-batches selected (copied) ahead of time,
  outside the timing: the model's passes alone;
* *full + every row*: a full pass plus one pass per row, the passes a
  brute-force row-by-row check needs.

The goal (issue: "the bare passes the check logically needs ... against the
same calls made by hand") is the check within 1.5x the calls made by hand:
its own work (restoring the state each call starts from, comparing the
rows) at most half the model's. The ratio against the pre-selected calls is
shown too. The check makes 8 calls where a full pass plus every row
makes 9, and its sub-batches of 4 rows and the permuted batch cost more
than single rows, so the ratio against that anchor stays above the calls'
own ratio (shown on the "same calls" line).

The check runs in report mode (``tolerance="report"``: the MLP's GEMMs may
be batch-variant here, and the bitwise check would then raise and locate)
and bitwise on a row-wise model (LayerNorm, tanh, LayerNorm, GELU) that is
invariant.

Memory: peak RSS (``ru_maxrss``) of a child process that runs a
TransformerEncoderLayer at batch 64 plainly (the passes the check makes),
through the check, and through a marked test's check (every sub-batch
recorded op by op for the census); ratios against the plain run.

The oracle corpus's counts are in ``bench_corpora.py``'s result.

Usage::

    python benchmarks/bench_batch_check.py [--rounds 15] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent))
from batch_setup import (
    FEATURES,
    by_hand,
    check,
    check_rows,
    every_row,
    interleaved,
    mlp,
    ratios,
    rowwise,
    same_calls,
)
from bench_machine import describe, write_result

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results" / "batch-check-cpu.txt"
GOAL = 1.5

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
        for c in [None, *sub_batches(64, [1, 32], None, True, 0)]:
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


def _line(name: str, times: list[float], anchors: dict[str, list[float]]) -> str:
    lo, med = min(times), statistics.median(times)
    shown = "; ".join(
        "{}: {:.2f}x min, {:.2f}x median".format(label, *ratios(times, a))
        for label, a in anchors.items()
    )
    return f"  {name:<36} {lo * 1e3:7.3f} ms min {med * 1e3:7.3f} ms median | {shown}"


def cost(rounds: int) -> list[str]:
    calls = len(check_rows(8))
    lines = [
        f"cost: batch 8, forward only, no_grad; {calls} calls per check, 9 for full + every row;"
        f" goal: the check within {GOAL}x the calls it makes, by hand"
    ]
    for width, depth in ((512, 4), (256, 3)):
        torch.manual_seed(0)
        x = torch.randn(8, width)
        model, plain = mlp(width, depth), rowwise(width)
        times = interleaved(
            {
                "by hand": by_hand(model, x),
                "same calls": same_calls(model, x),
                "full + every row": every_row(model, x),
                "check (report)": check(model, x, tolerance="report"),
                "row-wise by hand": by_hand(plain, x),
                "row-wise same calls": same_calls(plain, x),
                "row-wise full + every row": every_row(plain, x),
                "row-wise check (bitwise)": check(plain, x),
            },
            rounds,
            inner=10,
        )
        for title, model_times, prefix in (
            (f"MLP {depth}x{width} check (report)", times["check (report)"], ""),
            (
                f"LayerNorm/tanh {width} check (bitwise)",
                times["row-wise check (bitwise)"],
                "row-wise ",
            ),
        ):
            hand, same = times[f"{prefix}by hand"], times[f"{prefix}same calls"]
            every = times[f"{prefix}full + every row"]
            lines.append(
                f"  {title.rsplit(' check', 1)[0]}: by hand {min(hand) * 1e3:.3f} ms min, "
                f"same calls {min(same) * 1e3:.3f} ms min, "
                f"full + every row {min(every) * 1e3:.3f} ms min"
            )
            lines.append(
                _line(
                    title,
                    model_times,
                    {"vs by hand": hand, "vs same calls": same, "vs full + every row": every},
                )
            )
            worst = max(ratios(model_times, hand))
            lines.append(
                f"    goal (<= {GOAL}x the calls by hand, min and median): "
                + ("met" if worst <= GOAL else f"not met ({worst:.2f}x)")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "assert_batch_invariant: cost against the passes it needs, peak memory",
        f"CPU: {describe(FEATURES)}",
        f"torch {torch.__version__}, {platform.machine()}, 1 thread, {args.rounds} interleaved "
        f"rounds (process CPU time), load average {load:.1f}",
        "",
        *cost(args.rounds),
        "",
        *memory(),
    ]
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
