"""Find, build and load the native extension (``native/``).

Order of preference, decided once per process, on first use (never at import
or collection time):

1. an ahead-of-time build: the module ``pytest_backends._pytest_backends_native``
   (written by ``python -m pytest_backends build-native --inplace`` or a
   packaging step), accepted only if it was built against the running torch;
2. a JIT build through ``torch.utils.cpp_extension.load`` into a per-user cache
   directory keyed by torch version, Python version and CUDA availability,
   created with mode 0700 and refused when another user can write to it. An
   exclusive ``fcntl.flock`` serialises builders, so a machine builds once even
   with several xdist workers; a failed build leaves a marker so that other
   processes do not retry it for the same sources.

``PYTEST_BACKENDS_NATIVE`` selects the policy: ``auto`` (default: AOT, else
JIT), ``aot`` (never JIT), ``jit`` (ignore an AOT build) or ``off`` (always the
torch-ops fallback).
``PYTEST_BACKENDS_CACHE_DIR`` overrides the cache root.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

__all__ = [
    "EXTENSION_NAME",
    "NativeBuildError",
    "build",
    "cache_dir",
    "disabled",
    "library_path",
    "load",
    "source_dir",
    "sources",
    "unavailable_reason",
]

EXTENSION_NAME = "_pytest_backends_native"
_AOT_MODULE = f"pytest_backends.{EXTENSION_NAME}"
_POLICY_ENV = "PYTEST_BACKENDS_NATIVE"
_CACHE_ENV = "PYTEST_BACKENDS_CACHE_DIR"
_FAILED_MARKER = "build-failed"


class NativeBuildError(RuntimeError):
    """The native extension could not be built or loaded."""


class _State:
    """What this process found out about the extension (decided once)."""

    def __init__(self) -> None:
        self.tried = False
        self.module: ModuleType | None = None
        self.reason: str | None = None


_state = _State()


def source_dir() -> Path:
    """The directory holding the C++/CUDA sources."""
    packaged = Path(__file__).resolve().parent / "native"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "native"


def _cuda_wanted() -> bool:
    import torch
    from torch.utils import cpp_extension

    return bool(
        torch.version.cuda and torch.cuda.is_available() and cpp_extension.CUDA_HOME is not None
    )


def sources(with_cuda: bool | None = None) -> list[Path]:
    """The source files of the extension; CUDA sources only when CUDA can be built."""
    root = source_dir()
    files = sorted(root.glob("*.cpp"))
    if with_cuda is None:
        with_cuda = _cuda_wanted()
    if with_cuda:
        files += sorted((root / "cuda").glob("*.cu"))
    if not files:
        raise NativeBuildError(f"no native sources found under {root}")
    return files


def _variant() -> str:
    import torch

    cuda = torch.version.cuda
    device = f"cu{cuda.replace('.', '')}" if cuda and _cuda_wanted() else "cpu"
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return f"{torch.__version__}-{py}-{device}"


def _cache_root() -> Path:
    override = os.environ.get(_CACHE_ENV)
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "pytest_backends"


def cache_dir() -> Path:
    """The per-user JIT build directory for the running torch, Python and device kind."""
    return _cache_root() / _variant()


def _check_private(path: Path) -> None:
    """Refuse a directory that is a symlink, not ours, or writable by group/others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NativeBuildError(f"refusing to use {path}: not a plain directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise NativeBuildError(f"refusing to use {path}: owned by another user")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NativeBuildError(
            f"refusing to load native code from {path}: it is writable by other users "
            f"(mode {stat.S_IMODE(st.st_mode):o}); make it 0700 or remove it"
        )


def _private_dir(path: Path) -> Path:
    """Create ``path`` (and its pytest_backends parent) with mode 0700 and check both."""
    root = path.parent
    for d in (root, path):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(d)
    return path


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    import fcntl

    fd = os.open(directory / "build.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _build_key(files: list[Path]) -> str:
    """Identifies a build: the sources, the flags and the variant."""
    h = hashlib.sha256()
    h.update(_variant().encode())
    h.update(repr(_compile_flags()).encode())
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _check_built_for_this_torch(module: ModuleType) -> None:
    import torch

    built = getattr(module, "torch_version", lambda: "unknown")()
    if built != torch.__version__.split("+")[0]:
        raise NativeBuildError(
            f"{module.__name__} was built for torch {built}, running {torch.__version__}"
        )


def _compile_flags() -> tuple[list[str], list[str]]:
    cflags = ["-O3"]
    ldflags: list[str] = []
    if sys.platform.startswith("linux"):
        # at::parallel_for is inline OpenMP code: without -fopenmp it runs on one
        # thread. The libgomp torch already loaded (same soname) is reused.
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    return cflags, ldflags


def _jit_build(directory: Path, files: list[Path], verbose: bool) -> ModuleType:
    from torch.utils import cpp_extension

    cflags, ldflags = _compile_flags()
    cuda = any(f.suffix == ".cu" for f in files)
    module = cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[str(f) for f in files],
        extra_cflags=cflags,
        extra_cuda_cflags=["-O3"] if cuda else None,
        extra_ldflags=ldflags,
        extra_include_paths=[str(source_dir())],
        build_directory=str(directory),
        with_cuda=cuda,
        is_python_module=True,
        verbose=verbose,
    )
    assert isinstance(module, ModuleType)
    return module


