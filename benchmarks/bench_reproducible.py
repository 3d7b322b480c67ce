"""Cost of ``assert_reproducible`` and of the per-op recorder, against bare runs (CPU).

Each figure is a ratio of two timings taken side by side in one process, the
variants interleaved repeat by repeat, the best of the repeats reported. The
bare loops only call the model (no reseeding, no comparison):

1. ``assert_reproducible(model, x, runs=N)`` (forward, backward with seeded
   random upstream gradients, digests of the output and every parameter
   gradient) against N bare forward+backward passes with the same upstream
   gradient;
2. ``assert_reproducible(..., backward=False)`` under ``torch.no_grad()``
   against N bare forwards, and pytest-torch's ``assert_deterministic`` on the
   same model, input and N when the ``pytest_torch`` package is importable;
3. one forward under the ``--backends-determinism`` op recorder
   (``OpRecorder``: op names, input keys and output digests) against a bare
   forward, as a ratio and as microseconds per recorded op.

Models: a small CNN (3 conv layers, batch 8 of 3x32x32) and a 4-layer MLP
(batch 64, width 512).

Usage::

    python benchmarks/bench_reproducible.py [--runs 5] [--repeat 15] [--threads 1] [--out PATH]

Results go to stdout and to ``benchmarks/results/reproducible-cpu.txt``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pytest_backends import assert_reproducible
from pytest_backends.determinism import digest
from pytest_backends.determinism.recorder import OpRecorder

try:  # optional: only compared when installed
    from pytest_torch import (  # type: ignore[import-not-found,unused-ignore]
        assert_deterministic as pt_assert_deterministic,
    )
except ImportError:  # pragma: no cover - depends on the environment
    pt_assert_deterministic = None

OUT = Path(__file__).parent / "results" / "reproducible-cpu.txt"


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1, stride=2),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 8 * 8, 10),
    )


def mlp() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
    layers.append(torch.nn.Linear(512, 10))
    return torch.nn.Sequential(*layers)


def interleaved(variants: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best (minimum) seconds per call of each variant, the variants alternating every repeat.

    The minimum is the figure least disturbed by other processes on a shared machine.
    """
    for fn in variants.values():  # warm-up (allocator, oneDNN primitives, native load)
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(ts) for name, ts in times.items()}


def bench_model(
    name: str, model: torch.nn.Module, x: torch.Tensor, runs: int, repeat: int
) -> list[str]:
    torch.manual_seed(0)
    upstream = torch.randn(model(x).shape)
    params = list(model.parameters())

    def bare_train() -> None:
        for _ in range(runs):
            for p in params:
                p.grad = None
            model(x).backward(upstream)

    def harness_train() -> None:
        assert_reproducible(model, x, runs=runs)

    def bare_forward() -> None:
        with torch.no_grad():
            for _ in range(runs):
                model(x)

    def harness_forward() -> None:
        with torch.no_grad():
            assert_reproducible(model, x, runs=runs, backward=False)

    forward: dict[str, Callable[[], object]] = {
        "bare": bare_forward,
        "assert_reproducible": harness_forward,
    }
    if pt_assert_deterministic is not None:
        forward["pytest-torch"] = lambda: pt_assert_deterministic(model, x, runs=runs, reseed=0)

    def one_forward() -> None:
        with torch.no_grad():
            model(x)

    def recorded_forward() -> int:
        with torch.no_grad(), OpRecorder() as recorder:
            model(x)
        return len(recorder.finish().calls)

    n_ops = recorded_forward()
    t_train = interleaved({"bare": bare_train, "assert_reproducible": harness_train}, repeat)
    t_fwd = interleaved(forward, repeat)
    t_mode = interleaved({"bare": one_forward, "recorded": recorded_forward}, repeat)

    nparams = sum(p.numel() for p in params)
    lines = [
        f"{name}: {nparams / 1e6:.2f} M parameters, input {tuple(x.shape)}, {n_ops} ops per forward"
    ]
    lines.append(
        f"  forward+backward x{runs}: bare {t_train['bare'] * 1e3:8.2f} ms | "
        f"assert_reproducible {t_train['assert_reproducible'] * 1e3:8.2f} ms | "
        f"ratio {t_train['assert_reproducible'] / t_train['bare']:.2f}x"
    )
    fwd = (
        f"  forward x{runs} (no_grad): bare {t_fwd['bare'] * 1e3:8.2f} ms | "
        f"assert_reproducible {t_fwd['assert_reproducible'] * 1e3:8.2f} ms | "
        f"ratio {t_fwd['assert_reproducible'] / t_fwd['bare']:.2f}x"
    )
    if "pytest-torch" in t_fwd:
        fwd += (
            f" | pytest-torch assert_deterministic {t_fwd['pytest-torch'] * 1e3:8.2f} ms | "
            f"ratio {t_fwd['pytest-torch'] / t_fwd['bare']:.2f}x"
        )
    else:
        fwd += " | pytest-torch: not installed"
    lines.append(fwd)
    per_op = (t_mode["recorded"] - t_mode["bare"]) / max(n_ops, 1) * 1e6
    lines.append(
        f"  one forward under the op recorder: bare {t_mode['bare'] * 1e3:8.2f} ms | "
        f"recorded {t_mode['recorded'] * 1e3:8.2f} ms | "
        f"ratio {t_mode['recorded'] / t_mode['bare']:.2f}x | {per_op:.1f} us per op"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per check (N)")
    parser.add_argument("--repeat", type=int, default=15, help="interleaved repeats")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = [
        ("small CNN", small_cnn(), torch.randn(8, 3, 32, 32)),
        ("MLP 4x512", mlp(), torch.randn(64, 512)),
    ]
    try:
        pt_version = "pytest-torch " + importlib.metadata.version("pytest-torch")
    except importlib.metadata.PackageNotFoundError:
        pt_version = "pytest-torch not installed"
    header = [
        f"assert_reproducible and the op recorder vs bare runs (CPU); {pt_version}",
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} thread(s), digest backend: {digest.backend()}, N={args.runs}, "
        f"best of {args.repeat} interleaved repeats, load average {os.getloadavg()[0]:.1f}",
        "",
    ]
    lines = header
    for name, model, x in cases:
        lines += bench_model(name, model, x, args.runs, args.repeat)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
