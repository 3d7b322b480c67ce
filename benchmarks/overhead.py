"""Overhead of the plugin on a plain suite: 2,000 trivial torch tests, plugin on vs off.

Measured on process CPU time (user + sys of the pytest child, from
``os.wait4``), never wall time: the machines are shared and noisy. The runs
alternate (off, on, off, on, ...) so drift hits both sides equally, and each
side reports its minimum and median. A one-test suite run the same way gives
the fixed cost (plugin import and setup), so the per-test figure is the slope
``((on - on_1) - (off - off_1)) / (tests - 1)``, on the minima and on the
medians.  A fixed cost not clearly above the run-to-run noise is printed as such,
never as a negative figure.  One registry fingerprint (the guard takes one
before a test's setup and one after its teardown) is also timed directly, in a
fresh interpreter, on CPU time (min and median of rounds).  With ``--before DIR``
an older source tree is measured in the same interleaved rounds, for a
before/after comparison under the same load.  ``--parametrized`` writes the suite
as one parametrized function (pytest sets up a stand-in fixture per parameter).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_machine import describe, write_result

TESTS = 2000
RESULT = Path(__file__).resolve().parent / "results" / "overhead-cpu.txt"


def write_suite(root: Path, count: int, parametrized: bool = False) -> None:
    """The trivial torch suite (``count`` tests, or one function with ``count`` cases)."""
    body = ["import pytest", "import torch", ""]
    if parametrized:
        body += [
            f"@pytest.mark.parametrize('case', range({count}))",
            "def test_case(case):\n    assert torch.backends.cudnn.enabled\n",
        ]
    else:
        body += [
            f"def test_{i}():\n    assert torch.backends.cudnn.enabled\n" for i in range(count)
        ]
    (root / "test_trivial.py").write_text("\n".join(body))
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly -p no:cacheprovider\n")


def _child_env() -> dict[str, str]:
    """The environment of a measured run: this one, with bytecode caching allowed.

    An installed package runs from its cached bytecode; with
    ``PYTHONDONTWRITEBYTECODE`` set (as some CI and container images do) every
    run would compile the plugin's sources again and charge that to the plugin.
    The warm-up runs write the caches.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _cpu_seconds(root: Path, extra: list[str], source: Path | None = None) -> float:
    """User + system CPU seconds of one pytest run in ``root``.

    ``source``: a source tree whose ``pytest_backends`` is imported instead
    of the installed one (put first on ``PYTHONPATH``).
    """
    env = _child_env()
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *extra],
        cwd=root,
        env=env,
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


_FINGERPRINT = """
import statistics, sys, time
from pytest_backends.flags import registry
reg = registry()
reg.fingerprint()
rounds = []
for _ in range(int(sys.argv[1])):
    start = time.process_time()
    for _ in range(2000):
        reg.fingerprint()
    rounds.append((time.process_time() - start) / 2000 * 1e6)
print(min(rounds), statistics.median(rounds), len(reg.snapshot_rows), len(reg.fingerprint()))
"""


def _guard_cost(source: Path | None = None, rounds: int = 15) -> tuple[float, float, int, int]:
    """CPU microseconds of one registry fingerprint (min and median of ``rounds``), rows, reads.

    Run in a fresh interpreter, so that ``source`` (an older tree) can be timed the same way.
    """
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", _FINGERPRINT, str(rounds)],
        env=env,
        cwd=tempfile.gettempdir(),  # not a source tree: its package would come first
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), int(out[3])


_IN_SESSION = """
import contextlib, io, statistics, sys, time
import pytest, torch
from pytest_backends.flags import registry
reg = registry()
real, taken = reg.fingerprint, []
def timed():
    start = time.perf_counter_ns()
    fp = real()
    taken.append(time.perf_counter_ns() - start)
    return fp
reg.fingerprint = timed
with contextlib.redirect_stdout(io.StringIO()):
    pytest.main(["-q", "-p", "no:xdist"])
print(statistics.median(taken) / 1e3, statistics.mean(taken) / 1e3, len(taken))
"""


def _guard_cost_in_session(root: Path, source: Path | None = None) -> tuple[float, float, int]:
    """Microseconds of one fingerprint taken by the guard in a session (median, mean), count.

    Wall time of each call, in a real session of the suite in ``root``: between
    tests the caches hold pytest's data, so a fingerprint there costs more than
    in the tight loop of :func:`_guard_cost`.
    """
    env = _child_env()
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", _IN_SESSION],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[-3]), float(out[-2]), int(out[-1])


