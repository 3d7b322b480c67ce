"""Fuzz every user input of the plugin end to end; expect clear errors and nothing lost.

    python benchmarks/fuzz_inputs.py --sessions 45 --markers 40 \
        --out benchmarks/results/fuzz-cpu.txt

hypothesis generates sessions. Each session is a directory with one test
module of generated tests (each carrying generated ``@pytest.mark.backends``
and ``@pytest.mark.backends_leaks`` arguments, and a body that passes, fails,
skips, leaks a flag or uses ``backend_config``), a module of sentinel tests,
a ``pytest.ini`` with generated values for the plugin's ini keys, and
generated values for its command-line options. Options and ini keys are read
from ``pytest --help``, so a new one is fuzzed without editing this file. The
directory also holds files a hostile path may name: a FIFO, a symlink, a
directory, a foreign JSON file and the test modules themselves.

Every session runs serially and under ``-n 2``. A session passes when:

* no ``INTERNALERROR`` and exit code 0, 1 or, only when an option or ini value
  was generated, 4 (a usage error naming a ``backends`` option or key);
* no traceback shows a frame of the plugin's own code;
* unless it was a usage error, every sentinel test passed and every generated
  test reports an outcome (pass, fail, error, skip; a bad marker is an error
  of that test alone);
* the FIFO, symlink, directory, foreign file and test modules are unchanged.

The script exits non-zero when any session fails, and writes the figures.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import re
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import describe

#: The SIMD features of the CPU that matter to torch's kernels.
SIMD_FEATURES = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile")

ROOT = Path(__file__).resolve().parent.parent

# --- what the plugin accepts ----------------------------------------------------------------


@dataclass(frozen=True)
class Surface:
    """The plugin's options (name -> takes a value, metavar) and ini keys."""

    options: dict[str, str | None]
    ini_keys: list[str]


def discover(python: str = sys.executable) -> Surface:
    """Read the ``--backends-*`` options and ``backends_*`` ini keys from ``pytest --help``."""
    text = subprocess.run(
        [python, "-m", "pytest", "--help", "-p", "no:randomly"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        timeout=300,
        check=False,
    ).stdout
    options: dict[str, str | None] = {}
    for match in re.finditer(r"^  (--backends-[a-z0-9-]+)(?:=\[?([A-Z]+)\]?)?", text, re.M):
        options[match.group(1)] = match.group(2)
    ini = sorted(set(re.findall(r"^  (backends_[a-z0-9_]+) \(", text, re.M)))
    if not options or not ini:
        raise SystemExit(f"no backends options found in pytest --help:\n{text[-2000:]}")
    return Surface(options, ini)


def _registry_words() -> tuple[list[str], list[str]]:
    from pytest_backends.matrix.axes import builtin_registry

    registry = builtin_registry()
    axes = list(registry.names)
    values = sorted({v for axis in registry for v in axis.value_names})
    return axes, values


AXES, VALUES = _registry_words()
TOKENS = [f"{a}-{v}" for a in AXES for v in VALUES][:40]
WORDS = [
    *AXES,
    *VALUES,
    "fail",
    "warn",
    "off",
    "on",
    "all",
    "strict",
    "deterministic",
    "default",
    "",
    " ",
    "0",
    "-1",
    "2",
    "1e9",
    "mkldnn,,",
    "cap-avx2",
    "avx512",
]
PATH_WORDS = [
    "r.json",
    "out.html",
    "census.json",
    "baseline.json",
    "fifo",
    "link",
    "dir",
    "foreign.json",
    "test_gen.py",
    "test_sentinel.py",
    "sub/r.json",
    "",
    " ",
]

# --- generation -------------------------------------------------------------------------------

_safe_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.binary(max_size=4),
    st.text(max_size=10),
    st.sampled_from(WORDS),
    st.sampled_from(TOKENS),
)
junk = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.sampled_from(WORDS), st.text(max_size=4)), inner, max_size=2),
    ),
    max_leaves=6,
)
marker = st.tuples(
    st.sampled_from(["backends", "backends_leaks"]),
    st.lists(junk, max_size=3),
    st.dictionaries(
        st.one_of(st.sampled_from([*AXES, "deterministic", "mode"]), st.text(max_size=6)),
        junk,
        max_size=3,
    ),
)
ACTIONS = ["pass", "fail", "skip", "leak", "config"]
test_case = st.tuples(st.lists(marker, min_size=1, max_size=2), st.sampled_from(ACTIONS))


