"""Command line: ``pytest-backends`` (or ``python -m pytest_backends``).

``merge`` combines the matrix reports and censuses of several jobs (see
:mod:`pytest_backends.matrix.merge` and
:mod:`pytest_backends.determinism.census_merge`); ``baseline`` refreshes a
baseline from a whole-suite census
(:mod:`pytest_backends.determinism.baseline_refresh`). Both are thin: the
logic lives in those modules.

``build-native`` builds the native extension into the per-user cache (the same
build the harness would otherwise do on first use) and reports where it is.
``--inplace`` also copies the library into the installed package, where it is
then found as the ahead-of-time build by every process using this environment.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path


def _build_native(args: argparse.Namespace) -> int:
    import torch

    from pytest_backends import _native

    print(f"pytest_backends: building the native extension for torch {torch.__version__}")
    print(f"  sources:   {', '.join(str(p) for p in _native.sources())}")
    print(f"  cache dir: {_native.cache_dir()}")
    try:
        _native.build(force=args.force, verbose=args.verbose)
    except (_native.NativeBuildError, OSError) as exc:
        print(f"pytest_backends: build failed: {exc}", file=sys.stderr)
        return 1
    has_cuda = torch._C._dispatch_has_kernel_for_dispatch_key("pytest_backends::digest", "CUDA")
    print(f"  library:   {_native.library_path()}")
    print(f"  kernels:   CPU{', CUDA' if has_cuda else ''}")
    if args.inplace:
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        target = Path(_native.__file__).parent / f"{_native.EXTENSION_NAME}{suffix}"
        shutil.copy2(_native.library_path(), target)
        print(f"  installed: {target} (ahead-of-time build, used before the cache)")
    return 0


def _switches(args: argparse.Namespace) -> int:
    """Print the managed, known-not-state and unknown switches; exit 1 if any is unknown."""
    import torch

    from pytest_backends.flags import registry
    from pytest_backends.flags.surface import classify, discover, name_list

    reg = registry()
    try:
        names = name_list(Path(args.names)) if args.names else discover(torch)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"pytest-backends switches: error: --names {args.names}: {reason}", file=sys.stderr)
        return 2
    if not names:  # a truncated or empty list would pass as "nothing unknown"
        print(
            f"pytest-backends switches: error: --names {args.names}: no names in the file",
            file=sys.stderr,
        )
        return 2
    surface = classify(names, set(reg.names()) | set(reg.absent))
    where = args.names or f"torch {torch.__version__}"
    print(f"pytest-backends switches of {where}")
    print(f"\nmanaged ({len(surface.managed)}): restored after every test")
    for name, row in surface.managed.items():
        state = "absent here: " + reg.absent[row] if row in reg.absent else "row"
        print(f"  {name} -> {row} ({state})")
    print(f"\nknown not to be global numeric state ({len(surface.not_state)})")
    for name, reason in surface.not_state.items():
        print(f"  {name}: {reason}")
    print(f"\nunknown ({len(surface.unknown)})")
    for name in surface.unknown:
        print(f"  {name}")
    return 1 if surface.unknown else 0


_FORMATS = {
    "pytest-backends-report": "report",
    "pytest-backends-census": "census",
    "pytest-backends-baseline": "baseline",
}


def _kind(path: Path) -> str | None:
    """``report``, ``census``, ``baseline`` or None, from the file's ``format`` name."""
    from pytest_backends._sources import load_json

    data = load_json(path, "input file")
    fmt = data.get("format")
    if fmt is None and isinstance(data.get("tests"), list) and "configs" in data:
        return "report"  # written before reports carried a format name
    return _FORMATS.get(str(fmt))


def _inputs(args: argparse.Namespace) -> dict[str, list[Path]]:
    """The inputs by kind; directories contribute every report and census below them."""
    from pytest_backends._sources import MergeInputError

    found: dict[str, list[Path]] = {"report": [], "census": []}
    for name in args.inputs:
        path = Path(name)
        if path.is_dir():
            for child in sorted(path.rglob("*.json")):
                try:
                    kind = _kind(child)
                except MergeInputError as exc:
                    print(f"pytest-backends merge: skipped {child}: {exc}", file=sys.stderr)
                    continue
                if kind in found:
                    found[kind].append(child)
            continue
        kind = _kind(path)
        if kind not in found:
            raise MergeInputError(
                f"{path} is neither a matrix report (--backends-report) nor a census "
                f"(--backends-census)" + (": it is a baseline" if kind == "baseline" else "")
            )
        found[kind].append(path)
    wanted = {"report": args.report or args.html, "census": args.census}
    for kind, option in (
        ("report", "--report OUT.json or --html OUT.html"),
        ("census", "--census OUT.json"),
    ):
        if found[kind] and not wanted[kind]:
            raise MergeInputError(
                f"{found[kind][0]} is a {'matrix report' if kind == 'report' else 'census'}; "
                f"to merge it, name the output with {option}"
            )
    for kind in found:
        if wanted[kind] and not found[kind]:
            raise MergeInputError(f"no {kind} among the inputs {' '.join(args.inputs)}")
    return {kind: _once(paths) for kind, paths in found.items()}


