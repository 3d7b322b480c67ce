"""Leak-guard soak: the same leak reports, naming the same culprits, in every test order.

    python benchmarks/leak_soak.py --seeds 20 --out benchmarks/results/leak-soak.txt

Writes a suite into a temporary directory: leaky tests, leaky fixtures of every
scope (session, package, module, class, function) next to tidy ones, tests
that import torch themselves, a test module that changes a flag while it is
imported, tests marked ``backends_leaks("off")`` and clean tests that check the
flags they start with.  Each seed runs it twice under pytest-randomly: the whole
suite, and the suite without the module that imports torch, so that torch is
first imported by whichever test or fixture the order puts first.

Every leak report is parsed into (kind, culprit, flags).  The script exits
non-zero unless every run gives exactly the expected set, each report once, and
every test the same outcome in every order.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import describe

Report = tuple[str, str, tuple[str, ...]]

CLEAN_CHECKS = """
    assert torch.get_default_dtype() == torch.float32
    assert torch.backends.mkldnn.enabled
    assert not torch.backends.cudnn.benchmark
    assert not torch.is_autocast_enabled("cpu")
    assert not torch.backends.flags_frozen()
    a = torch.ones(8, 8)
    assert (a @ a).dtype == torch.float32
"""

FILES = {
    "conftest.py": """
        import pytest


        @pytest.fixture(scope="session")
        def sess_leak():
            import torch

            torch.backends.nnpack.set_flags(False)
            yield


        @pytest.fixture(scope="session")
        def sess_tidy():
            import torch

            torch.backends.cudnn.deterministic = True
            yield
            torch.backends.cudnn.deterministic = False
    """,
    "pkg/__init__.py": "",
    "pkg/conftest.py": """
        import pytest


        @pytest.fixture(scope="package")
        def pkg_leak():
            import torch

            torch.backends.cuda.enable_math_sdp(False)
            yield
    """,
    "pkg/test_in_package.py": """
        import pytest


        def test_p1(pkg_leak):
            import torch

            assert not torch.backends.cuda.math_sdp_enabled()


        def test_p2(pkg_leak, sess_tidy):
            import torch

            assert torch.backends.cudnn.deterministic


        @pytest.mark.backends_leaks("off")
        def test_p3_off(pkg_leak):
            import torch

            torch.backends.cudnn.benchmark = True  # not checked, restored
    """,
    "test_a_lazy.py": """
        import pytest


        @pytest.fixture(scope="module")
        def mod_leak():
            import torch

            torch.backends.mkldnn.deterministic = True
            yield


        @pytest.fixture
        def fn_leak():
            import torch

            torch.backends.cudnn.benchmark = True
            yield


        def test_lazy_leak():
            import torch

            torch.backends.mkldnn.enabled = False


        def test_uses_mod_1(mod_leak):
            import torch

            assert torch.backends.mkldnn.deterministic


        def test_uses_mod_2(mod_leak, sess_leak):
            import torch

            assert torch.backends.mkldnn.deterministic


        def test_fn_1(fn_leak):
            pass


        def test_fn_2(fn_leak):
            pass


        @pytest.mark.backends_leaks("off")
        def test_last_off(mod_leak, sess_leak):
            pass
    """,
    "test_b_classes.py": """
        import pytest


        @pytest.fixture(scope="class")
        def cls_leak():
            import torch

            torch.set_warn_always(True)
            yield


        @pytest.fixture(scope="class")
        def cls_tidy():
            import torch

            torch.backends.mkldnn.deterministic = True
            yield
            torch.backends.mkldnn.deterministic = False


        class TestK:
            def test_k1(self, cls_leak, cls_tidy):
                import torch

                assert torch.is_warn_always_enabled()

            def test_k2(self, cls_leak):
                pass

            @pytest.mark.backends_leaks("off")
            def test_k3_off(self, cls_leak, sess_leak):
                import torch

                torch.backends.cudnn.benchmark = True
    """,
    "test_c_import_time.py": """
        import torch

        torch.set_default_dtype(torch.float64)  # while pytest imports the module


        def test_restored_after_import():
            assert torch.get_default_dtype() == torch.float32
    """,
    "test_d_leaky.py": textwrap.dedent("""
        def test_leak_autocast():
            import torch

            torch.set_autocast_enabled("cpu", True)
            torch.set_autocast_dtype("cpu", torch.float16)


        def test_leak_freeze():
            import torch

            torch.backends.disable_global_flags()


        def test_leak_dtype():
            import torch

            torch.set_default_dtype(torch.float64)
    """)
    + "".join(f"\n\ndef test_clean_{i}():\n    import torch\n{CLEAN_CHECKS}" for i in range(12)),
}

# fn_leak is function-scoped, part of each test that uses it: one report per test
EXPECTED: list[Report] = sorted(
    [
        ("import", "test_c_import_time.py", ("default_dtype",)),
        ("test", "test_a_lazy.py::test_lazy_leak", ("mkldnn.enabled",)),
        (
            "test",
            "test_d_leaky.py::test_leak_autocast",
            ("autocast.cpu.dtype", "autocast.cpu.enabled"),
        ),
        ("test", "test_d_leaky.py::test_leak_freeze", ("flags_frozen",)),
        ("test", "test_d_leaky.py::test_leak_dtype", ("default_dtype",)),
        ("fixture", "sess_leak", ("nnpack.enabled",)),
        ("fixture", "pkg_leak", ("sdp.math",)),
        ("fixture", "mod_leak", ("mkldnn.deterministic",)),
        ("fixture", "cls_leak", ("warn_always",)),
        ("fixture", "fn_leak", ("cudnn.benchmark",)),
        ("fixture", "fn_leak", ("cudnn.benchmark",)),
    ]
)

HEADERS = (
    ("test", re.compile(r"^(?:\[gw\d+\] )?(\S+::\S+) left torch backend flags changed:$")),
    ("fixture", re.compile(r"^fixture '(\w+)' \(\w+ scope.* did not restore them")),
    ("import", re.compile(r"^(\S+) changed torch backend flags while it was imported:$")),
    ("between", re.compile(r"torch backend flags changed (between tests|while no test)")),
)
FLAG_LINE = re.compile(r"^  (\S+): .* -> .*$")


def parse_reports(output: str) -> list[Report]:
    """Every leak report in a pytest output, as (kind, culprit, sorted flag names)."""
    reports: list[Report] = []
    current: tuple[str, str, list[str]] | None = None
    for line in [*output.splitlines(), ""]:
        flag = FLAG_LINE.match(line)
        if current is not None and flag:
            current[2].append(flag.group(1))
            continue
        if current is not None:
            reports.append((current[0], current[1], tuple(sorted(current[2]))))
            current = None
        for kind, pattern in HEADERS:
            match = pattern.search(line)
            if match:
                current = (kind, match.group(1), [])
                break
    return reports


def outcomes(junit: Path) -> dict[str, str]:
    """``{classname::name: outcome}`` from a JUnit XML file."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tags = sorted({c.tag for c in case if c.tag in ("failure", "error", "skipped")})
        result[f"{case.get('classname')}::{case.get('name')}"] = "+".join(tags) or "passed"
    return result


