"""Overhead of the leak guard: 2,000 trivial torch tests, plugin on vs off.

Both runs happen side by side in one invocation, alternating, so machine
noise hits both equally.  Also reports the microseconds per test spent in
the guard's snapshot + compare, measured directly on the registry.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = 2000


def _write_suite(root: Path, count: int) -> None:
    body = ["import torch", ""]
    body += [f"def test_{i}():\n    assert torch.backends.cudnn.enabled\n" for i in range(count)]
    (root / "test_trivial.py").write_text("\n".join(body))
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly -p no:cacheprovider\n")


def _run(root: Path, extra: list[str]) -> float:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *extra],
        cwd=root,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(out.stdout[-2000:] + out.stderr[-2000:])
    return elapsed


def _guard_cost(rounds: int = 20000) -> float:
    from pytest_backends.flags import registry

    reg = registry()
    expected = reg.fingerprint()
    start = time.perf_counter()
    for _ in range(rounds):
        # one fingerprint before setup, one after teardown, one comparison
        before = reg.fingerprint()
        after = reg.fingerprint()
        _ = before == after == expected
    return (time.perf_counter() - start) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tests", type=int, default=TESTS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", dest="output", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp1:
        root, single = Path(tmp), Path(tmp1)
        _write_suite(root, args.tests)
        _write_suite(single, 1)
        _run(root, [])  # warm the file cache and bytecode
        on: list[float] = []
        off: list[float] = []
        on1: list[float] = []
        off1: list[float] = []
        for _ in range(args.repeats):
            off.append(_run(root, ["-p", "no:backends"]))
            on.append(_run(root, []))
            off1.append(_run(single, ["-p", "no:backends"]))
            on1.append(_run(single, []))
    t_on, t_off = min(on), min(off)
    fixed = min(on1) - min(off1)
    per_test = ((t_on - t_off) - fixed) / (args.tests - 1) * 1e6
    lines = [
        f"overhead: {args.tests} trivial tests, best of {args.repeats} alternating runs",
        f"  bare pytest (-p no:backends): {t_off:.3f} s  ({t_off / args.tests * 1e6:.0f} us/test)",
        f"  with pytest-backends:         {t_on:.3f} s  ({t_on / args.tests * 1e6:.0f} us/test)",
        f"  ratio plugin / bare:          {t_on / t_off:.3f}  ({(t_on / t_off - 1) * 100:+.1f} %)",
        f"  fixed cost (1-test suite):    {fixed * 1e3:+.0f} ms (plugin import and setup)",
        f"  per-test cost:                {per_test:.0f} us/test "
        f"({per_test / (t_off / args.tests * 1e6) * 100:.1f} % of a bare trivial test)",
        f"  guard snapshot+compare:       {_guard_cost():.1f} us/test (direct measurement)",
    ]
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
