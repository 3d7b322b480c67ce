"""Cost of ``assert_paths_agree`` (two recorded configurations) against two plain runs (CPU).

``assert_paths_agree(fn, x, axes=["mkldnn"])`` runs ``fn`` forward and
backward under ``mkldnn-on`` and ``mkldnn-off``, each under an op recorder
that copies every op's inputs and outputs, and compares the results.  Its
floor is the same two forward+backward passes with the flags set by hand and
no recorder.  Both are timed on process CPU time, interleaved repeat by
repeat, the best repeat reported.  A second row times the failing case: a
planted op makes the comparison fail, so the op-level blame (replays) runs.

Models: a small CNN (batch 8, 3x32x32, two convs and a linear head) and a
4-layer MLP (batch 64, width 256).

Usage::

    python benchmarks/bench_paths.py [--repeat 5] [--threads 1] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pytest_backends import PathsDisagreeError, assert_paths_agree
from pytest_backends.flags import override_flags


@torch.library.custom_op("bench_paths::plant", mutates_args=())
def plant(x: torch.Tensor) -> torch.Tensor:
    """Adds 1e-2 only while oneDNN is enabled."""
    return x + (1e-2 if torch.backends.mkldnn.enabled else 0.0)


plant.register_autograd(lambda ctx, grad: grad)


def _cnn(planted: bool) -> nn.Module:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.head = nn.Linear(16 * 8 * 8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(nn.functional.max_pool2d(self.c1(x), 2))
            y = torch.relu(nn.functional.max_pool2d(self.c2(y), 2))
            y = plant(y) if planted else y
            return self.head(y.flatten(1))

    return Net()


def _mlp(planted: bool) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.GELU()]
    return nn.Sequential(*layers)


def _plain(model: nn.Module, x: torch.Tensor) -> None:
    for enabled in (True, False):
        with override_flags({"mkldnn.enabled": enabled}):
            xx = x.detach().clone().requires_grad_(True)
            out = model(xx)
            torch.autograd.grad(out, [xx, *model.parameters()], torch.ones_like(out))


def _checked(model: nn.Module, x: torch.Tensor) -> None:
    with contextlib.suppress(PathsDisagreeError):
        assert_paths_agree(model, x, axes=["mkldnn"])


def _cpu(fn: Callable[..., Any], *args: Any) -> float:
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = [
        ("cnn, paths agree", _cnn(False), torch.randn(8, 3, 32, 32)),
        ("cnn, planted op blamed", _cnn(True), torch.randn(8, 3, 32, 32)),
        ("mlp, paths agree", _mlp(False), torch.randn(64, 256)),
    ]
    lines = [
        f"assert_paths_agree over mkldnn on/off vs two plain forward+backward runs; "
        f"process CPU time, best of {args.repeat}, {args.threads} thread(s)",
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {_cpu_model()}",
        f"{'case':28} {'plain (ms)':>11} {'checked (ms)':>13} {'ratio':>7}",
    ]
    for name, model, x in cases:
        _checked(model, x)  # warm-up: imports, probes
        plain, checked = [], []
        for _ in range(args.repeat):
            plain.append(_cpu(_plain, model, x))
            checked.append(_cpu(_checked, model, x))
        p, c = min(plain), min(checked)
        lines.append(f"{name:28} {p * 1e3:11.1f} {c * 1e3:13.1f} {c / p:7.1f}x")
    text = "\n".join(lines)
    print(text)
    out = args.out or Path(__file__).with_name("results") / "paths-cpu.txt"
    out.write_text(text + "\n")
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    raise SystemExit(main())
