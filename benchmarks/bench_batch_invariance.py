"""Cost of ``assert_batch_invariant`` against the bare forward passes it needs (CPU).

The check calls ``fn`` once on the whole batch and once per sub-batch (sizes
1, 2 and N/2 at three offsets, and the batch permuted: 11 calls for N > 32),
then compares rows. Its floor is those calls without the check: the *bare*
loop runs the same calls on the same sub-batches (selected before timing).
Each figure is the ratio of process CPU times taken side by side, the
variants interleaved repeat by repeat, the best repeat reported:

1. forward only (``backward=False``, under ``torch.no_grad()``), in
   tolerance-report mode so a batch-variant model does not stop the check;
2. forward and backward (the input requires grad: seeded random upstream
   gradients, input gradients compared row by row) against bare forward and
   ``autograd.grad`` calls;
3. a marked test's check (``@pytest.mark.batch_invariant``: every sub-batch
   also recorded op by op for the census) against the bare forwards;
4. the bitwise check, which on a batch-variant model raises and locates the
   first batch-variant op (two more recorded runs and one located run).

Models: a 4-layer MLP (batch 64, width 512) and one ``nn.TransformerEncoderLayer``
(batch 64, sequence 32, d_model 256, 4 heads, batch first).

Usage::

    python benchmarks/bench_batch_invariance.py [--repeat 5] [--threads 1] [--out PATH]

Results go to stdout and to ``benchmarks/results/batch-invariance-cpu.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pytest_backends import BatchInvarianceError, assert_batch_invariant
from pytest_backends.batch import api as batch_api
from pytest_backends.batch.plugin import TestCheck
from pytest_backends.batch.runs import sub_batches
from pytest_backends.determinism.census import Baseline

sys.path.append(str(Path(__file__).resolve().parent))
from bench_machine import describe, write_result

OUT = Path(__file__).parent / "results" / "batch-invariance-cpu.txt"
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
CLOCK = time.process_time


def mlp() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


def transformer() -> torch.nn.Module:
    return torch.nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True).eval()


def _bare(model: torch.nn.Module, x: torch.Tensor, backward: bool) -> Callable[[], None]:
    """The calls the check makes, on sub-batches selected ahead of time."""
    n = x.shape[0]
    rows = [None, *[c.rows for c in sub_batches(n, sorted({1, 2, n // 2}), None, True, 0)]]
    inputs = [x if r is None else x[list(r)] for r in rows]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        grad = torch.randn(model(x).shape, generator=gen)
    grads = [grad if r is None else grad[list(r)] for r in rows]

    def run() -> None:
        if not backward:
            with torch.no_grad():
                for inp in inputs:
                    model(inp)
            return
        for inp, g in zip(inputs, grads):
            leaf = inp.detach().requires_grad_(True)
            torch.autograd.grad(model(leaf), leaf, g)

    return run


def _check(model: torch.nn.Module, x: torch.Tensor, backward: bool) -> Callable[[], None]:
    def run() -> None:
        if backward:
            assert_batch_invariant(model, x.detach().requires_grad_(True), tolerance="report")
        else:
            with torch.no_grad():
                assert_batch_invariant(model, x, backward=False, tolerance="report")

    return run


def _marked(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    spec = {"sizes": None, "rtol": None, "atol": None, "tolerance": "report", "permute": True}

    def run() -> None:
        token = batch_api.ACTIVE_CHECK.set(TestCheck(spec, Baseline(), update=False))
        try:
            with torch.no_grad():
                assert_batch_invariant(model, x, backward=False)
        finally:
            batch_api.ACTIVE_CHECK.reset(token)

    return run


def _failing(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad(), contextlib.suppress(BatchInvarianceError):
            assert_batch_invariant(model, x, backward=False)

    return run


def _time(variants: dict[str, Callable[[], None]], repeat: int) -> dict[str, float]:
    best = {name: float("inf") for name in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(repeat):
        for name, fn in variants.items():
            start = CLOCK()
            fn()
            best[name] = min(best[name], CLOCK() - start)
    return best


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f} ms"


def bench(name: str, model: torch.nn.Module, x: torch.Tensor, repeat: int) -> list[str]:
    with torch.no_grad():
        report = assert_batch_invariant(model, x, backward=False, tolerance="report")
    try:
        with torch.no_grad():
            assert_batch_invariant(model, x, backward=False)
        found = "batch-invariant here under no_grad (no row differs)"
    except BatchInvarianceError as error:
        op = error.finding.op if error.finding is not None else None
        found = f"batch-variant here under no_grad: max abs {report.max_abs:.3g}, first op {op}"
    graded = assert_batch_invariant(model, x.detach().requires_grad_(True), tolerance="report")
    found += f"; with autograd: max abs {graded.max_abs:.3g} (outputs and input gradients)"
    forward = _time(
        {
            "bare": _bare(model, x, backward=False),
            "check": _check(model, x, backward=False),
            "marked": _marked(model, x),
            "failing": _failing(model, x),
        },
        repeat,
    )
    both = _time(
        {"bare": _bare(model, x, backward=True), "check": _check(model, x, backward=True)}, repeat
    )
    calls = 1 + len(sub_batches(x.shape[0], sorted({1, 2, x.shape[0] // 2}), None, True, 0))
    bare = forward["bare"]
    return [
        f"{name}: input {tuple(x.shape)}, {calls} calls of the model per check; {found}",
        f"  forward only:        bare {_ms(bare)} | check {_ms(forward['check'])} | "
        f"ratio {forward['check'] / bare:.2f}x",
        f"  forward+backward:    bare {_ms(both['bare'])} | check {_ms(both['check'])} | "
        f"ratio {both['check'] / both['bare']:.2f}x",
        f"  marked test (census): bare {_ms(bare)} | check {_ms(forward['marked'])} | "
        f"ratio {forward['marked'] / bare:.2f}x",
        f"  bitwise, locating:   bare {_ms(bare)} | check {_ms(forward['failing'])} | "
        f"ratio {forward['failing'] / bare:.2f}x",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "assert_batch_invariant vs the bare forward passes it needs (CPU)",
        f"CPU: {describe(FEATURES)}",
        f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), best of "
        f"{args.repeat} interleaved repeats (process CPU time), load average {load:.1f}",
        "",
    ]
    lines += bench("MLP 4x512", mlp(), torch.randn(64, 512), args.repeat)
    lines += bench(
        "TransformerEncoderLayer d256 h4", transformer(), torch.randn(64, 32, 256), args.repeat
    )
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