def library_path() -> Path:
    """Where the JIT build of this variant puts its shared library."""
    return cache_dir() / f"{EXTENSION_NAME}.so"


def _import_library(path: Path) -> ModuleType:
    import importlib.util

    st = os.lstat(path)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise NativeBuildError(f"refusing to load {path}: owned by another user")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NativeBuildError(f"refusing to load {path}: writable by other users")
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for odd paths
        raise NativeBuildError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(*, force: bool = False, verbose: bool = False) -> ModuleType:
    """Build the extension into :func:`cache_dir` unless an up-to-date build is there; load it.

    Holds an exclusive lock on the cache directory while deciding and
    building, so concurrent processes (xdist workers) build at most once.
    ``force`` rebuilds and ignores a failure marker from an earlier attempt.
    Raises :class:`NativeBuildError` on failure.
    """
    files = sources()
    directory = _private_dir(cache_dir())
    key = _build_key(files)
    stamp = directory / "build-ok"
    marker = directory / _FAILED_MARKER
    library = library_path()
    with _locked(directory):
        if not force and library.is_file() and stamp.is_file() and stamp.read_text() == key:
            module = _import_library(library)
        else:
            if not force and marker.is_file():
                recorded, _, message = marker.read_text().partition("\n")
                if recorded == key:
                    raise NativeBuildError(
                        f"an earlier build of these sources failed (marker {marker}): "
                        f"{message.strip()[:500]}"
                    )
            stamp.unlink(missing_ok=True)
            try:
                module = _jit_build(directory, files, verbose)
            except Exception as exc:
                marker.write_text(f"{key}\n{type(exc).__name__}: {exc}")
                raise NativeBuildError(f"building the native extension failed: {exc}") from exc
            marker.unlink(missing_ok=True)
            stamp.write_text(key)
    _check_built_for_this_torch(module)
    return module


def _load_aot() -> ModuleType | None:
    try:
        module = importlib.import_module(_AOT_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name == _AOT_MODULE:
            return None
        raise NativeBuildError(f"cannot import {_AOT_MODULE}: {exc}") from exc
    except ImportError as exc:
        raise NativeBuildError(f"cannot import {_AOT_MODULE}: {exc}") from exc
    _check_built_for_this_torch(module)
    return module


def _policy() -> str:
    return os.environ.get(_POLICY_ENV, "auto").strip().lower() or "auto"


def disabled() -> bool:
    """Whether ``PYTEST_BACKENDS_NATIVE`` turns the extension off."""
    return _policy() in ("off", "0", "false", "python")


def _decide() -> ModuleType | None:
    policy = _policy()
    if disabled():
        _state.reason = f"disabled by {_POLICY_ENV}={policy}"
        return None
    if policy not in ("auto", "aot", "jit", "1", "true"):
        _state.reason = f"unknown {_POLICY_ENV}={policy!r} (use auto, aot, jit or off)"
        return None
    reasons: list[str] = []
    if policy != "jit":
        try:
            module = _load_aot()
        except NativeBuildError as exc:
            reasons.append(str(exc))
        else:
            if module is not None:
                return module
            reasons.append("no ahead-of-time build")
    if policy == "aot":
        _state.reason = "; ".join(reasons)
        return None
    try:
        return build()
    except NativeBuildError as exc:
        reasons.append(str(exc))
    except OSError as exc:
        reasons.append(f"cannot use the build cache: {exc}")
    _state.reason = "; ".join(reasons)
    return None


def load() -> ModuleType | None:
    """The extension module (its ``torch.ops.pytest_backends`` ops registered), or None.

    Decided once per process; the first call may build the extension.
    """
    if not _state.tried:
        _state.tried = True
        _state.module = _decide()
    return _state.module


def unavailable_reason() -> str | None:
    """Why :func:`load` returned None (None if it was not tried or succeeded)."""
    return _state.reason


def _reset_for_tests() -> None:
    """Forget this process's decision (tests only)."""
    _state.tried = False
    _state.module = None
    _state.reason = None
