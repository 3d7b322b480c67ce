"""Wall time of one 3-level CPU capability run against three hand-made runs side by side.

Generates a small torch suite of 40 tests (convolutions, matmuls, attention,
reductions) in a temporary directory and times, with the same pytest and torch
and the same total number of xdist workers:

* ``by hand``: three ``ATEN_CPU_CAPABILITY=<level> pytest -n K`` runs started at
  once (each with the level's oneDNN/MKL caps), waited for together;
* ``plugin``: one ``pytest --backends-cpu-capability=default,avx2,avx512 -n K``
  run, whose level scheduler starts K workers per level.

The two are measured alternately (by hand, plugin, by hand, ...), so both see
the same machine load; the ratio is of the medians.

Usage::

    python benchmarks/bench_capability.py [--tests 10] [--workers 1] [--repeat 3] [--out PATH]

Results go to stdout and to ``benchmarks/results/capability-cpu.txt``, with the
CPU model and its vector features.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_backends.capability import levels as capability

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import cpu_model

LEVELS = ("default", "avx2", "avx512")

SUITE = """
import pytest
import torch
import torch.nn.functional as F

torch.manual_seed(0)


@pytest.mark.parametrize("case", range({n}))
def test_conv(case):
    x = torch.randn(8, 16, 32, 32)
    w = torch.randn(16, 16, 3, 3)
    y = F.conv2d(x, w, padding=1)
    assert y.shape == (8, 16, 32, 32)


@pytest.mark.parametrize("case", range({n}))
def test_matmul(case):
    a = torch.randn(256, 256)
    assert torch.allclose((a @ a.T).diagonal(), (a * a).sum(1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", range({n}))
def test_attention(case):
    q = torch.randn(2, 4, 64, 32)
    out = F.scaled_dot_product_attention(q, q, q)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("case", range({n}))
def test_reductions(case):
    x = torch.randn(4096, 64)
    assert torch.allclose(x.softmax(-1).sum(-1), torch.ones(4096), atol=1e-5)
"""

_BASE = ["-q", "-p", "no:randomly", "-p", "no:cacheprovider"]


def _start(args: Sequence[str], cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *_BASE, *args],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(procs: Sequence[subprocess.Popen[str]]) -> None:
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"pytest {proc.args} failed:\n{out[-3000:]}")


def by_hand(cwd: Path, workers: int) -> float:
    """Three runs, one per level, started together."""
    start = time.perf_counter()
    procs = [
        _start(["-n", str(workers)], cwd, {**os.environ, **capability.level_env(level)})
        for level in LEVELS
    ]
    _wait(procs)
    return time.perf_counter() - start


def plugin(cwd: Path, workers: int) -> float:
    """One run; the plugin starts ``workers`` xdist workers per level."""
    start = time.perf_counter()
    levels = ",".join(LEVELS)
    _wait([_start([f"--backends-cpu-capability={levels}", "-n", str(workers)], cwd, os.environ)])
    return time.perf_counter() - start


def cpu_description() -> str:
    """The CPU model and the vector features the levels need."""
    model = cpu_model()
    wanted = sorted({f for name in LEVELS for f in capability.LEVELS[name].requires})
    have = capability.cpu_features()
    features = " ".join(f"{f}{'+' if f in have else '-'}" for f in wanted)
    return f"{model}; {os.cpu_count()} CPUs; features: {features}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=10, help="cases per test function (x4)")
    parser.add_argument("--workers", type=int, default=1, help="xdist workers per level")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "capability-cpu.txt",
    )
    options = parser.parse_args()
    missing = [lv for lv in LEVELS if capability.unsupported_reason(lv) is not None]
    if missing:
        raise SystemExit(f"this CPU cannot run {missing}; the benchmark needs all of {LEVELS}")

    hand: list[float] = []
    ours: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-capability-") as tmp:
        suite = Path(tmp)
        (suite / "test_suite.py").write_text(SUITE.replace("{n}", str(options.tests)))
        (suite / "pytest.ini").write_text("[pytest]\n")
        for _ in range(options.repeat):
            hand.append(by_hand(suite, options.workers))
            ours.append(plugin(suite, options.workers))
            print(f"by hand {hand[-1]:6.2f} s   plugin {ours[-1]:6.2f} s", flush=True)

    total = len(LEVELS) * options.workers
    ratio = statistics.median(ours) / statistics.median(hand)
    lines = [
        "CPU capability levels: one plugin run vs three hand-made runs side by side",
        f"CPU: {cpu_description()}",
        f"python {platform.python_version()}; suite: {4 * options.tests} tests x "
        f"{len(LEVELS)} levels ({', '.join(LEVELS)}); {options.workers} xdist worker(s) per "
        f"level, {total} in all on both sides; measured alternately, median of "
        f"{options.repeat} (wall seconds)",
        "",
        f"{'by hand: 3 x pytest -n ' + str(options.workers):34s} "
        f"{statistics.median(hand):6.2f}   ({', '.join(f'{t:.2f}' for t in hand)})",
        f"{'plugin: 1 run, -n ' + str(options.workers):34s} "
        f"{statistics.median(ours):6.2f}   ({', '.join(f'{t:.2f}' for t in ours)})",
        "",
        f"plugin / by hand: {ratio:.2f}x (target <= 1.10x)",
    ]
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
