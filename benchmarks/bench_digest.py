"""Digest throughput against ``torch.sum`` of the same tensor, side by side.

``torch.sum`` of a large fp32 tensor is a memory-bound read: one pass over the
bytes, which is also the digest's physical limit. For each size (default
64 MB of fp32), every variant runs in each round, interleaved, on the same
tensor: the anchor ``torch.sum``, the native digest on each instruction-set
path this CPU supports (``avx512``, ``avx2``, ``scalar``, selected with the
extension's ``set_digest_isa``; ``PYTEST_BACKENDS_DIGEST_ISA`` does the same
for a whole process), and the torch-ops fallback. A sample is the process CPU
time of ``--calls`` calls (all threads of the intra-op pool count); the table
gives the min and median over ``--rounds`` rounds and the throughput ratio
``sum time / digest time`` (goal: >= 0.8 on the vector paths; the scalar
path is the portable fallback of CPUs without AVX2). On CUDA the samples are
wall time around a synchronised stream instead.

Usage::

    python benchmarks/bench_digest.py [--device cpu|cuda] [--rounds 9] [--sizes 64] [--out FILE]

The output also goes to ``benchmarks/results/digest-<device>.txt``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_machine import describe, write_result

from pytest_backends import _native
from pytest_backends.determinism.digest import digest

GOAL = 0.8
PATHS = ("avx512", "avx2", "scalar")


def _sample(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / calls
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


def _variants(
    x: torch.Tensor, module: object, paths: list[str], python: bool
) -> dict[str, Callable[[], object]]:
    def native(path: str) -> Callable[[], object]:
        def run() -> object:
            module.set_digest_isa(path)  # type: ignore[attr-defined]
            return digest(x, backend="native")

        return run

    fns: dict[str, Callable[[], object]] = {"torch.sum": lambda: x.sum()}
    if x.device.type == "cpu":
        for path in paths:
            fns[f"digest {path}"] = native(path)
    else:
        fns["digest cuda"] = lambda: digest(x, backend="native")
    if python:
        fns["digest python"] = lambda: digest(x, backend="python")
    return fns


def main() -> int:
    """Run the benchmark and print (and save) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5, help="calls per sample")
    parser.add_argument("--sizes", default="64", help="comma-separated sizes in MB")
    parser.add_argument("--no-python", action="store_true", help="skip the torch-ops fallback")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    module = _native.load()
    if module is None:
        print(f"native extension unavailable: {_native.unavailable_reason()}", file=sys.stderr)
        return 1
    auto = module.set_digest_isa("auto")
    paths = [p for p in PATHS if module.set_digest_isa(p) == p]
    module.set_digest_isa("auto")

    clock = "wall time, synchronised" if device.type == "cuda" else "process CPU time"
    lines = [
        f"# digest vs torch.sum on {device.type}: torch {torch.__version__}, "
        f"threads={torch.get_num_threads()}, load={os.getloadavg()[0]:.1f}",
        f"# CPU: {describe(['avx2', 'avx512f', 'avx512dq', 'amx_tile'])}",
        f"# ISA path taken by default: {auto}; paths measured: {', '.join(paths)}",
        f"# {args.rounds} interleaved rounds of {args.calls} calls each, {clock}; "
        "ratio = torch.sum time / digest time (>= 1: the digest is faster)",
    ]
    if device.type == "cuda":
        lines.append(f"# GPU: {torch.cuda.get_device_name(device)}")
    lines.append(
        f"{'MB':>4}  {'variant':<14} {'min GB/s':>9} {'med GB/s':>9} "
        f"{'ratio min':>10} {'ratio med':>10}"
    )
    worst = float("inf")
    for size in (int(s) for s in args.sizes.split(",")):
        nbytes = size * (1 << 20)
        gen = torch.Generator().manual_seed(size)
        x = torch.randn(nbytes // 4, generator=gen).to(device)
        fns = _variants(x, module, paths, python=not args.no_python)
        for fn in fns.values():  # warm-up
            fn()
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for r in range(args.rounds):
            # Rotate the order so no variant always follows the same one.
            names = list(fns)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                calls = 1 if name == "digest python" else args.calls
                samples[name].append(_sample(fns[name], device, calls))
        module.set_digest_isa("auto")
        anchor_min = min(samples["torch.sum"])
        anchor_med = statistics.median(samples["torch.sum"])
        for name, s in samples.items():
            t_min, t_med = min(s), statistics.median(s)
            ratio_min = anchor_min / t_min
            ratio_med = anchor_med / t_med
            if name in ("digest avx512", "digest avx2", "digest cuda"):
                worst = min(worst, ratio_min, ratio_med)
            ratios = "" if name == "torch.sum" else f"{ratio_min:9.2f}x {ratio_med:9.2f}x"
            lines.append(
                f"{size:>4}  {name:<14} {nbytes / t_min / 1e9:9.2f} "
                f"{nbytes / t_med / 1e9:9.2f} {ratios}"
            )
    lines.append(
        f"# worst vector-path digest / torch.sum throughput ratio: {worst:.2f}x "
        f"(goal >= {GOAL}x: {'met' if worst >= GOAL else 'NOT met'})"
    )
    out = args.out or Path(__file__).parent / "results" / f"digest-{device.type}.txt"
    write_result("\n".join(lines) + "\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
