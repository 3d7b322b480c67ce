"""Cost of ``--backends-determinism=2`` on a small-op CPU suite, against the plain run.

The suite is the kind of test a numerical library has, where ops are tiny and
the recorder's per-op cost matters most:

* ``test_gradcheck``: ``torch.autograd.gradcheck`` of a small float64 function;
* ``test_ode``: an explicit RK4 integration of a small float64 system, a few
  thousand tiny ops;
* ``test_cnn``: a small CNN forward and backward (batch 8, 3x32x32).

Both variants run in pytest subprocesses, interleaved, ``--repeat`` times; a
conftest repeats every test 5 times in the session (``rep``) and keeps the
best call phase of each (steady state: one-time costs such as lazy imports,
the first load of the native extension or of Dynamo, are left to the whole
session's time) and records the time of every test's call phase (everything the check
adds happens there), and the best of the repeats is reported, per test and in
total, with the wall time of the whole session beside it (wall time is disturbed by
other processes on a shared machine; CPU times are not). The per-op floor is
measured in this process on the ODE body: bare, under a Python dispatch mode
that only calls the op, and under each recorder (native and Python), in
microseconds per op (the Python recorder with the native digest). The checked
run is shown twice: with the extension (the native recorder, the default) and
without it (``PYTEST_BACKENDS_NATIVE=off``: the Python recorder and the digest
computed with torch operations, the full fallback).

Usage::

    python benchmarks/bench_suite_determinism.py [--repeat 3] [--out PATH]

Results go to stdout and ``benchmarks/results/suite-determinism-cpu.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import describe, write_result

OUT = Path(__file__).parent / "results" / "suite-determinism-cpu.txt"

SUITE = """
import torch

torch.set_num_threads(1)


def rk4(f, y, h, steps):
    for _ in range(steps):
        k1 = f(y)
        k2 = f(y + 0.5 * h * k1)
        k3 = f(y + 0.5 * h * k2)
        k4 = f(y + h * k3)
        y = y + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


def ode_body(steps=150):
    w = torch.randn(4, 4, dtype=torch.float64) * 0.5
    return rk4(lambda y: torch.tanh(w @ y), torch.ones(4, dtype=torch.float64), 0.01, steps)


def test_gradcheck(rep):
    w = torch.randn(3, 3, dtype=torch.float64)

    def fn(x, b):
        return torch.tanh(x @ w + b).sin().sum(-1)

    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (x, b))


def test_ode(rep):
    y = ode_body()
    assert torch.isfinite(y).all()


def test_cnn(rep):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(32 * 16 * 16, 10),
    )
    out = model(torch.randn(8, 3, 32, 32))
    out.backward(torch.randn_like(out))
"""

CONFTEST = """
import json
import os
import time

import pytest

TIMES = {}


def pytest_generate_tests(metafunc):
    if "rep" in metafunc.fixturenames:
        metafunc.parametrize("rep", range(int(os.environ.get("SUITE_REPS", "5"))))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    start = time.thread_time()  # CPU time: other processes on the machine do not count
    try:
        return (yield)
    finally:
        name = item.originalname  # the best of its repetitions: steady state
        TIMES[name] = min(TIMES.get(name, 1e9), time.thread_time() - start)


def pytest_sessionfinish(session):
    with open(os.environ["SUITE_TIMES"], "w") as f:
        json.dump(TIMES, f)
"""


def run_suite(
    root: Path, extra: list[str], env_extra: dict[str, str] | None = None
) -> tuple[dict[str, float], float]:
    """Call-phase seconds per test, and the session's wall time."""
    times = root / "times.json"
    env = dict(os.environ, SUITE_TIMES=str(times), OMP_NUM_THREADS="1", **(env_extra or {}))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    proc = subprocess.run(
        [*argv, *extra], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"suite failed ({' '.join(extra) or 'plain'}):\n{proc.stdout}{proc.stderr}"
        )
    data: dict[str, float] = json.loads(times.read_text())
    return data, wall


