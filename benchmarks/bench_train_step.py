"""Cost of ``--backends-determinism`` on a Transformer train step, against the body run by hand.

The test body is one training step of a ``torch.nn.TransformerEncoderLayer``
(d_model 256, 4 heads, feed-forward 1024, batch 16 x 32 tokens): the layer and
an ``AdamW`` optimizer are made from a fixed seed, then forward, a mean-square
loss, backward and one optimizer step.

The anchor is the same body run N times by hand in a plain session (a loop in
the test), N being the number of runs of the check; the checked session runs
the body once per test and lets ``--backends-determinism=N
--backends-determinism-all`` run it N times and compare the runs. Both run in
pytest subprocesses, sessions interleaved round by round, each test repeated
``--reps`` times in its session; the figure is the process CPU time of each
test's call phase (everything the check adds happens there; torch computes
with one intra-op thread), min and median over every repetition of every
round, the first repetition of each session left out (warm-up). N=2 (the
smallest check) and N=5 (the default) are both measured, with the native
recorder (the default; on an AVX-512 CPU also with the digest's AVX2 path,
``PYTEST_BACKENDS_DIGEST_ISA=avx2``), the Python recorder with the native
digest, and the full fallback (``PYTEST_BACKENDS_NATIVE=off``: the Python
recorder, the digest computed with torch operations).

An in-process breakdown of one recorded run follows: bare, each recorder, a
Python dispatch mode that only calls the op (the floor of any Python
recorder), and the digest kernel alone over the outputs that run produces.

Usage::

    python benchmarks/bench_train_step.py [--rounds 3] [--reps 4] [--out PATH]

Results go to stdout and ``benchmarks/results/train-step-cpu.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import cpu_flags, describe, write_result

OUT = Path(__file__).parent / "results" / "train-step-cpu.txt"
#: The CPU features the digest kernels and oneDNN dispatch on.
FEATURES = ("avx2", "avx512f", "avx512dq", "avx512_bf16", "amx_tile")
#: The goal: the checked call phase over the anchor's.
GOAL = 1.15
#: The checked variants: the recorder and the digest each records with.
LABELS = {
    "native": "native recorder",
    "native-avx2": "native recorder, AVX2 digest path",
    "python": "Python recorder, native digest",
    "fallback": "Python recorder, torch-op digest",
}

SUITE = """
import os

import torch

torch.set_num_threads(1)
STEPS = int(os.environ.get("TRAIN_STEPS", "1"))


def train_step():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, batch_first=True)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    x = torch.randn(16, 32, 256)
    loss = layer(x).pow(2).mean()
    loss.backward()
    opt.step()
    return loss.detach()


def test_train_step(rep):
    for _ in range(STEPS):
        train_step()
"""

CONFTEST = """
import json
import os
import time

import pytest

TIMES = []

if os.environ.get("TRAIN_RECORDER") == "python":
    # The Python recorder with the native digest (the extension stays loaded).
    from pytest_backends.determinism import record_native

    record_native.recorder_choice = lambda: (None, "Python (chosen by the benchmark)")


def pytest_generate_tests(metafunc):
    if "rep" in metafunc.fixturenames:
        metafunc.parametrize("rep", range(int(os.environ.get("TRAIN_REPS", "5"))))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    start = time.process_time()
    try:
        return (yield)
    finally:
        TIMES.append(time.process_time() - start)


def pytest_sessionfinish(session):
    with open(os.environ["TRAIN_TIMES"], "w") as f:
        json.dump(TIMES, f)
