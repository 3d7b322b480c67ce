"""Per-repeat overhead of the native repeat loop against Python loops, side by side.

A tiny op (``aten.add.Tensor`` on 16 floats) is called N times and each
output digested, four ways, interleaved over several trials (median):

* ``bare``: a Python loop calling the op, no digest (the floor of any loop);
* ``native loop``: ``repeat(..., backend="native")``, the loop and the digests in C++;
* ``python+native digest``: a Python loop calling the op and the native digest op;
* ``python+fallback``: ``repeat(..., backend="python")``, digests from torch ops.

Usage::

    python benchmarks/bench_repeat.py [--device cpu|cuda] [--runs 2000] [--trials 7]

The output also goes to ``benchmarks/results/repeat-<device>.txt``.
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
from pytest_backends.determinism.digest import _to_host, repeat


def _time(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> int:
    """Run the benchmark and print (and save) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if _native.load() is None:
        print(f"native extension unavailable: {_native.unavailable_reason()}", file=sys.stderr)
        return 1

    op = torch.ops.aten.add.Tensor
    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    native_digest = torch.ops.pytest_backends.digest.default
    n = args.runs
    n_fallback = max(1, n // 10)  # the fallback is slow; fewer runs, same per-run figure

    def bare() -> None:
        for _ in range(n):
            op(a, b)

    def python_native_digest() -> None:
        _to_host([native_digest(op(a, b)) for _ in range(n)])

    fns: dict[str, tuple[Callable[[], object], int]] = {
        "bare": (bare, n),
        "native loop": (lambda: repeat(op, (a, b), runs=n, backend="native"), n),
        "python+native digest": (python_native_digest, n),
        "python+fallback": (
            lambda: repeat(op, (a, b), runs=n_fallback, backend="python"),
            n_fallback,
        ),
    }
    assert len(set(repeat(op, (a, b), runs=3, backend="native"))) == 1
    for fn, _ in fns.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.trials):
        for name, (fn, count) in fns.items():
            samples[name].append(_time(fn, device) / count * 1e6)
    us = {name: statistics.median(s) for name, s in samples.items()}

    lines = [
        f"# per-repeat cost of a tiny op + digest on {device.type}: torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, cpus={os.cpu_count()}, "
        f"load={os.getloadavg()[0]:.1f}, runs={n}, trials={args.trials} (median)",
    ]
    if device.type == "cuda":
        lines.append(f"# {torch.cuda.get_device_name(device)}")
    lines.append(f"{'loop':<22} {'us/repeat':>10} {'vs native loop':>15}")
    for name, value in us.items():
        lines.append(f"{name:<22} {value:10.2f} {value / us['native loop']:14.2f}x")
    lines.append(
        f"# native loop overhead over the bare op: {us['native loop'] - us['bare']:.2f} us/repeat; "
        f"python loop with the same digest: {us['python+native digest'] - us['bare']:.2f} us/repeat"
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = args.out or Path(__file__).parent / "results" / f"repeat-{device.type}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