def option_value(metavar: str | None) -> st.SearchStrategy[str]:
    if metavar == "PATH":
        return st.one_of(st.sampled_from(PATH_WORDS), st.text("abcxyz._-", min_size=1, max_size=8))
    return st.one_of(
        st.sampled_from(WORDS),
        st.sampled_from(TOKENS),
        _safe_text,
        st.integers(-5, 10**12).map(str),
    )


@dataclass
class Session:
    """One generated pytest session."""

    tests: list[tuple[list[tuple[str, list[Any], dict[Any, Any]]], str]]
    options: list[str] = field(default_factory=list)
    ini: dict[str, str] = field(default_factory=dict)

    @property
    def marker_values(self) -> int:
        """How many generated marker arguments the session holds (an empty call counts 1)."""
        return sum(
            len(args) + len(kwargs) or 1 for marks, _ in self.tests for _, args, kwargs in marks
        )

    @property
    def values(self) -> int:
        """How many generated values the session holds (marker arguments, options, ini)."""
        return self.marker_values + len(self.options) + len(self.ini)


def _examples(strategy: st.SearchStrategy[Any], count: int, seed: int) -> list[Any]:
    """``count`` values hypothesis generates from ``strategy`` (reproducible for ``seed``)."""
    found: list[Any] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(value=strategy)
    def collect(value: Any) -> None:
        found.append(value)

    collect()
    # hypothesis may stop early once it has seen every distinct value
    return [found[i % len(found)] for i in range(count)] if found else []


def sessions(surface: Surface, count: int, per_session: int, seed: int) -> list[Session]:
    """``count`` sessions of ``per_session`` generated tests, reproducible for ``seed``.

    The tests are drawn as one stream of ``count * per_session`` examples and
    the option sets as another, so both get hypothesis's full variety.
    """
    option_names = sorted(surface.options)
    ini_values = st.one_of(
        st.sampled_from(WORDS),
        st.sampled_from(PATH_WORDS),
        st.text("abcdefmkldn,-_ 0123456789.", max_size=12),
    )

    @st.composite
    def option_set(draw: st.DrawFn) -> tuple[bool, list[tuple[str, str]], list[str]]:
        matrix = draw(st.booleans())
        # Most sessions get no hostile option, so that their markers run; a bad
        # option value ends a session with a usage error before any test runs.
        hostile = draw(st.sampled_from([0, 0, 0, 0, 0, 0, 0, 1, 2, 3]))
        values = [(draw(option_value("PATH")), draw(option_value(None))) for _ in range(hostile)]
        keys = draw(st.sampled_from([0, 0, 0, 1, 2, 2]))
        return matrix, values, [draw(ini_values) for _ in range(keys)]

    tests = _examples(test_case, count * per_session, seed)
    option_sets = _examples(option_set(), count, seed + 1)
    # Options and ini keys take turns, so that every one of them is fuzzed.
    next_option = itertools.cycle(option_names)
    next_key = itertools.cycle(surface.ini_keys)
    result = []
    for i, (matrix, values, ini_texts) in enumerate(option_sets):
        options = ["--backends-matrix"] if matrix else []
        for path_value, other_value in values:
            name = next(next_option)
            metavar = surface.options[name]
            if metavar is None:
                options.append(name)
            else:
                options.append(f"{name}={path_value if metavar == 'PATH' else other_value}")
        ini = {next(next_key): text for text in ini_texts}
        result.append(Session(tests[i * per_session : (i + 1) * per_session], options, ini))
    return result


# --- rendering --------------------------------------------------------------------------------


def literal(value: Any) -> str:
    """Python source for ``value`` (floats such as nan included)."""
    if isinstance(value, float):
        return f"float({str(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(literal(v) + ", " for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


_BODIES = {
    "pass": "    pass\n",
    "fail": "    assert False, 'planned failure'\n",
    "skip": "    pytest.skip('planned skip')\n",
    "leak": "    import torch\n"
    "    torch.backends.mkldnn.enabled = not torch.backends.mkldnn.enabled\n",
    "config": "    assert backend_config.id\n",
}

