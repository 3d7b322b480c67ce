"""CPU time of ``pytest-backends merge`` at 10^3, 10^4 and 10^5 configurations.

Writes two job reports whose items split the configurations between them
(one heavily parametrized test, so the HTML grid has one row), then measures,
in this process, the CPU time (``time.process_time``) of reading and merging
them (``merge_reports``), of rendering the merged JSON and of rendering the
HTML grid. A linear merge keeps the time per configuration flat from one size
to the next; the last column gives it in microseconds.

Usage::

    python benchmarks/bench_merge.py [--sizes 1000,10000,100000] [--repeat 3] [--out PATH]

Results go to stdout and to ``benchmarks/results/merge-cpu.txt`` with the CPU model.
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pytest_backends.matrix.coverage import Coverage
from pytest_backends.matrix.merge import merge_reports
from pytest_backends.matrix.report import Result, build_rows, render_json

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine
from bench_machine import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"


def _write_job(path: Path, label: str, configs: list[str]) -> None:
    results = [
        Result(f"t.py::test_x[{c}]", "t.py::test_x", c, "passed", sources=[label]) for c in configs
    ]
    coverage = Coverage({r.nodeid: r.config for r in results}, {r.nodeid for r in results}, {})
    text = render_json(
        build_rows(results, configs),
        results,
        environment=[f"host {label}"],
        settings={"verify": "off"},
        header={"label": label, "torch": "2.13.0+cpu", "cuda": None},
        extra={"coverage": coverage.to_plain()},
    )
    path.write_text(text)


def _cpu(func: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        func()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "merge-cpu.txt")
    args = parser.parse_args()
    lines = [
        "pytest-backends merge: CPU time (process_time, best of "
        f"{args.repeat}) by number of configurations",
        f"CPU: {cpu_model()}; python {platform.python_version()}",
        "two job reports, one test parametrized over every configuration (half per job)",
        "",
        f"{'configs':>8}  {'merge s':>9}  {'json s':>8}  {'html s':>8}  {'merge us/config':>16}",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            configs = [f"cfg{i:06d}" for i in range(size)]
            a, b = Path(tmp) / f"a{size}.json", Path(tmp) / f"b{size}.json"
            _write_job(a, "job-a", configs[::2])
            _write_job(b, "job-b", configs[1::2])
            merged = merge_reports([a, b])
            merge_s = _cpu(functools.partial(merge_reports, [a, b]), args.repeat)
            json_s = _cpu(merged.to_json, args.repeat)
            html_s = _cpu(merged.to_html, args.repeat)
            line = (
                f"{size:>8}  {merge_s:>9.3f}  {json_s:>8.3f}  {html_s:>8.3f}  "
                f"{merge_s / size * 1e6:>16.1f}"
            )
            lines.append(line)
            print(line, flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