_OWN_HOOKS = """
import contextlib, inspect, io, sys, time
import pytest
from pytest_backends.flags import registry
ns = time.perf_counter_ns
spent, calls, tests, prints = [0], [0], [0], [0]
reg = registry()
real = reg.fingerprint
def fingerprint():
    start = ns()
    try:
        return real()
    finally:
        prints[0] += ns() - start
reg.fingerprint = fingerprint

def plain(fn):
    def timed(*args):
        start = ns()
        try:
            return fn(*args)
        finally:
            spent[0] += ns() - start
            calls[0] += 1
    return timed

def generator(fn):
    def timed(*args):
        start = ns()
        gen = fn(*args)
        try:
            sent = gen.send(None)
        finally:
            spent[0] += ns() - start
            calls[0] += 1
        while True:
            got = failed = None
            try:
                got = yield sent
            except BaseException as exc:
                failed = exc
            start = ns()
            try:
                sent = gen.send(got) if failed is None else gen.throw(failed)
            except StopIteration as stop:
                return stop.value
            finally:
                spent[0] += ns() - start
    return timed

class Timer:
    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config):
        pm = config.pluginmanager
        for name in dir(pm.hook):
            caller = getattr(pm.hook, name)
            for impl in getattr(caller, "get_hookimpls", lambda: [])():
                owner = getattr(impl.plugin, "__name__", type(impl.plugin).__module__)
                if str(owner).startswith("pytest_backends"):
                    fn = impl.function
                    impl.function = (generator if inspect.isgeneratorfunction(fn) else plain)(fn)

    def pytest_runtest_logfinish(self):
        tests[0] += 1

    def pytest_sessionstart(self):
        spent[0] = calls[0] = prints[0] = 0  # from collection on: configure is fixed cost

with contextlib.redirect_stdout(io.StringIO()):
    pytest.main(["-q", "-p", "no:xdist"], plugins=[Timer()])
print(spent[0] / 1e3 / tests[0], prints[0] / 1e3 / tests[0], calls[0] / tests[0], tests[0])
"""


def _own_hooks(root: Path) -> tuple[float, float, float, int]:
    """Microseconds per test inside pytest-backends' hooks and in fingerprints, calls, tests.

    Wall time of each call of the plugin's own hook functions in a real
    session of the suite in ``root`` (from session start: collection and
    every test), divided by the tests: the plugin's share measured where it
    is spent, not as the difference of two noisy session totals.
    """
    out = subprocess.run(
        [sys.executable, "-c", _OWN_HOOKS],
        env=_child_env(),
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[-4]), float(out[-3]), float(out[-2]), int(out[-1])


def _session_line(cost: tuple[float, float, int]) -> str:
    return f"{cost[0]:.1f} us median, {cost[1]:.1f} mean ({cost[2]} fingerprints, wall time)"


def _guard_line(cost: tuple[float, float, int, int]) -> str:
    return f"{cost[0]:.1f} us CPU min, {cost[1]:.1f} median ({cost[2]} rows in {cost[3]} reads)"


def _summary(name: str, values: list[float]) -> str:
    return f"min {min(values):.3f} s, median {statistics.median(values):.3f} s ({name})"


def _spread(*series: list[float]) -> float:
    """The run-to-run noise: the largest median - min gap of ``series``."""
    return max(statistics.median(s) - min(s) for s in series)


def _fixed_line(on1: list[float], off1: list[float]) -> str:
    """The fixed cost (plugin import and setup), or why it cannot be told from noise."""
    by_min = (min(on1) - min(off1)) * 1e3
    by_median = (statistics.median(on1) - statistics.median(off1)) * 1e3
    noise = _spread(on1, off1) * 1e3
    figures = f"min of {min(on1):.3f} s vs {min(off1):.3f} s"
    if by_min <= noise or by_median <= noise:
        return (
            f"not clearly above the run-to-run noise of {noise:.0f} ms "
            f"({by_min:.0f} ms on the minima, {by_median:.0f} ms on the medians; {figures})"
        )
    return f"{by_min:.0f} ms CPU on the minima, {by_median:.0f} ms on the medians ({figures})"