def run(suite: Path, seed: int, ignore: list[str]) -> tuple[list[Report], dict[str, str], str]:
    junit = suite / f"junit-{seed}.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "randomly",
            f"--randomly-seed={seed}",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "-rN",
            f"--junitxml={junit}",
            *[f"--ignore={path}" for path in ignore],
        ],
        cwd=suite,
        capture_output=True,
        text=True,
    )
    output = proc.stdout + proc.stderr
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    found = outcomes(junit) if junit.exists() else {}
    junit.unlink(missing_ok=True)
    return parse_reports(output), found, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    lines = [f"leak-guard soak, {describe(('avx2', 'avx512f', 'avx512_bf16', 'amx_tile'))}"]
    failures = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        suite = Path(tmp)
        for name, text in FILES.items():
            (suite / name).parent.mkdir(parents=True, exist_ok=True)
            (suite / name).write_text(textwrap.dedent(text))
        variants = {
            "whole suite": ([], EXPECTED),
            "torch imported lazily": (
                ["test_c_import_time.py"],
                [r for r in EXPECTED if r[0] != "import"],
            ),
        }
        reference: dict[str, dict[str, str]] = {}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for variant, (ignore, expected) in variants.items():
                reports, found, summary = run(suite, seed, ignore)
                reference.setdefault(variant, found)
                problems = []
                if sorted(reports) != expected:
                    problems += [f"missing {r}" for r in expected if r not in reports]
                    problems += [f"unexpected {r}" for r in reports if r not in expected]
                    if not problems:
                        problems.append(f"reported a different number of times: {sorted(reports)}")
                changed = sorted(
                    k
                    for k in found.keys() | reference[variant].keys()
                    if found.get(k) != reference[variant].get(k)
                )
                if changed:
                    problems.append("outcomes differ: " + ", ".join(changed))
                failures += bool(problems)
                lines.append(
                    f"seed {seed:>3} {variant}: {len(reports)} reports, "
                    f"{len(set(reports))} culprits | {summary}"
                )
                lines.extend(f"    {p}" for p in problems)
                print(
                    lines[-1 - len(problems)],
                    *lines[len(lines) - len(problems) :],
                    sep="\n",
                    flush=True,
                )
    runs = args.seeds * len(variants)
    verdict = (
        f"{args.seeds} seeds x {len(variants)} variants = {runs} runs in "
        f"{time.perf_counter() - start:.0f} s: {runs - failures} gave exactly the "
        f"{len(EXPECTED)} expected reports ({len(EXPECTED) - 1} without the import-time "
        f"module), each as often as expected, naming the same culprits, with the same "
        f"outcome for every test; {failures} differed"
    )
    lines.append(verdict)
    lines.append("expected reports (kind, culprit, flags):")
    lines.extend(f"  {r}" for r in EXPECTED)
    print(verdict)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