def _once(paths: list[Path]) -> list[Path]:
    """``paths`` with a file reached twice (a directory and a file in it) kept once."""
    seen: set[Path] = set()
    kept: list[Path] = []
    for path in paths:
        real = path.resolve()
        if real in seen:
            print(f"pytest-backends merge: {path} is given twice; merged once", file=sys.stderr)
            continue
        seen.add(real)
        kept.append(path)
    return kept


def _check_outputs(args: argparse.Namespace, inputs: Sequence[Path]) -> None:
    """Refuse an output that is an input, or two outputs on one path."""
    from pytest_backends._sources import MergeInputError

    seen: dict[Path, str] = {}
    read = {Path(p).resolve(): p for p in inputs}
    for option, value in (
        ("--report", args.report),
        ("--html", args.html),
        ("--census", args.census),
    ):
        if not value:
            continue
        path = Path(value).resolve()
        if path in read:
            raise MergeInputError(
                f"{option} {value} is also an input: merging would overwrite it; "
                "write the merged file elsewhere"
            )
        if path in seen:
            raise MergeInputError(f"{option} {value} is also the {seen[path]} output")
        seen[path] = option


def _merge(args: argparse.Namespace) -> int:
    from pytest_backends._sources import MergeInputError
    from pytest_backends.determinism.census import CensusFileError

    if not (args.report or args.html or args.census):
        print(
            "pytest-backends merge: name an output with --report, --html or --census",
            file=sys.stderr,
        )
        return 2
    try:
        inputs = _inputs(args)
        _check_outputs(args, [p for paths in inputs.values() for p in paths])
        lines: list[str] = []
        warnings: list[str] = []
        strict_failure = ""
        # Read and check every input before anything is written.
        report = census = None
        if inputs["report"]:
            from pytest_backends.matrix.merge import merge_reports

            report = merge_reports(inputs["report"])
            report.strict = bool(args.strict)
        if inputs["census"]:
            from pytest_backends.determinism.census_merge import merge_censuses

            census = merge_censuses(inputs["census"])
        if report is not None:
            warnings += report.all_warnings()
            gaps = report.gaps
            if gaps.strict and args.strict:
                strict_failure = (
                    f"--strict: {len(gaps.strict)} test(s), configuration(s) or item(s) "
                    "ran in no job (listed above)"
                )
            if args.report:
                report.write_json(Path(args.report))
            if args.html:
                report.write_html(Path(args.html))
            lines += report.terminal_lines()
            lines += [f"report written to {p}" for p in (args.report, args.html) if p]
        if census is not None:
            warnings += census.warnings
            census.write(Path(args.census))
            lines += ["", *census.summary_lines(), f"census written to {args.census}"]
    except (MergeInputError, CensusFileError, OSError) as exc:
        print(f"pytest-backends merge: error: {exc}", file=sys.stderr)
        return 1
    from pytest_backends.matrix.report_html import printable

    for warning in warnings:
        print(printable(f"pytest-backends merge: warning: {warning}"), file=sys.stderr)
    print(printable("\n".join(lines).strip("\n")))
    if strict_failure:
        print(f"pytest-backends merge: error: {strict_failure}", file=sys.stderr)
        return 1
    return 0


