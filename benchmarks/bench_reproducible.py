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
   (the plugin's runner: op names, input keys and output digests) against a bare
   forward, as a ratio and as microseconds per recorded op.

Models: a small CNN (3 conv layers, batch 8 of 3x32x32) and a 4-layer MLP
(batch 64, width 512).

4. On a resnet18-sized CNN forward (batch 2, 3x112x112, about 90 ops), side
   by side: bare, a naive Python ``TorchDispatchMode`` that digests every
   floating output as the sum of its bits as int64, the recorder for one run
   (a fresh recorder: every parameter digested), and the recorder over N runs
   as the plugin runs it (its runner: the native recorder when the extension
   is built; keys of outside tensors carried from run to run), and the Python
   recorder (the fallback) over the same N runs, in microseconds per op over
   bare. The per-op breakdown: the native digest kernel on that forward's
   outputs and the rest (the recorder's bookkeeping and, in a fresh recorder,
   every parameter's digest), beside the floor of any Python dispatch mode (a
   mode that only calls the op).

Usage::

    python benchmarks/bench_reproducible.py [--runs 5] [--repeat 15] [--threads 1] [--out PATH]

Results go to stdout and to ``benchmarks/results/reproducible-cpu.txt``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytest_backends import assert_reproducible
from pytest_backends.determinism import digest
from pytest_backends.determinism.record_native import native_module
from pytest_backends.determinism.record_python import PythonRecorder
from pytest_backends.determinism.runs import CompileWatch, Runs

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import describe, write_result

try:  # optional: only compared when installed
    from pytest_torch import (  # type: ignore[import-not-found,unused-ignore]
        assert_deterministic as pt_assert_deterministic,
    )
except ImportError:  # pragma: no cover - depends on the environment
    pt_assert_deterministic = None

OUT = Path(__file__).parent / "results" / "reproducible-cpu.txt"
#: The CPU features the digest kernels and oneDNN dispatch on.
FEATURES = ("avx2", "avx512f", "avx512dq", "avx512_bf16", "amx_tile")
#: CPU time of this thread (torch runs with one intra-op thread here).
CLOCK = time.thread_time


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


class _BasicBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: torch.nn.Module | None = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet18() -> torch.nn.Module:
    """The resnet18 architecture (11.7 M parameters), in eval mode."""
    nn = torch.nn
    layers: list[torch.nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers).eval()


class NaiveMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Digests every floating output as the sum of its bits as int64 (the naive baseline)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.digests: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                bits = _INT_OF_SIZE[t.element_size()]
                self.digests.append(t.contiguous().view(bits).sum(dtype=torch.int64))
        return out


_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


class CallOnlyMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The floor of any Python dispatch mode: it only calls the op."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class _KeepOutputs(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.outputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.outputs += [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out


def bench_modes(
    name: str, model: torch.nn.Module, x: torch.Tensor, runs: int, repeat: int
) -> list[str]:
    """Bare, naive mode and recorder per op on one forward, side by side."""

    def bare() -> None:
        with torch.no_grad():
            model(x)

    def naive() -> None:
        with torch.no_grad(), NaiveMode() as mode:
            model(x)
        torch.stack(mode.digests).tolist()  # to the host, as the recorder's finish does

    def call_only() -> None:
        with torch.no_grad(), CallOnlyMode():
            model(x)

    def recorded() -> int:
        return len(plugin_runs(1).records[0].log.loaded().calls)

    def plugin_runs(count: int) -> Any:
        # What ``--backends-determinism`` runs: the plugin's runner and recorder.
        runner = Runs(CompileWatch())
        for _ in range(count):
            runner.begin()
            with torch.no_grad():
                model(x)
            runner.end()
        return runner

    def recorded_runs() -> None:
        plugin_runs(runs)

    def python_recorder_runs() -> None:
        # The fallback where the extension is not built: the Python dispatch mode.
        previous = None
        for _ in range(runs):
            recorder = PythonRecorder(previous)
            with torch.no_grad(), recorder:
                model(x)
            recorder.finish()
            previous = recorder

    def bare_runs() -> None:
        for _ in range(runs):
            bare()

    def naive_runs() -> None:
        for _ in range(runs):
            naive()

    with torch.no_grad(), _KeepOutputs() as keep:
        model(x)
    outputs = keep.outputs
    digest_fn = torch.ops.pytest_backends.digest.default if digest.backend() == "native" else None

    def digests_only() -> None:
        for t in outputs:
            digest.digest(t) if digest_fn is None else digest_fn(t)

    def nothing() -> None:
        pass

    n_ops = recorded()
    recorder_kind = "native" if native_module() is not None else "Python"
    one = interleaved(
        {"bare": bare, "call-only mode": call_only, "naive mode": naive, "recorder": recorded},
        repeat,
    )
    many = interleaved(
        {
            "bare": bare_runs,
            "naive mode": naive_runs,
            "recorder": recorded_runs,
            "Python recorder": python_recorder_runs,
        },
        max(3, repeat // 3),
    )
    kernels = interleaved({"nothing": nothing, "digests": digests_only}, repeat)

    def per_op(seconds: float, base: float, ops: int) -> float:
        return (seconds - base) / ops * 1e6

    nparams = sum(p.numel() for p in model.parameters())
    lines = [f"{name}: {nparams / 1e6:.2f} M parameters, input {tuple(x.shape)}, {n_ops} ops"]
    lines.append(
        f"  one forward: bare {one['bare'] * 1e3:.2f} ms | naive mode "
        f"{one['naive mode'] * 1e3:.2f} ms ({per_op(one['naive mode'], one['bare'], n_ops):.1f} "
        f"us/op) | recorder, one run {one['recorder'] * 1e3:.2f} ms "
        f"({per_op(one['recorder'], one['bare'], n_ops):.1f} us/op)"
    )
    total = n_ops * runs
    naive_op = per_op(many["naive mode"], many["bare"], total)
    rec_op = per_op(many["recorder"], many["bare"], total)
    py_op = per_op(many["Python recorder"], many["bare"], total)
    lines.append(
        f"  {runs} runs as the plugin does them: bare {many['bare'] * 1e3:.2f} ms | naive mode "
        f"{many['naive mode'] * 1e3:.2f} ms ({naive_op:.1f} us/op) | recorder ({recorder_kind}) "
        f"{many['recorder'] * 1e3:.2f} ms ({rec_op:.1f} us/op) | recorder/naive per op "
        f"{rec_op / naive_op:.2f}"
    )
    lines.append(
        "  the Python recorder (with the native digest), same runs: "
        f"{many['Python recorder'] * 1e3:.2f} ms "
        f"({py_op:.1f} us/op) | Python recorder/naive per op {py_op / naive_op:.2f}"
    )
    floor = per_op(one["call-only mode"], one["bare"], n_ops)
    kernel = per_op(kernels["digests"], kernels["nothing"], n_ops)
    rest = per_op(one["recorder"], one["bare"], n_ops) - kernel
    lines.append(
        f"  per-op breakdown of one recorded run ({recorder_kind} recorder, every parameter "
        f"digested): digest kernels on the outputs {kernel:.1f} us | bookkeeping and "
        f"parameter digests {rest:.1f} us | (a Python dispatch mode's floor alone: {floor:.1f} us)"
    )
    return lines


def interleaved(variants: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best (minimum) seconds per call of each variant, the variants alternating every repeat.

    Time is the CPU time of the calling thread, where torch computes with one
    intra-op thread: other processes on a shared machine do not inflate it.
    The minimum is the figure least disturbed by what remains (caches).
    """
    for fn in variants.values():  # warm-up (allocator, oneDNN primitives, native load)
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, fn in variants.items():
            start = CLOCK()
            fn()
            times[name].append(CLOCK() - start)
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

    def recorded_forward(count: bool = False) -> int:
        # The plugin's runner: the native recorder where the extension is built.
        runner = Runs(CompileWatch())
        runner.begin()
        with torch.no_grad():
            model(x)
        runner.end()
        return len(runner.records[0].log.loaded().calls) if count else 0

    n_ops = recorded_forward(count=True)
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
        f"  one forward under the plugin's recorder: bare {t_mode['bare'] * 1e3:8.2f} ms | "
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
        f"CPU: {describe(FEATURES)}",
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} thread(s), digest backend: {digest.backend()}, N={args.runs}, "
        f"best of {args.repeat} interleaved repeats (thread CPU time), "
        f"load average {os.getloadavg()[0]:.1f}",
        "",
    ]
    lines = header
    torch.manual_seed(0)
    lines += bench_modes(
        "resnet18-sized CNN forward",
        resnet18(),
        torch.randn(2, 3, 112, 112),
        args.runs,
        args.repeat,
    )
    for name, model, x in cases:
        lines += bench_model(name, model, x, args.runs, args.repeat)
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
