"""What verifying with oneDNN's primitive log costs per test.

Measures, side by side in one run, the start+stop cost of what
``--backends-verify`` wraps around a test's call: the op recorder alone
(op names), the recorder with input shapes, and with shapes plus oneDNN's primitive log
and the attribution (what ``mkldnn-*`` configurations use), around three
bodies: nothing, one small bf16 matmul, and 20 small convolutions.  The
variants take turns within each repeat.

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

from calibrate_tolerance import cpu_line

from pytest_backends.kernels import PrimitiveLog
from pytest_backends.matrix.op_recorder import ProfilerOpRecorder
from pytest_backends.matrix.verify import KernelTrace


def _ops_only(body: Callable[[], object]) -> None:
    recorder = ProfilerOpRecorder()
    recorder.start()
    body()
    recorder.stop()


def _ops_shapes(body: Callable[[], object]) -> None:
    recorder = ProfilerOpRecorder(shapes=True)
    recorder.start()
    body()
    recorder.stop()


def _with_log(body: Callable[[], object]) -> None:
    recorder, log = ProfilerOpRecorder(shapes=True), PrimitiveLog()
    recorder.start()
    log.start()
    body()
    primitives = log.stop()
    recorder.stop()
    KernelTrace.build(primitives, recorder.events)


def _bare(body: Callable[[], object]) -> None:
    body()


VARIANTS: dict[str, Callable[[Callable[[], object]], None]] = {
    "bare": _bare,
    "op names": _ops_only,
    "+ shapes": _ops_shapes,
    "+ log": _with_log,
}


def _medians_ms(body: Callable[[], object], repeat: int) -> dict[str, float]:
    """Median time per variant; the variants take turns, so drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for fn in VARIANTS.values():
        fn(body)  # warm up
    for _ in range(repeat):
        for name, fn in VARIANTS.items():
            start = time.perf_counter()
            fn(body)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    # one thread: on a shared 2-core machine OpenMP's spinning threads make
    # the timings depend on the neighbours' load more than on what is measured
    torch.set_num_threads(1)
    a = torch.randn(256, 256, dtype=torch.bfloat16)
    x, w = torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3)
    bodies: dict[str, Callable[[], object]] = {
        "empty test": lambda: None,
        "one bf16 256x256 matmul": lambda: a @ a,
        "20 convs 8x16x32x32": lambda: [F.conv2d(x, w) for _ in range(20)],
    }
    lines = [
        "pytest_backends: cost of --backends-verify per test (median ms, "
        f"{args.repeat} repeats, side by side)",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads",
        cpu_line(),
        "",
        f"{'body':<26}" + "".join(f"{name:>10}" for name in VARIANTS) + f"{'log extra':>11}",
    ]
    for name, body in bodies.items():
        ms = _medians_ms(body, args.repeat)
        lines.append(
            f"{name:<26}"
            + "".join(f"{ms[v]:>10.2f}" for v in VARIANTS)
            + f"{ms['+ log'] - ms['+ shapes']:>11.2f}"
        )
    lines += [
        "",
        "op names = the recorder alone (configs without a oneDNN token); + shapes = with input",
        "shapes; + log = shapes, oneDNN's primitive log and attribution (mkldnn-* configs)",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
