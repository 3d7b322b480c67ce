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
   processes do not retry it for the same sources and toolchain.

The build record (``build-ok``, JSON) holds the build key (sources, flags,
torch/Python/device variant and the C++ compiler) and the size and SHA-256 of
the library that build produced. A cached library is loaded only when it
matches its record; otherwise (truncated, replaced, left by an older
version) it is deleted and relinked, and if that fails too the harness falls
back to torch ops. Loading never raises into a caller: every failure becomes
:func:`unavailable_reason`.

``PYTEST_BACKENDS_NATIVE`` selects the policy: ``auto`` (default: AOT, else
JIT), ``aot`` (never JIT), ``jit`` (ignore an AOT build) or ``off`` (always the
torch-ops fallback).
``PYTEST_BACKENDS_CACHE_DIR`` overrides the cache root.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

__all__ = [
    "EXTENSION_NAME",
    "NativeBuildError",
    "build",
    "build_listener",
    "built",
    "cache_dir",
    "disabled",
    "library_path",
    "load",
    "loaded",
    "needs_build",
    "prepare",
    "set_build_listener",
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
        # Told when this process is about to compile (see set_build_listener).
        self.listener: Callable[[str], None] | None = None


_state = _State()


def source_dir() -> Path:
    """The directory holding the C++/CUDA sources."""
    packaged = Path(__file__).resolve().parent / "native"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "native"


def _cuda_wanted() -> bool:
    import torch

    if not torch.version.cuda:  # a CPU build: no need for the build tooling's slow import
        return False
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


def _tool(name: str) -> str:
    """``name`` -> its resolved path, size and mtime, or ``name=absent``."""
    found = shutil.which(name, path=_build_path()) if name == "ninja" else shutil.which(name)
    if found is None:
        return f"{name}=absent"
    real = os.path.realpath(found)
    try:
        st = os.stat(real)
    except OSError:
        return f"{name}={real}"
    return f"{name}={real}:{st.st_size}:{st.st_mtime_ns}"


def _compiler() -> str:
    """The C++ compiler torch's build would use (``$CXX``, else ``c++``), identified."""
    command = (os.environ.get("CXX") or "c++").split()
    return _tool(command[0]) if command else "c++=absent"


def _build_path() -> str:
    """``PATH`` for a build: the interpreter's own scripts directory first, where it has ninja.

    pip installs the ``ninja`` requirement next to the interpreter, which is on
    ``PATH`` only in an activated environment: without this, ``.venv/bin/python``
    would build with whichever ninja ``PATH`` holds, or fail for want of one, and
    a cache built under one ninja version is compiled again in full under another
    (the build log's format changes between versions).
    """
    path = os.environ.get("PATH", os.defpath)
    scripts = os.path.dirname(sys.executable)
    if os.access(os.path.join(scripts, "ninja"), os.X_OK):
        return f"{scripts}{os.pathsep}{path}"
    return path


@contextlib.contextmanager
def _build_environment() -> Iterator[None]:
    """``PATH`` set to :func:`_build_path` while torch's build runs ninja."""
    before = os.environ.get("PATH")
    os.environ["PATH"] = _build_path()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def _toolchain() -> str:
    """Everything whose change may turn a failed build into a working one."""
    return f"{_compiler()}; {_tool('ninja')}"


def _build_key(files: list[Path]) -> str:
    """Identifies a build: the sources and their headers, the flags, the variant and the compiler.

    The headers beside the sources are hashed too: a change to a header alone
    changes what the sources compile to.
    """
    h = hashlib.sha256()
    h.update(_variant().encode())
    h.update(repr(_compile_flags()).encode())
    h.update(_compiler().encode())
    folders = sorted({f.parent for f in files})
    headers = [x for d in folders for pattern in ("*.h", "*.cuh") for x in sorted(d.glob(pattern))]
    for f in [*files, *headers]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _file_digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a regular file, read through one descriptor."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        size = 0
        with os.fdopen(fd, "rb", closefd=False) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                size += len(block)
                h.update(block)
    finally:
        os.close(fd)
    return size, h.hexdigest()


def _write_record(stamp: Path, key: str, library: Path) -> None:
    size, sha = _file_digest(library)
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "size": size, "sha256": sha}))
    os.replace(tmp, stamp)


