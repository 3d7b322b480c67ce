"""What verifying with oneDNN's primitive log costs per test.

Measures, side by side in one run, the start+stop cost of what
``--backends-verify`` wraps around a test's call: the op recorder alone
(op names), the recorder with shapes plus oneDNN's primitive log and the
attribution (what ``mkldnn-*`` configurations use), around three bodies:
nothing, one small bf16 matmul, and 50 small convolutions.

Usage::

    python benchmarks/bench_primitive_log.py [--repeat 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate_tolerance import cpu_line  # noqa: E402

from pytest_backends.kernels import PrimitiveLog  # noqa: E402
from pytest_backends.matrix.verify import KernelTrace, OpRecorder  # noqa: E402


def _ops_only(body: Callable[[], object]) -> None:
    recorder = OpRecorder()
    recorder.start()
    body()
    recorder.stop()


def _with_log(body: Callable[[], object]) -> None:
    recorder, log = OpRecorder(shapes=True), PrimitiveLog()
    recorder.start()
    log.start()
    body()
    primitives = log.stop()
    recorder.stop()
    KernelTrace.build(primitives, recorder.events)


def _bare(body: Callable[[], object]) -> None:
    body()


def _median_ms(fn: Callable[[Callable[[], object]], None], body: Callable[[], object],
               repeat: int) -> float:
    fn(body)  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(body)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    a = torch.randn(256, 256, dtype=torch.bfloat16)
    x, w = torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3)
    bodies: dict[str, Callable[[], object]] = {
        "empty test": lambda: None,
        "one bf16 256x256 matmul": lambda: a @ a,
        "50 convs 8x16x32x32": lambda: [F.conv2d(x, w) for _ in range(50)],
    }
    lines = [
        "pytest_backends: cost of --backends-verify per test (median ms, "
        f"{args.repeat} repeats, side by side)",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads",
        cpu_line(),
        "",
        f"{'body':<26} {'bare':>8} {'op names':>9} {'+ log':>9} {'log extra':>10}",
    ]
    for name, body in bodies.items():
        bare = _median_ms(_bare, body, args.repeat)
        ops = _median_ms(_ops_only, body, args.repeat)
        log = _median_ms(_with_log, body, args.repeat)
        lines.append(f"{name:<26} {bare:>8.2f} {ops:>9.2f} {log:>9.2f} {log - ops:>10.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
