"""Overhead of the plugin on a plain suite: 2,000 trivial torch tests, plugin on vs off.

Measured on process CPU time (user + sys of the pytest child, from
``os.wait4``), never wall time: the machines are shared and noisy. The runs
alternate (off, on, off, on, ...) so drift hits both sides equally, and each
side reports its minimum and median. A one-test suite run the same way gives
the fixed cost (plugin import and setup), so the per-test figure is
``(on - off - fixed) / (tests - 1)``. The guard's own snapshot + compare is
also timed directly on the registry, in this process, on CPU time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_machine import describe, write_result

TESTS = 2000
RESULT = Path(__file__).resolve().parent / "results" / "overhead-cpu.txt"


def _write_suite(root: Path, count: int) -> None:
    body = ["import torch", ""]
    body += [f"def test_{i}():\n    assert torch.backends.cudnn.enabled\n" for i in range(count)]
    (root / "test_trivial.py").write_text("\n".join(body))
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly -p no:cacheprovider\n")


def _cpu_seconds(root: Path, extra: list[str]) -> float:
    """User + system CPU seconds of one pytest run in ``root``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *extra],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(output.decode(errors="replace")[-3000:])
    return usage.ru_utime + usage.ru_stime


def _guard_cost(rounds: int = 20000) -> float:
    """CPU microseconds of two registry fingerprints and a comparison (what a test costs)."""
    from pytest_backends.flags import registry

    reg = registry()
    expected = reg.fingerprint()
    start = time.process_time()
    for _ in range(rounds):
        before = reg.fingerprint()
        after = reg.fingerprint()
        _ = before == after == expected
    return (time.process_time() - start) / rounds * 1e6


def _summary(name: str, values: list[float]) -> str:
    return f"min {min(values):.3f} s, median {statistics.median(values):.3f} s ({name})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tests", type=int, default=TESTS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", dest="output", type=Path, default=RESULT)
    args = parser.parse_args()
    off: list[float] = []
    on: list[float] = []
    off1: list[float] = []
    on1: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp1:
        root, single = Path(tmp), Path(tmp1)
        _write_suite(root, args.tests)
        _write_suite(single, 1)
        _cpu_seconds(root, [])  # warm the file cache and bytecode
        for _ in range(args.repeats):
            off.append(_cpu_seconds(root, ["-p", "no:backends"]))
            on.append(_cpu_seconds(root, []))
            off1.append(_cpu_seconds(single, ["-p", "no:backends"]))
            on1.append(_cpu_seconds(single, []))
    t_off, t_on = min(off), min(on)
    fixed = min(on1) - min(off1)
    per_test = ((t_on - t_off) - fixed) / (args.tests - 1) * 1e6
    per_bare = (t_off - min(off1)) / (args.tests - 1) * 1e6  # without torch's import
    text = "\n".join(
        [
            f"machine: {describe(('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile'))}",
            f"overhead: {args.tests} trivial torch tests, process CPU time (user+sys), "
            f"{args.repeats} alternating runs per side",
            f"  bare pytest (-p no:backends): {_summary('bare', off)}",
            f"  with pytest-backends:         {_summary('plugin', on)}",
            f"  session CPU ratio plugin/bare: {t_on / t_off:.3f} on the minima, "
            f"{statistics.median(on) / statistics.median(off):.3f} on the medians",
            f"  fixed cost (1-test suite):    {fixed * 1e3:+.0f} ms CPU "
            f"(min of {min(on1):.3f} s vs {min(off1):.3f} s)",
            f"  per-test cost:                {per_test:.0f} us CPU/test "
            f"({per_test / per_bare * 100:.1f} % of a bare trivial test's {per_bare:.0f} us)",
            f"  guard snapshot+compare:       {_guard_cost():.1f} us CPU/test (direct)",
        ]
    )
    write_result(text, args.output)


if __name__ == "__main__":
    main()