def ode_body() -> Any:
    """The suite's RK4 body, as a function of this process (imports torch)."""
    namespace: dict[str, Any] = {}
    exec(compile(SUITE, "suite", "exec"), namespace)
    return namespace["ode_body"]


def per_op_floor() -> tuple[int, dict[str, float]]:
    """Ops per ODE body and microseconds per op: bare, call-only mode, both recorders."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from pytest_backends.determinism.record_native import NativeRecorder, native_module
    from pytest_backends.determinism.record_python import PythonRecorder

    body = ode_body()
    module = native_module()

    class CallOnly(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return func(*args, **(kwargs or {}))

    with PythonRecorder() as recorder:
        body()
    ops = len(recorder.finish().calls)

    def bare() -> None:
        body()

    def call_only() -> None:
        with CallOnly():
            body()

    def python_recorder() -> None:
        with PythonRecorder() as rec:
            body()
        rec.finish()

    def native_recorder() -> None:
        rec = NativeRecorder(module)
        with rec:
            body()
        rec.finish()

    variants = {
        "bare": bare,
        "call-only mode": call_only,
        "Python recorder (native digest)": python_recorder,
    }
    if module is not None:
        variants["native recorder"] = native_recorder
    best = dict.fromkeys(variants, 1e9)
    for _ in range(7):
        for name, fn in variants.items():
            start = time.thread_time()
            fn()
            best[name] = min(best[name], time.thread_time() - start)
    del torch
    return ops, {name: seconds / ops * 1e6 for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2, help="N for --backends-determinism")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from bench_reproducible import FEATURES

    check = [f"--backends-determinism={args.runs}", "--backends-determinism-all"]
    variants: dict[str, tuple[list[str], dict[str, str]]] = {
        "plain": ([], {}),
        "checked": (check, {}),
        "checked, no extension": (check, {"PYTEST_BACKENDS_NATIVE": "off"}),
    }
    best: dict[str, dict[str, float]] = {}
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "test_small_ops.py").write_text(textwrap.dedent(SUITE))
        (root / "conftest.py").write_text(textwrap.dedent(CONFTEST))
        for _ in range(args.repeat):
            for name, (extra, env) in variants.items():
                times, wall = run_suite(root, extra, env)
                slot = best.setdefault(name, {})
                for test, seconds in times.items():
                    slot[test] = min(slot.get(test, 1e9), seconds)
                walls[name] = min(walls.get(name, 1e9), wall)
    ops, floor = per_op_floor()
    plain = best["plain"]
    lines = [
        f"--backends-determinism={args.runs} vs plain on a small-op CPU suite "
        f"(best of {args.repeat} interleaved sessions, 1 thread, CPU time of the test thread)",
        f"CPU: {describe(FEATURES)}; load average {os.getloadavg()[0]:.1f}",
        "",
    ]
    for variant in ("checked", "checked, no extension"):
        checked = best[variant]
        lines.append(f"{variant}:")
        for test in sorted(plain):
            lines.append(
                f"  {test:15s} plain {plain[test] * 1e3:8.1f} ms | "
                f"checked {checked[test] * 1e3:8.1f} ms"
                f" | ratio {checked[test] / plain[test]:.2f}x"
            )
        total_plain, total_checked = sum(plain.values()), sum(checked.values())
        lines.append(
            f"  call phases     plain {total_plain * 1e3:8.1f} ms | "
            f"checked {total_checked * 1e3:8.1f} ms"
            f" | ratio {total_checked / total_plain:.2f}x"
        )
        lines.append(
            f"  whole session   plain {walls['plain']:8.2f} s  | checked {walls[variant]:8.2f} s "
            f" | ratio {walls[variant] / walls['plain']:.2f}x"
        )
    lines.append(
        f"per-op cost on the ODE body ({ops} ops, one run, us per op): "
        + " | ".join(f"{name} {us:.2f}" for name, us in floor.items())
    )
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