def _record_mismatch(stamp: Path, key: str, library: Path) -> str | None:
    """Why the cached library may not be loaded (None: it matches its build record)."""
    if not library.exists() and not library.is_symlink():
        return "no cached library"
    try:
        record = json.loads(stamp.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "the cached library has no build record"
    except (OSError, ValueError, RecursionError):
        return "the build record is unreadable (damaged, or written by an older version)"
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        return "the build record has no library hash (written by an older version)"
    if record.get("key") != key:
        return "the sources, flags or compiler changed since the cached build"
    try:
        st = os.lstat(library)
        if not stat.S_ISREG(st.st_mode):
            return f"{library} is not a regular file"
        if st.st_size != record.get("size"):
            return (
                f"the cached library {library} has {st.st_size} bytes, its build recorded "
                f"{record.get('size')} (truncated or replaced)"
            )
        size, sha = _file_digest(library)
    except OSError as exc:
        return f"cannot read the cached library {library}: {exc}"
    if size != record.get("size") or sha != record["sha256"]:
        return f"the cached library {library} does not match the hash its build recorded"
    return None


def _check_built_for_this_torch(module: ModuleType) -> None:
    import torch

    built = getattr(module, "torch_version", lambda: "unknown")()
    if built != torch.__version__.split("+")[0]:
        raise NativeBuildError(
            f"{module.__name__} was built for torch {built}, running {torch.__version__}"
        )


def _compile_flags() -> tuple[list[str], list[str]]:
    # NDEBUG as torch itself is built: debug-only checks in its headers (RecordFunction
    # inputs) read state that a release libtorch never sets.
    cflags = ["-O3", "-DNDEBUG"]
    ldflags: list[str] = []
    if sys.platform.startswith("linux"):
        # at::parallel_for is inline OpenMP code: without -fopenmp it runs on one
        # thread. The libgomp torch already loaded (same soname) is reused.
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    return cflags, ldflags


#: The lock file ``torch.utils.cpp_extension`` keeps in a build directory while building.
_TORCH_BATON = "lock"


def _jit_build(directory: Path, files: list[Path], verbose: bool) -> ModuleType:
    from torch.utils import cpp_extension

    cflags, ldflags = _compile_flags()
    cuda = any(f.suffix == ".cu" for f in files)
    with _build_environment():
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


def _failed_before(marker: Path, key: str) -> str | None:
    """The message of an earlier failed build of ``key`` with today's toolchain, if any."""
    try:
        text = marker.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    recorded, _, rest = text.partition("\n")
    toolchain, _, message = rest.partition("\n")
    if recorded != key or toolchain != _toolchain():
        return None
    return message.strip()[:500]


def _announce(message: str) -> None:
    listener = _state.listener
    if listener is not None:
        with contextlib.suppress(Exception):
            listener(message)


def build(
    *, force: bool = False, verbose: bool = False, announce: bool = False, compile: bool = True
) -> ModuleType:
    """Build the extension into :func:`cache_dir` unless an up-to-date build is there; load it.

    Holds an exclusive lock on the cache directory while deciding and
    building, so concurrent processes (xdist workers) build at most once.
    A cached library is loaded only when its size and hash match its build
    record; otherwise it is deleted and rebuilt. ``force`` rebuilds and
    ignores a failure marker from an earlier attempt (which is also ignored
    once the compiler or ninja changes). ``announce`` tells the build listener
    (see :func:`set_build_listener`) before compiling: :func:`load` sets it,
    because its builds are implicit; a caller of ``build()`` asked for one.
    ``compile=False`` loads a matching cached build or raises, never compiling.
    Raises :class:`NativeBuildError`.
    """
    files = sources()
    directory = _private_dir(cache_dir())
    key = _build_key(files)
    stamp = directory / "build-ok"
    marker = directory / _FAILED_MARKER
    library = library_path()
    with _locked(directory):
        why = "forced" if force else _record_mismatch(stamp, key, library)
        if why is None:
            try:
                module = _import_library(library)
            except NativeBuildError:
                raise
            except Exception as exc:
                raise NativeBuildError(f"cannot load the cached library {library}: {exc}") from exc
        elif not compile:
            raise NativeBuildError(f"no usable cached build ({why})")
        else:
            earlier = None if force else _failed_before(marker, key)
            if earlier is not None:
                raise NativeBuildError(
                    f"an earlier build of these sources failed with this compiler "
                    f"(marker {marker}; `python -m pytest_backends build-native --force` "
                    f"retries): {earlier}"
                )
            stamp.unlink(missing_ok=True)
            # Never let the build tool reuse a library nobody vouches for: it would
            # see it as up to date and import it.
            library.unlink(missing_ok=True)
            if announce:
                _announce(why)
            # torch's own build lock: a build killed midway leaves it behind, and torch
            # then waits for it forever. Under this process's flock nobody else builds.
            (directory / _TORCH_BATON).unlink(missing_ok=True)
            try:
                module = _jit_build(directory, files, verbose)
                _write_record(stamp, key, library)
            except Exception as exc:
                marker.write_text(f"{key}\n{_toolchain()}\n{type(exc).__name__}: {exc}")
                raise NativeBuildError(f"building the native extension failed: {exc}") from exc
            marker.unlink(missing_ok=True)
    _check_built_for_this_torch(module)
    return module


def needs_build() -> bool:
    """Whether :func:`load` would compile the extension now (it never raises).

    False when the extension is off, already decided in this process, found
    as an ahead-of-time build, or cached with a matching build record.
    """
    try:
        policy = _policy()
        if _state.tried or disabled() or policy == "aot":
            return False
        if policy != "jit":
            import importlib.util

            if importlib.util.find_spec(_AOT_MODULE) is not None:
                return False
        directory = cache_dir()
        key = _build_key(sources())
        return _record_mismatch(directory / "build-ok", key, library_path()) is not None
    except Exception:
        return False


def prepare(progress: Callable[[str], None]) -> None:
    """Build (and load) the extension now if :func:`load` would build it later.

    For the start of a session: ``progress`` gets a line before a build and
    one with its outcome. Does nothing when no build is needed. Never raises.
    """
    if not needs_build():
        return
    progress(
        f"building the native determinism harness into {cache_dir()} (once per machine, "
        "torch and compiler; `python -m pytest_backends build-native` does it ahead of "
        "the test run, e.g. in a CI setup step)"
    )
    start = time.perf_counter()
    module = load()
    seconds = time.perf_counter() - start
    if module is not None:
        progress(f"native determinism harness built in {seconds:.1f} s")
    else:
        progress(
            f"native determinism harness unavailable after {seconds:.1f} s: "
            f"{unavailable_reason()}; the pure-Python fallback gives the same verdicts, slower"
        )


def set_build_listener(listener: Callable[[str], None] | None) -> None:
    """Call ``listener(reason)`` whenever this process is about to compile the extension."""
    _state.listener = listener


def build_listener() -> Callable[[str], None] | None:
    """The listener set by :func:`set_build_listener`, if any."""
    return _state.listener


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


def _decide(compile: bool = True) -> ModuleType | None:
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
        except Exception as exc:  # a broken library must never fail the caller
            reasons.append(f"cannot import {_AOT_MODULE}: {type(exc).__name__}: {exc}")
        else:
            if module is not None:
                return module
            reasons.append("no ahead-of-time build")
    if policy == "aot":
        _state.reason = "; ".join(reasons)
        return None
    try:
        return build(announce=True, compile=compile)
    except NativeBuildError as exc:
        reasons.append(str(exc))
    except OSError as exc:
        reasons.append(f"cannot use the build cache: {exc}")
    except Exception as exc:
        reasons.append(f"cannot build or load the native extension: {type(exc).__name__}: {exc}")
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


def load_cached() -> ModuleType | None:
    """The extension when it loads without compiling, else None; never builds.

    An ahead-of-time build or a cached build matching its record is loaded
    and kept, as :func:`load` keeps it. A miss is not kept: a later
    :func:`load` may still build.
    """
    if _state.tried:
        return _state.module
    module = _decide(compile=False)
    if module is None:
        _state.reason = None
    else:
        _state.tried, _state.module = True, module
    return module


def loaded() -> bool:
    """Whether :func:`load` has run in this process (so calling it again costs nothing)."""
    return _state.tried


def built() -> bool:
    """Whether an ahead-of-time build or a cached library exists (it may still be stale)."""
    try:
        import importlib.util

        return importlib.util.find_spec(_AOT_MODULE) is not None or library_path().is_file()
    except Exception:
        return False


def unavailable_reason() -> str | None:
    """Why :func:`load` returned None (None if it was not tried or succeeded)."""
    return _state.reason
