"""Command line: ``python -m pytest_backends build-native [--force] [--inplace] [--verbose]``.

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pytest_backends``."""
    parser = argparse.ArgumentParser(prog="python -m pytest_backends")
    commands = parser.add_subparsers(dest="command", required=True)
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
    args = parser.parse_args(argv)
    if args.command == "build-native":
        return _build_native(args)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse exits
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
