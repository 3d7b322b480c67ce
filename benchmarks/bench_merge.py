"""CPU time of ``pytest-backends merge`` at 10^3, 10^4 and 10^5 configurations.

Writes two job reports whose items split the configurations between them
(one heavily parametrized test, so the HTML grid has one row), then measures,
in this process, the CPU time (``time.process_time``) of reading and merging
them (``merge_reports``), of writing the merged JSON report over its own
previous output (``write_json``: building the data, encoding, the overwrite
check and the atomic write) beside its anchor, a plain ``json.dump`` of the
same data to a file, and of rendering the HTML grid. The write and the anchor
run interleaved, ``--repeat`` rounds; min and median are reported. A linear
merge keeps the time per configuration flat from one size to the next.

Each size also runs ``pytest-backends merge --report`` twice on the same
inputs and checks that the second run overwrites the first's output with the
same bytes (a report larger than the size up to which an existing file is
parsed whole is recognised by its header).

Usage::

    python benchmarks/bench_merge.py [--sizes 1000,10000,100000] [--repeat 3] [--out PATH]

Results go to stdout and to ``benchmarks/results/merge-cpu.txt`` with the CPU model.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pytest_backends.__main__ import main as cli
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


def _interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            samples[name].append(time.process_time() - start)
    return samples


def _quiet_cli(argv: list[str]) -> int:
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        return cli(argv)


def _twice(a: Path, b: Path, out: Path) -> str:
    argv = ["merge", "--report", str(out), str(a), str(b)]
    if _quiet_cli(argv) != 0:
        return "FIRST RUN FAILED"
    first = out.read_bytes()
    if _quiet_cli(argv) != 0:
        return "SECOND RUN REFUSED"
    return "same bytes" if out.read_bytes() == first else "DIFFERENT BYTES"


def main() -> None:
    """Run the benchmark and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "merge-cpu.txt")
    args = parser.parse_args()
    lines = [
        "pytest-backends merge: CPU time (process_time) by number of configurations; "
        f"merge and html: best of {args.repeat}; write and anchor: {args.repeat} interleaved "
        "rounds, min / median",
        f"CPU: {cpu_model()}; python {platform.python_version()}",
        "two job reports, one test parametrized over every configuration (half per job)",
        "write = MergedReport.write_json over its previous output; anchor = json.dump of the "
        "same data to a file",
        "",
        f"{'configs':>8}  {'MiB':>6}  {'merge s':>8}  {'write s':>13}  {'anchor s':>13}  "
        f"{'write/anchor':>12}  {'html s':>7}  {'us/config':>9}  twice",
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
            out = Path(tmp) / f"merged{size}.json"
            plain = Path(tmp) / f"plain{size}.json"
            merged.write_json(out)
            data = json.loads(out.read_text())

            def anchor(data: object = data, plain: Path = plain) -> None:
                with open(plain, "w", encoding="utf-8") as f:
                    json.dump(data, f)

            samples = _interleaved(
                {"write": functools.partial(merged.write_json, out), "anchor": anchor},
                args.repeat,
            )
            html_s = _cpu(merged.to_html, args.repeat)
            twice = _twice(a, b, Path(tmp) / f"cli{size}.json")
            w, an = samples["write"], samples["anchor"]
            line = (
                f"{size:>8}  {out.stat().st_size / (1 << 20):>6.1f}  {merge_s:>8.3f}  "
                f"{min(w):>6.3f}/{statistics.median(w):<6.3f}  "
                f"{min(an):>6.3f}/{statistics.median(an):<6.3f}  "
                f"{min(w) / min(an):>5.2f}/{statistics.median(w) / statistics.median(an):<5.2f}  "
                f"{html_s:>7.3f}  {merge_s / size * 1e6:>9.1f}  {twice}"
            )
            lines.append(line)
            print(line, flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