SENTINELS = """
import pytest, torch

def test_sentinel_plain():
    assert torch.ones(2).sum() == 2

@pytest.mark.backends("mkldnn")
def test_sentinel_matrix(backend_config):
    assert backend_config.id

class TestSentinel:
    def test_method(self):
        assert True
"""
SENTINEL_NAMES = ("test_sentinel_plain", "test_sentinel_matrix", "test_method")


def render_tests(tests: Session | list[Any]) -> str:
    cases = tests.tests if isinstance(tests, Session) else tests
    lines = ["import pytest", ""]
    for i, (marks, action) in enumerate(cases):
        for name, args, kwargs in marks:
            call = ", ".join([*(literal(a) for a in args), f"**{literal(kwargs)}"])
            lines.append(f"@pytest.mark.{name}({call})")
        fixture = "backend_config" if action == "config" else ""
        lines.append(f"def test_g{i}({fixture}):")
        lines.append(_BODIES[action])
    return "\n".join(lines)


def render_ini(ini: dict[str, str]) -> str:
    return "[pytest]\n" + "".join(f"{k} = {v}\n" for k, v in ini.items())


def prepare_dir(directory: Path, session: Session) -> dict[str, str]:
    """Write the session's files; return a fingerprint of the files that must survive."""
    (directory / "test_gen.py").write_text(render_tests(session), encoding="utf-8")
    (directory / "test_sentinel.py").write_text(SENTINELS, encoding="utf-8")
    (directory / "pytest.ini").write_text(render_ini(session.ini), encoding="utf-8")
    (directory / "foreign.json").write_text('{"mine": true}\n')
    os.mkfifo(directory / "fifo")
    (directory / "link").symlink_to("test_sentinel.py")
    (directory / "dir").mkdir()
    return fingerprint(directory)


def fingerprint(directory: Path) -> dict[str, str]:
    prints = {}
    for name in ("test_gen.py", "test_sentinel.py", "foreign.json", "fifo", "link", "dir"):
        path = directory / name
        st_ = os.lstat(path)
        kind = stat.S_IFMT(st_.st_mode)
        content = path.read_text(encoding="utf-8") if stat.S_ISREG(st_.st_mode) else ""
        prints[name] = f"{kind}:{content}"
    return prints


# --- running and judging ----------------------------------------------------------------------

_OWN_FRAME = re.compile(r"pytest_backends[/\\][\w/\\]*\.py[:\"]")


@dataclass
class Verdict:
    """What one session run showed."""

    ok: bool
    problems: list[str]
    ret: int
    seconds: float
    usage_error: bool = False


def outcomes_from_junit(path: Path) -> dict[str, str]:
    """``{test function name: outcome}`` from JUnit XML (the worst outcome of its items)."""
    import xml.etree.ElementTree as ET

    rank = {"passed": 0, "skipped": 1, "failure": 2, "error": 3}
    result: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = str(case.get("name", "")).split("[")[0]
        tags = [c.tag for c in case if c.tag in rank] or ["passed"]
        outcome = max(tags, key=rank.__getitem__)
        if rank[outcome] >= rank[result.get(name, "passed")]:
            result[name] = outcome
    return result