def _per_test(on: float, off: float, on1: float, off1: float, tests: int) -> float:
    """Microseconds of plugin CPU per test: the slope between the 1-test and N-test suites."""
    return ((on - on1) - (off - off1)) / (tests - 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tests", type=int, default=TESTS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", dest="output", type=Path, default=RESULT)
    parser.add_argument(
        "--parametrized",
        action="store_true",
        help="one test function parametrized over the cases instead of one function per test",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="also measure the package of this source tree (e.g. a worktree of an older "
        "commit), interleaved with the others, for a before/after comparison",
    )
    args = parser.parse_args()
    off: list[float] = []
    on: list[float] = []
    off1: list[float] = []
    on1: list[float] = []
    before: list[float] = []
    before1: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp1:
        root, single = Path(tmp), Path(tmp1)
        write_suite(root, args.tests, args.parametrized)
        write_suite(single, 1, args.parametrized)
        _cpu_seconds(root, [])  # warm the file cache and bytecode
        _cpu_seconds(root, ["-p", "no:backends"])
        if args.before is not None:
            _cpu_seconds(root, [], args.before)
        for round_ in range(args.repeats):
            # alternate which side goes first, so that a trend favours neither
            sides: list[tuple[list[float], Path, bool, Path | None]] = [
                (off, root, True, None),
                (on, root, False, None),
                (off1, single, True, None),
                (on1, single, False, None),
            ]
            if args.before is not None:
                sides += [(before, root, False, args.before), (before1, single, False, args.before)]
            for values, where, bare, source in sides if round_ % 2 == 0 else reversed(sides):
                values.append(_cpu_seconds(where, ["-p", "no:backends"] if bare else [], source))
        in_session = _guard_cost_in_session(root)
        own = min((_own_hooks(root) for _ in range(3)), key=lambda got: got[0])
        before_in_session = (
            _guard_cost_in_session(root, args.before) if args.before is not None else None
        )
    per_min = _per_test(min(on), min(off), min(on1), min(off1), args.tests)
    per_median = _per_test(*(statistics.median(v) for v in (on, off, on1, off1)), tests=args.tests)
    per_bare = (min(off) - min(off1)) / (args.tests - 1) * 1e6  # without torch's import
    text = "\n".join(
        [
            f"machine: {describe(('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile'))}",
            f"overhead: {args.tests} trivial torch tests"
            + (" (one parametrized function)" if args.parametrized else "")
            + ", process CPU time (user+sys), "
            f"{args.repeats} interleaved runs per side and suite size",
            f"  bare pytest (-p no:backends): {_summary('bare', off)}",
            f"  with pytest-backends:         {_summary('plugin', on)}",
            f"  session CPU ratio plugin/bare: {min(on) / min(off):.3f} on the minima, "
            f"{statistics.median(on) / statistics.median(off):.3f} on the medians",
            f"  fixed cost (1-test suite):    {_fixed_line(on1, off1)}",
            f"  per-test cost:                {per_min:.0f} us CPU/test on the minima, "
            f"{per_median:.0f} on the medians ({per_min / per_bare * 100:.1f} % of a bare "
            f"trivial test's {per_bare:.0f} us; noise of the {args.tests}-test runs "
            f"{_spread(on, off) / args.tests * 1e6:.0f} us/test)",
            f"  one registry fingerprint:     {_guard_line(_guard_cost())} (direct; "
            "the guard takes two per test)",
            f"  one fingerprint in the session: {_session_line(in_session)}",
            f"  inside the plugin's hooks:    {own[0]:.1f} us/test wall, {own[1]:.1f} of them in "
            f"fingerprints (least of 3 sessions; {own[2]:.1f} hook calls per test, {own[3]} "
            f"tests): {1 + own[0] / per_bare:.3f}x a bare trivial test's {per_bare:.0f} us",
        ]
    )
    if args.before is not None:
        before_min = _per_test(min(before), min(off), min(before1), min(off1), args.tests)
        before_median = _per_test(
            *(statistics.median(v) for v in (before, off, before1, off1)), tests=args.tests
        )
        text += "\n".join(
            [
                "",
                f"before ({args.before}), in the same interleaved rounds:",
                f"  with pytest-backends (before): {_summary('before', before)}",
                f"  session CPU ratio before/bare: {min(before) / min(off):.3f} on the minima, "
                f"{statistics.median(before) / statistics.median(off):.3f} on the medians",
                f"  per-test cost (before):       {before_min:.0f} us CPU/test on the minima, "
                f"{before_median:.0f} on the medians",
                f"  now/before session CPU:       {min(on) / min(before):.3f} on the minima, "
                f"{statistics.median(on) / statistics.median(before):.3f} on the medians",
                f"  one registry fingerprint (before): {_guard_line(_guard_cost(args.before))}",
                f"  one fingerprint in the session (before): {_session_line(before_in_session)}"
                if before_in_session is not None
                else "",
            ]
        )
    write_result(text, args.output)


if __name__ == "__main__":
    main()
