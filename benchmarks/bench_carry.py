"""Keys of unchanged outside tensors carried from run to run, against reading them again (CPU).

A checked test runs N times; its parameters and other tensors from outside the
run enter each run at their first use. Without carrying, every run digests
them again (a resnet18 forward reads its 46.8 MB of parameters in every run);
with carrying, a run reuses the previous run's key of a tensor proven
unchanged (same tensor, version counter, storage and layout, no recorded op
writing the storage through any alias, not shared with NumPy) and digests
only what may have changed.

Side by side in one process, variants interleaved repeat by repeat: a bare
forward N times, and the plugin's runner over N runs (``Runs``, as
``--backends-determinism`` drives it) with carrying on and off, for the
native recorder (where built) and the Python recorder. Process CPU time, min
and median of the repeats, torch with one intra-op thread.

Usage::

    python benchmarks/bench_carry.py [--runs 5] [--repeat 15] [--out PATH]

Results go to stdout and to ``benchmarks/results/carry-cpu.txt``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pytest_backends.determinism import digest
from pytest_backends.determinism.record_native import native_module
from pytest_backends.determinism.runs import CompileWatch, Runs

sys.path.append(str(Path(__file__).resolve().parent))
from bench_machine import describe, write_result
from bench_reproducible import FEATURES, resnet18

OUT = Path(__file__).parent / "results" / "carry-cpu.txt"
CLOCK = time.process_time


def interleaved(
    variants: dict[str, Callable[[], object]], repeat: int
) -> dict[str, tuple[float, float]]:
    """(min, median) process CPU seconds per call of each variant, alternating every repeat."""
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, fn in variants.items():
            start = CLOCK()
            fn()
            times[name].append(CLOCK() - start)
    return {name: (min(ts), statistics.median(ts)) for name, ts in times.items()}


def plugin_runs(
    model: torch.nn.Module, x: torch.Tensor, runs: int, carry: bool, python: bool = False
) -> Any:
    """What ``--backends-determinism`` runs: the plugin's runner over ``runs`` runs."""
    runner = Runs(CompileWatch())
    if python:
        runner._native = False  # the fallback recorder, as where the extension is not built
    for _ in range(runs):
        runner.begin()
        with torch.no_grad():
            model(x)
        runner.end()
        runner._carry = runner._carry and carry
    return runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per check (N)")
    parser.add_argument("--repeat", type=int, default=15, help="interleaved repeats")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = resnet18(), torch.randn(2, 3, 112, 112)
    nparams = sum(p.numel() * p.element_size() for p in model.parameters())
    nbuffers = sum(b.numel() * b.element_size() for b in model.buffers())

    def bare() -> None:
        for _ in range(args.runs):
            with torch.no_grad():
                model(x)

    variants: dict[str, Callable[[], object]] = {"bare": bare}
    native = native_module() is not None
    for kind in ("native", "python") if native else ("python",):
        for carry in (False, True):

            def run(carry: bool = carry, kind: str = kind) -> None:
                plugin_runs(model, x, args.runs, carry, python=kind == "python")

            variants[f"{kind} recorder, {'carried' if carry else 'read again'}"] = run
    ops = len(plugin_runs(model, x, 2, True).records[1].log.loaded().calls)
    found = interleaved(variants, args.repeat)
    base = found["bare"]
    lines = [
        "Outside tensors' keys carried from run to run vs read again in every run (CPU)",
        f"CPU: {describe(FEATURES)}",
        f"torch {torch.__version__}, 1 thread, digest backend: {digest.backend()}, "
        f"N={args.runs} runs, {args.repeat} interleaved repeats, process CPU time, "
        f"load average {os.getloadavg()[0]:.1f}",
        "",
        f"resnet18-sized CNN forward, input {tuple(x.shape)}: {ops} ops per run, "
        f"parameters {nparams / 1e6:.1f} MB, buffers {nbuffers / 1e6:.2f} MB",
        f"{'variant':34} {'min ms':>9} {'median ms':>10} {'us/op over bare (min)':>22}",
    ]
    for name, (low, mid) in found.items():
        per_op = (low - base[0]) / (ops * args.runs) * 1e6
        lines.append(
            f"{name:34} {low * 1e3:9.2f} {mid * 1e3:10.2f} "
            f"{'' if name == 'bare' else f'{per_op:22.1f}'}"
        )
    for kind in ("native", "python"):
        off = found.get(f"{kind} recorder, read again")
        on = found.get(f"{kind} recorder, carried")
        if off and on:
            lines.append(
                f"{kind}: overhead over bare, carried / read again: min "
                f"{(on[0] - base[0]) / (off[0] - base[0]):.2f}, median "
                f"{(on[1] - base[1]) / (off[1] - base[1]):.2f}"
            )
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