def run_session(
    session: Session, extra: list[str], timeout: float = 300.0, python: str = sys.executable
) -> Verdict:
    """Run one session in a fresh directory and judge its output."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        directory = Path(tmp)
        before = prepare_dir(directory, session)
        junit = directory / "junit.xml"
        argv = [
            python,
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "-q",
            "--tb=short",
            "-W",
            "ignore::pytest.PytestUnknownMarkWarning",
            *extra,
            *session.options,
        ]
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                argv,
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                errors="replace",
            )
        except subprocess.TimeoutExpired:
            return Verdict(False, [f"timed out after {timeout:.0f} s"], -1, timeout)
        seconds = time.perf_counter() - start
        out = proc.stdout + proc.stderr
        problems = []
        if "INTERNALERROR" in out:
            problems.append("INTERNALERROR")
        frames = sorted(set(_OWN_FRAME.findall(out)))
        if frames:
            problems.append(f"traceback through the plugin: {', '.join(frames[:3])}")
        usage = proc.returncode == 4
        if proc.returncode not in (0, 1, 4):
            problems.append(f"exit code {proc.returncode}")
        if usage:
            if not (session.options or session.ini):
                problems.append("usage error without a generated option or ini value")
            elif "backends" not in proc.stderr:
                problems.append("usage error that names no backends option or key")
        elif proc.returncode in (0, 1):
            reported = outcomes_from_junit(junit) if junit.exists() else {}
            missing = [n for n in SENTINEL_NAMES if reported.get(n) != "passed"]
            if missing:
                problems.append(f"sentinel tests did not pass: {missing}")
            lost = [f"test_g{i}" for i in range(len(session.tests)) if f"test_g{i}" not in reported]
            if lost:
                problems.append(f"generated tests without an outcome: {lost[:5]}")
        after = fingerprint(directory)
        changed = [name for name in before if before[name] != after[name]]
        if changed:
            problems.append(f"files changed: {changed}")
        if problems:
            problems.append("options: " + " ".join(session.options) + f"; ini: {session.ini}")
            problems.append("output tail: " + out[-1500:].replace("\n", "\n    "))
        return Verdict(not problems, problems, proc.returncode, seconds, usage)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=45)
    parser.add_argument("--markers", type=int, default=40, help="generated tests per session")
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--modes", default="serial,xdist")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    surface = discover()
    generated = sessions(surface, args.sessions, args.markers, args.seed)
    modes = {"serial": [], "xdist": ["-n", "2"]}
    lines = [
        f"fuzz of the plugin's inputs: {len(generated)} sessions x {args.markers} generated "
        f"tests, seed {args.seed}",
        f"python {platform.python_version()}, CPU {describe(SIMD_FEATURES)}, "
        f"load average at start {os.getloadavg()[0]:.1f}",
        f"options fuzzed ({len(surface.options)}): {' '.join(sorted(surface.options))}",
        f"ini keys fuzzed ({len(surface.ini_keys)}): {' '.join(surface.ini_keys)}",
    ]
    used_options = {o.split("=")[0] for s in generated for o in s.options}
    used_keys = {k for s in generated for k in s.ini}
    lines.append(
        f"coverage: {len(used_options & set(surface.options))}/{len(surface.options)} options "
        f"and {len(used_keys)}/{len(surface.ini_keys)} ini keys got generated values"
    )
    failures: list[str] = []
    values = sum(s.values for s in generated)
    for mode in [m for m in args.modes.split(",") if m]:
        totals = {
            "runs": 0,
            "ok": 0,
            "usage": 0,
            "internalerror": 0,
            "seconds": 0.0,
            "markers_run": 0,
            "tests_run": 0,
        }
        for index, session in enumerate(generated):
            verdict = run_session(session, modes[mode])
            if not verdict.usage_error:
                totals["markers_run"] += session.marker_values
                totals["tests_run"] += len(session.tests)
            totals["runs"] += 1
            totals["ok"] += verdict.ok
            totals["usage"] += verdict.usage_error
            totals["internalerror"] += any("INTERNALERROR" in p for p in verdict.problems)
            totals["seconds"] += verdict.seconds
            status = "ok" if verdict.ok else "FAIL"
            print(
                f"[{mode} {index + 1}/{len(generated)}] {status} exit {verdict.ret} "
                f"{verdict.seconds:.1f} s",
                flush=True,
            )
            if not verdict.ok:
                failures.append(f"{mode} session {index}:\n  " + "\n  ".join(verdict.problems))
        lines.append(
            f"{mode}: {totals['runs']} sessions, {values} generated values "
            f"({sum(s.marker_values for s in generated)} marker arguments, "
            f"{sum(len(s.options) + len(s.ini) for s in generated)} option and ini values); "
            f"{totals['usage']} sessions ended in a usage error for a bad option or ini value "
            f"before any test ran; the others ran {totals['tests_run']} generated tests "
            f"carrying {totals['markers_run']} marker arguments; "
            f"{totals['ok']} sessions passed every check, {totals['internalerror']} "
            f"INTERNALERROR, {totals['runs'] - totals['ok']} failing sessions, "
            f"{totals['seconds']:.0f} s"
        )
    lines.append(f"load average at end {os.getloadavg()[0]:.1f}")
    lines.append(f"failing sessions: {len(failures)}")
    lines += failures
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