"""


def run_session(root: Path, extra: list[str], env_extra: dict[str, str]) -> list[float]:
    """Call-phase CPU seconds of every repetition in one pytest session."""
    times = root / "times.json"
    env = dict(os.environ, TRAIN_TIMES=str(times), OMP_NUM_THREADS="1", **env_extra)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*argv, *extra], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"session failed ({' '.join(extra)}):\n{proc.stdout}{proc.stderr}")
    if extra and (" 0 not checked" not in proc.stdout or "nondeterministic op" in proc.stdout):
        raise SystemExit(f"the body was not checked clean ({' '.join(extra)}):\n{proc.stdout}")
    data: list[float] = json.loads(times.read_text())
    return data[1:]  # the first repetition warms up (lazy imports, oneDNN primitives)


def breakdown() -> list[str]:
    """One recorded run in this process: bare, native recorder, digest kernels alone."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from pytest_backends.determinism.record_native import NativeRecorder, native_module
    from pytest_backends.determinism.record_python import PythonRecorder

    torch.set_num_threads(1)
    namespace: dict[str, Any] = {}
    exec(compile(textwrap.dedent(SUITE), "suite", "exec"), namespace)
    step = namespace["train_step"]
    module = native_module()
    if module is None:
        return ["(no native extension: no in-process breakdown)"]

    class Keep(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.outputs: list[torch.Tensor] = []

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            self.outputs += [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            return out

    with Keep() as keep:
        step()
    outputs = [
        t.detach().clone()
        for t in keep.outputs
        if t.layout == torch.strided and t.numel() and not t._is_view()
    ]
    nbytes = sum(t.numel() * t.element_size() for t in outputs)
    digest = torch.ops.pytest_backends.digest.default

    def bare() -> None:
        step()

    def recorded() -> None:
        rec = NativeRecorder(module)
        with rec:
            step()
        rec.finish()

    def digests() -> None:
        for t in outputs:
            digest(t)

    class CallOnly(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return func(*args, **(kwargs or {}))

    def call_only() -> None:
        with CallOnly():
            step()

    def python_recorded() -> None:
        with PythonRecorder() as rec:
            step()
        rec.finish()

    variants = {
        "bare": bare,
        "recorded": recorded,
        "digests": digests,
        "call-only": call_only,
        "python": python_recorded,
    }
    for fn in variants.values():
        fn()
    best = dict.fromkeys(variants, 1e9)
    for _ in range(7):
        for name, fn in variants.items():
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    ms = {name: seconds * 1e3 for name, seconds in best.items()}
    gbs = nbytes / max(best["digests"], 1e-9) / 1e9
    return [
        f"one run in-process (min of 7): bare {ms['bare']:.1f} ms | native recorder "
        f"{ms['recorded']:.1f} ms (+{ms['recorded'] - ms['bare']:.1f}) | Python recorder "
        f"{ms['python']:.1f} ms (+{ms['python'] - ms['bare']:.1f}) | a Python dispatch mode "
        f"that only calls the op {ms['call-only']:.1f} ms (+{ms['call-only'] - ms['bare']:.1f})",
        f"the digest kernel alone over the run's {len(outputs)} op outputs that are not "
        f"views ({nbytes / 2**20:.1f} MiB): {ms['digests']:.1f} ms ({gbs:.1f} GB/s)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of sessions")
    parser.add_argument("--reps", type=int, default=4, help="repetitions per session")
    parser.add_argument("--runs", type=int, nargs="+", default=[2, 5], help="values of N")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    variants: dict[str, tuple[list[str], dict[str, str]]] = {}
    for n in args.runs:
        check = [f"--backends-determinism={n}", "--backends-determinism-all"]
        variants[f"anchor N={n}"] = ([], {"TRAIN_STEPS": str(n)})
        variants[f"native N={n}"] = (check, {})
        if "avx512f" in cpu_flags():  # the path an AVX2-only CPU takes, on this one
            variants[f"native-avx2 N={n}"] = (check, {"PYTEST_BACKENDS_DIGEST_ISA": "avx2"})
        variants[f"python N={n}"] = (check, {"TRAIN_RECORDER": "python"})
        variants[f"fallback N={n}"] = (check, {"PYTEST_BACKENDS_NATIVE": "off"})
    samples: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "test_train.py").write_text(textwrap.dedent(SUITE))
        (root / "conftest.py").write_text(textwrap.dedent(CONFTEST))
        for _ in range(args.rounds):
            for name, (extra, env) in variants.items():
                env = dict(env, TRAIN_REPS=str(args.reps))
                samples[name] += run_session(root, extra, env)
    lines = [
        "--backends-determinism on a Transformer train step vs the body run N times by hand",
        f"CPU: {describe(FEATURES)}; load average {os.getloadavg()[0]:.1f}",
        "body: TransformerEncoderLayer(256, 4, ff 1024), batch 16 x 32 tokens, forward, "
        "backward, AdamW step; 1 thread",
        f"process CPU time of the call phase; {args.rounds} interleaved rounds x {args.reps} "
        f"repetitions (the first of each session left out: warm-up); min / median; "
        f"goal <= {GOAL:.2f}x",
        "",
    ]
    for n in args.runs:
        anchor = samples[f"anchor N={n}"]
        a_min, a_med = min(anchor), statistics.median(anchor)
        lines.append(f"N={n}: body x{n} by hand {a_min * 1e3:7.1f} / {a_med * 1e3:7.1f} ms")
        for variant, label in LABELS.items():
            got = samples.get(f"{variant} N={n}")
            if not got:
                continue
            g_min, g_med = min(got), statistics.median(got)
            lines.append(
                f"  {label:36s} {g_min * 1e3:7.1f} / {g_med * 1e3:7.1f} ms | "
                f"ratio {g_min / a_min:.2f}x / {g_med / a_med:.2f}x"
            )
    lines += breakdown()
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
