"""Digest throughput against ``torch.equal`` on the same tensors, side by side.

For each size, the native digest (``digest_bytes``: kernel plus the 16-byte
copy to the host), the torch-ops fallback and ``torch.equal(x, y)`` (``y`` a
copy of ``x``, so it reads both) run interleaved, and the median of the
trials is reported. The ratio ``digest/equal`` compares the two throughputs in
bytes of tensor per second (the issue's target on CPU: >= 0.5); ``read bw``
compares bytes read per second (``torch.equal`` reads two tensors, the digest
one; the GPU target: >= 0.6).

Usage::

    python benchmarks/bench_digest.py [--device cpu|cuda] [--trials 7] [--out FILE]

The output also goes to ``benchmarks/results/digest-<device>.txt``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_backends import _native
from pytest_backends.determinism.digest import digest_bytes

SIZES_MB = (1, 16, 128)


def _time(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _bench(size_mb: int, device: torch.device, trials: int, with_python: bool) -> dict[str, float]:
    numel = size_mb * (1 << 20) // 4
    x = torch.randn(numel, device=device)
    y = x.clone()
    fns: dict[str, Callable[[], object]] = {
        "native": lambda: digest_bytes(x, backend="native"),
        "equal": lambda: torch.equal(x, y),
    }
    if with_python:
        fns["python"] = lambda: digest_bytes(x, backend="python")
    for fn in fns.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(trials):
        for name, fn in fns.items():
            samples[name].append(_time(fn, device))
    return {name: statistics.median(s) for name, s in samples.items()}


def main() -> int:
    """Run the benchmark and print (and save) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if _native.load() is None:
        print(f"native extension unavailable: {_native.unavailable_reason()}", file=sys.stderr)
        return 1

    lines = [
        f"# digest vs torch.equal on {device.type}: torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, threads={torch.get_num_threads()}, "
        f"cpus={os.cpu_count()}, load={os.getloadavg()[0]:.1f}, trials={args.trials} (median)",
    ]
    if device.type == "cuda":
        lines.append(f"# {torch.cuda.get_device_name(device)}")
    lines.append(
        f"{'MB':>5} {'native GB/s':>12} {'equal GB/s':>11} {'python GB/s':>12} "
        f"{'digest/equal':>13} {'read bw':>8} {'native/python':>14}"
    )
    worst = float("inf")
    for size in SIZES_MB:
        t = _bench(size, device, args.trials, with_python=size <= 16)
        nbytes = size * (1 << 20)
        native_gbs = nbytes / t["native"] / 1e9
        equal_gbs = nbytes / t["equal"] / 1e9
        ratio = t["equal"] / t["native"]
        worst = min(worst, ratio)
        python = f"{nbytes / t['python'] / 1e9:12.2f}" if "python" in t else f"{'-':>12}"
        speedup = f"{t['python'] / t['native']:13.1f}x" if "python" in t else f"{'-':>14}"
        lines.append(
            f"{size:>5} {native_gbs:12.2f} {equal_gbs:11.2f} {python} "
            f"{ratio:12.2f}x {ratio / 2:7.2f}x {speedup}"
        )
    target = 0.6 if device.type == "cuda" else 0.5
    lines.append(
        f"# worst digest/equal throughput ratio: {worst:.2f}x "
        f"(target >= {target}x {'met' if worst >= target else 'NOT met'})"
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = args.out or Path(__file__).parent / "results" / f"digest-{device.type}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
