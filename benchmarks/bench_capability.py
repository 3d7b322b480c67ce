"""Wall time of a 3-level CPU capability run against running the suite 3 times by hand.

Generates a small torch suite (convolutions, matmuls, attention, reductions)
in a temporary directory and times, with the same pytest and torch:

* ``by hand``: three plain ``pytest`` runs in a row, each with
  ``ATEN_CPU_CAPABILITY`` (and the matching oneDNN/MKL caps) set by the caller;
* ``plugin``: one ``pytest --backends-cpu-capability=default,avx2,avx512`` run,
  which starts one process per level and merges the results (levels one
  after another, and with ``--backends-cpu-capability-jobs=3`` side by side);
* by hand and plugin with ``-n 2`` (pytest-xdist).

Usage::

    python benchmarks/bench_capability.py [--tests 40] [--repeat 3] [--out PATH]

Results go to stdout and to ``benchmarks/results/capability-cpu.txt``.
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
from collections.abc import Sequence
from pathlib import Path

from pytest_backends.capability import levels as capability

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


def _run(args: Sequence[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed:\n{proc.stdout[-3000:]}")
    return elapsed


def _by_hand(cwd: Path, extra: Sequence[str]) -> float:
    total = 0.0
    for level in LEVELS:
        env = {**os.environ, **capability.level_env(level)}
        total += _run(extra, cwd, env)
    return total


def _plugin(cwd: Path, extra: Sequence[str]) -> float:
    levels = ",".join(LEVELS)
    return _run([f"--backends-cpu-capability={levels}", *extra], cwd, dict(os.environ))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=10, help="cases per test function")
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

    with tempfile.TemporaryDirectory(prefix="bench-capability-") as tmp:
        suite = Path(tmp)
        (suite / "test_suite.py").write_text(SUITE.replace("{n}", str(options.tests)))
        (suite / "pytest.ini").write_text("[pytest]\n")
        rows: list[tuple[str, list[float]]] = []
        for label, fn, extra in (
            ("by hand: 3 runs, -n 0", _by_hand, ()),
            ("plugin: 1 run, -n 0", _plugin, ()),
            ("plugin: 1 run, -n 0, jobs 3", _plugin, ("--backends-cpu-capability-jobs=3",)),
            ("by hand: 3 runs, -n 2", _by_hand, ("-n", "2")),
            ("plugin: 1 run, -n 2", _plugin, ("-n", "2")),
        ):
            times = [fn(suite, extra) for _ in range(options.repeat)]
            rows.append((label, times))
            print(f"{label:30s} median {statistics.median(times):6.2f} s", flush=True)

    per_level = 4 * options.tests
    lines = [
        "CPU capability levels: 3-level run vs the suite run 3 times by hand",
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"suite: {per_level} tests x {len(LEVELS)} levels ({', '.join(LEVELS)}); "
        f"median of {options.repeat} (wall seconds)",
        "",
    ]
    for label, times in rows:
        shown = ", ".join(f"{t:.2f}" for t in times)
        lines.append(f"{label:30s} {statistics.median(times):6.2f}   ({shown})")
    base = statistics.median(rows[0][1])
    lines += [
        "",
        f"plugin -n 0 / by hand -n 0: {statistics.median(rows[1][1]) / base:.2f}",
        f"plugin -n 0 jobs 3 / by hand -n 0: {statistics.median(rows[2][1]) / base:.2f}",
        f"plugin -n 2 / by hand -n 2: "
        f"{statistics.median(rows[4][1]) / statistics.median(rows[3][1]):.2f}",
    ]
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