def _baseline(args: argparse.Namespace) -> int:
    from pytest_backends.determinism.baseline_refresh import describe_key, refresh, unaccepted
    from pytest_backends.determinism.census import Baseline, CensusFileError, read_census

    baseline_path = Path(args.baseline)
    try:
        versions, census = read_census(Path(args.census))
        if baseline_path.exists() or args.check:
            baseline = Baseline.load(baseline_path)
        else:
            baseline = Baseline()
    except CensusFileError as exc:
        print(f"pytest-backends baseline: error: {exc}", file=sys.stderr)
        return 1
    if args.check:
        new = unaccepted(baseline, census)
        for key, tests in new.items():
            shown = ", ".join(tests[:3]) + (f" (+{len(tests) - 3} more)" if len(tests) > 3 else "")
            print(
                f"NEW nondeterministic op, not in {baseline_path}: {describe_key(key)}; in {shown}"
            )
        stale = refresh(baseline, census).removed
        for change in stale:
            print(f"could be removed: {change.entry.op} ({change.entry.device}): {change.reason}")
        if new:
            print(
                f"FAILED: {len(new)} nondeterministic op(s) not in the baseline "
                f"{baseline_path}; accept them with: pytest-backends baseline --census "
                f"{args.census} {baseline_path}"
            )
            return 1
        print(f"every nondeterministic op of {args.census} is in the baseline {baseline_path}")
        return 0
    result = refresh(baseline, census)
    try:
        result.baseline.write(baseline_path, versions)
    except CensusFileError as exc:
        print(f"pytest-backends baseline: error: {exc}", file=sys.stderr)
        return 1
    for line in result.lines():
        print(line)
    print(f"baseline written to {baseline_path} ({len(result.baseline.entries)} entries)")
    return 0


def _diverge(args: argparse.Namespace) -> int:
    from pytest_backends.paths.trace import diverge

    try:
        lines, parted = diverge(
            Path(args.trace_a), Path(args.trace_b), allow_unpaired=args.allow_unpaired
        )
    except ValueError as exc:
        print(f"pytest-backends diverge: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 1 if parted else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pytest-backends`` and ``python -m pytest_backends``."""
    parser = argparse.ArgumentParser(prog="pytest-backends")
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser(
        "merge",
        help="merge the matrix reports and censuses of several jobs into one",
        description="Merge matrix reports (--backends-report) and censuses "
        "(--backends-census) of several jobs. Inputs are files or directories "
        "(searched for *.json reports and censuses).",
    )
    merge.add_argument("--report", metavar="OUT.json", help="write the merged matrix report")
    merge.add_argument("--html", metavar="OUT.html", help="write the merged HTML grid")
    merge.add_argument("--census", metavar="OUT.json", help="write the merged census")
    merge.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a collected test, configuration or item ran in no job",
    )
    merge.add_argument("inputs", nargs="+", metavar="IN", help="report/census files or dirs")
    base = commands.add_parser(
        "baseline",
        help="add new and remove fixed ops of a baseline from a whole-suite census",
        description="Refresh BASELINE from a census of the whole suite (merged from every "
        "job): add its nondeterministic ops, remove entries whose ops all came out "
        "deterministic, and say why. With --check, change nothing and fail on new ops.",
    )
    base.add_argument(
        "--census",
        required=True,
        metavar="CENSUS.json",
        help="the whole suite's census (pytest-backends merge --census)",
    )
    base.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 when the census has ops the baseline lacks",
    )
    base.add_argument("baseline", metavar="BASELINE.json", help="the baseline file")
    build = commands.add_parser(
        "build-native", help="build the native digest/repeat extension for this torch"
    )
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    build.add_argument("--verbose", action="store_true", help="show the compiler commands")
    build.add_argument(
        "--inplace",
        action="store_true",
        help="also install the library into the package as its ahead-of-time build",
    )
    div = commands.add_parser(
        "diverge",
        help="name the first op where two --backends-trace traces part beyond their bounds",
        description="Compare two traces written by --backends-trace (files or directories; "
        "directories are paired by test and configuration). Ops are aligned by identity "
        "(op, module, call site, occurrence). Exit 1 when a pair parts, or when a trace "
        "is in one directory only.",
    )
    div.add_argument("trace_a", metavar="TRACE_A", help="reference trace file or directory")
    div.add_argument("trace_b", metavar="TRACE_B", help="other trace file or directory")
    div.add_argument(
        "--allow-unpaired",
        action="store_true",
        help="a trace in one directory only is listed, not a failure (e.g. a test that "
        "exists on one side only)",
    )
    switches = commands.add_parser(
        "switches",
        help="list torch's switches: managed by the guard, known not to be state, unknown",
    )
    switches.add_argument(
        "--names",
        metavar="FILE",
        help="classify the names of a *.names file instead of the running torch's",
    )
    for command, run in (
        (merge, _merge),
        (base, _baseline),
        (build, _build_native),
        (div, _diverge),
        (switches, _switches),
    ):
        command.set_defaults(run=run)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
