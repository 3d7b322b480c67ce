"""The build cache is checked before loading; builds happen at session start, or are announced.

The pytester runs use a private copy of the session's build (see
``conftest.native_build`` and ``relinkable_build``): the cached library is truncated, replaced or
removed there, so the only compiling they do is relinking its objects.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from native_state import forget_decision

from pytest_backends import _native

pytest_plugins = ["pytester"]

NativeBuild = Any

HARNESS_TEST = """
import torch
from pytest_backends import assert_reproducible
from pytest_backends.determinism import digest

def test_uses_the_harness():
    assert_reproducible(lambda: torch.arange(6.0).cumsum(0), runs=2)
    print("BACKEND", digest.backend())

def test_plain():
    assert torch.ones(1).item() == 1
"""


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache" / "pytest_backends"
    monkeypatch.setenv("PYTEST_BACKENDS_CACHE_DIR", str(root))
    return root


def _names_these_sources(directory: Path) -> bool:
    """Whether the build files in ``directory`` compile this process's ``native/`` sources."""
    ninja = directory / "build.ninja"
    wanted = f" {_native.source_dir() / 'digest.cpp'}\n"
    return ninja.is_file() and wanted in ninja.read_text()


@pytest.fixture(scope="session")
def relinkable_build(native_module: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session build's cache directory, rebuilt once from this tree's sources if need be.

    ninja compares every compile command, and a command names its source's path: a cache
    built from another checkout of the same sources (its build record matches, so nothing
    rebuilt it) would be compiled again in full by every test that removes its library.
    Rebuilt here once, the tests' builds are relinks.
    """
    source = Path(str(native_module.__file__)).parent
    if _names_these_sources(source):
        return source
    # Built once for the xdist workers of this run (their base temp dirs share a parent),
    # under a lock: two workers compiling at once would each take twice as long.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / "relinkable-build" / "pytest_backends"
    target = root / source.name
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(root.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ((target / "build-ok").is_file() and _names_these_sources(target)):
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.lock", "lock"))
            (target / "build-ok").unlink()
            env = {
                **os.environ,
                "PYTEST_BACKENDS_CACHE_DIR": str(root),
                "PYTEST_BACKENDS_NATIVE": "jit",
            }
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            code = "from pytest_backends import _native; _native.build()"
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
    assert _names_these_sources(target)
    return target


@pytest.fixture
def copied_cache(
    native_build: NativeBuild,
    native_module: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A private copy of the session build's cache directory; returns the copy's variant dir."""
    return _copy_cache(Path(str(native_module.__file__)).parent, tmp_path, monkeypatch)


@pytest.fixture
def relinkable_cache(
    relinkable_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """As :func:`copied_cache`, from a build whose objects the next build relinks."""
    return _copy_cache(relinkable_build, tmp_path, monkeypatch)


def _copy_cache(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "copy" / "pytest_backends"
    root.mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    target = root / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.lock", "lock"))
    target.chmod(0o700)
    monkeypatch.setenv("PYTEST_BACKENDS_CACHE_DIR", str(root))
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "jit")  # an AOT build must not hide the cache
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return target


def _record(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "build-ok").read_text())
    return data


def _assert_record_matches(directory: Path) -> None:
    record = _record(directory)
    library = directory / f"{_native.EXTENSION_NAME}.so"
    assert _native._file_digest(library) == (record["size"], record["sha256"])


# --- the build record ---------------------------------------------------------------------


def test_build_records_the_library_size_and_hash(copied_cache: Path) -> None:
    _assert_record_matches(copied_cache)
    key = _native._build_key(_native.sources())
    assert _record(copied_cache)["key"] == key
    library = copied_cache / f"{_native.EXTENSION_NAME}.so"
    assert _native._record_mismatch(copied_cache / "build-ok", key, library) is None
    size = library.stat().st_size
    with open(library, "r+b") as f:
        f.truncate(size // 2)
    assert "truncated" in str(_native._record_mismatch(copied_cache / "build-ok", key, library))
    library.write_bytes(b"\0" * size)
    assert "does not match the hash" in str(
        _native._record_mismatch(copied_cache / "build-ok", key, library)
    )
    (copied_cache / "build-ok").write_text(key)  # a record from before hashes existed
    assert "older version" in str(_native._record_mismatch(copied_cache / "build-ok", key, library))


def test_a_header_is_part_of_the_build_key(tmp_path: Path) -> None:
    """A change to a header alone (``rows.h``, say) rebuilds the extension."""
    copied = tmp_path / "native"
    shutil.copytree(_native.source_dir(), copied)
    files = sorted(copied.glob("*.cpp"))
    headers = sorted(copied.glob("*.h"))
    assert files and headers
    before = _native._build_key(files)
    headers[0].write_text(headers[0].read_text() + "\n// changed\n")
    assert _native._build_key(files) != before
    headers[0].write_text(headers[0].read_text().removesuffix("\n// changed\n"))
    assert _native._build_key(files) == before


def test_compiler_is_part_of_the_build_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _native.sources(with_cuda=False)
    monkeypatch.setenv("CXX", "c++")
    default = _native._build_key(files)
    fake = tmp_path / "g++-fake"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    assert _native._build_key(files) != default
    assert str(fake) in _native._compiler()
    monkeypatch.setenv("CXX", str(tmp_path / "missing-c++"))
    assert _native._compiler().endswith("=absent")


def test_failed_build_is_retried_when_the_toolchain_changes(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[str] = []

    def failing(directory: Path, files: list[Path], verbose: bool) -> ModuleType:
        attempts.append(os.environ["CXX"])
        raise RuntimeError("compiler missing")

    monkeypatch.setattr(_native, "_jit_build", failing)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(_native.NativeBuildError, match="compiler missing"):
        _native.build()
    with pytest.raises(_native.NativeBuildError, match=r"earlier build .* failed"):
        _native.build()
    assert len(attempts) == 1
    # the compiler gets installed: the next build tries again without --force
    compiler = tmp_path / "no-such-c++"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    with pytest.raises(_native.NativeBuildError, match="compiler missing"):
        _native.build()
    assert len(attempts) == 2
    # ... and installing ninja counts too, although it is not part of the build key: on
    # PATH, or next to the interpreter (``pip install ninja`` in a venv never activated)
    scripts = tmp_path / "venv" / "bin"
    scripts.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(scripts / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(_native.NativeBuildError, match="compiler missing"):
        _native.build()  # this interpreter's ninja is gone: another toolchain
    with pytest.raises(_native.NativeBuildError, match=r"earlier build .* failed"):
        _native.build()
    for ninja_dir in (tmp_path / "bin", scripts):
        ninja_dir.mkdir(exist_ok=True)
        (ninja_dir / "ninja").write_text("#!/bin/sh\n")
        (ninja_dir / "ninja").chmod(0o755)
        if ninja_dir != scripts:
            monkeypatch.setenv("PATH", str(ninja_dir))
        with pytest.raises(_native.NativeBuildError, match="compiler missing"):
            _native.build()
    assert len(attempts) == 5


def test_broken_libraries_never_raise_from_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> ModuleType:
        raise ImportError("invalid ELF header")

    monkeypatch.setattr(_native, "_load_aot", broken)
    monkeypatch.setattr(_native, "build", broken)
    saved = (_native._state.tried, _native._state.module, _native._state.reason)
    try:
        forget_decision()
        assert _native.load() is None
        assert "invalid ELF header" in str(_native.unavailable_reason())
    finally:
        _native._state.tried, _native._state.module, _native._state.reason = saved


# --- end to end ---------------------------------------------------------------------------


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, str]:
    pytester.makepyfile(test_harness=HARNESS_TEST)
    result = pytester.runpytest_subprocess("-p", "no:randomly", *args)
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out and "Fatal Python error" not in out, out[-3000:]
    return result, out


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_truncated_library_is_rebuilt_and_the_test_that_triggered_it_is_named(
    pytester: pytest.Pytester, relinkable_cache: Path, extra: list[str]
) -> None:
    library = relinkable_cache / f"{_native.EXTENSION_NAME}.so"
    with open(library, "r+b") as f:
        f.truncate(library.stat().st_size // 3)  # used to kill the session with SIGBUS
    result, out = _run(pytester, *extra)
    assert result.ret == 0, out[-3000:]
    result.assert_outcomes(passed=2)
    notices = [line for line in result.outlines if "triggered a build" in line]
    assert len(notices) == 1, out[-3000:]
    assert "test_harness.py::test_uses_the_harness" in notices[0]
    assert "python -m pytest_backends build-native" in notices[0]
    assert "truncated" in notices[0]
    if extra:
        assert "[gw" in notices[0]
    _assert_record_matches(relinkable_cache)


def _objects(directory: Path) -> dict[str, int]:
    return {o.name: o.stat().st_mtime_ns for o in directory.glob("*.o")}


def test_the_build_runs_the_interpreters_own_ninja_whatever_path_holds() -> None:
    """``.venv/bin/python`` without an activated venv builds with the venv's ninja.

    Otherwise a cache built by ``build-native`` under one ninja is compiled again in
    full by a build under another (each ninja version rewrites the other's build log).
    """
    own = Path(sys.executable).parent / "ninja"
    if not os.access(own, os.X_OK):
        pytest.skip("no ninja installed next to this interpreter")
    code = "from pytest_backends import _native; print(_native._tool('ninja'))"
    env = {**os.environ, "PATH": os.pathsep.join(["/usr/bin", "/bin"])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"ninja={os.path.realpath(own)}:"), proc.stdout


@pytest.mark.slow
def test_a_build_killed_midway_does_not_hang_the_next_one(relinkable_cache: Path) -> None:
    """torch's build lock, left by a killed build, is stale under the cache's own lock."""
    (relinkable_cache / "lock").write_text("")  # what a build killed midway leaves
    (relinkable_cache / "build-ok").unlink()  # so the next load relinks
    objects = _objects(relinkable_cache)
    assert objects, sorted(p.name for p in relinkable_cache.iterdir())
    code = "from pytest_backends import _native; _native.build(); print('built')"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the build waited for the stale lock file of a killed build")
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr[-3000:]
    assert not (relinkable_cache / "lock").exists()
    _assert_record_matches(relinkable_cache)
    # relinked, not compiled again: the session's build and this one ran the same ninja
    assert _objects(relinkable_cache) == objects


def test_garbage_library_without_a_compiler_falls_back_with_one_warning(
    pytester: pytest.Pytester, copied_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = copied_cache / f"{_native.EXTENSION_NAME}.so"
    library.write_bytes(b"\x7fELF garbage" * (library.stat().st_size // 12))
    monkeypatch.setenv("CXX", str(copied_cache / "no-compiler-here"))
    # the warning is shown, never raised, even where warnings are errors
    result, out = _run(pytester, "-rw", "-s", "-W", "error::UserWarning")
    assert result.ret == 0, out[-3000:]
    result.assert_outcomes(passed=2, warnings=1)
    assert "BACKEND python" in out
    assert "native digest extension is unavailable" in out
    assert "ImportError" not in out
    assert (copied_cache / "build-failed").is_file()


@pytest.mark.slow
def test_determinism_option_builds_once_in_the_controller_before_workers_start(
    pytester: pytest.Pytester, relinkable_cache: Path
) -> None:
    (relinkable_cache / f"{_native.EXTENSION_NAME}.so").unlink()
    (relinkable_cache / "build-ok").unlink()
    pytester.makepyfile(test_harness=HARNESS_TEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-n", "2", "--backends-determinism=2"
    )
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    lines = result.outlines
    start = [i for i, line in enumerate(lines) if "building the native determinism harness" in line]
    done = [i for i, line in enumerate(lines) if "native determinism harness built in" in line]
    assert len(start) == 1 and len(done) == 1, out[-3000:]
    workers = next(i for i, line in enumerate(lines) if "workers" in line and "created" in line)
    assert start[0] < done[0] < workers
    assert "triggered a build" not in out
    _assert_record_matches(relinkable_cache)
    # the next session finds the cache up to date: nothing to build, no progress line
    key = _native._build_key(_native.sources())
    library = relinkable_cache / f"{_native.EXTENSION_NAME}.so"
    assert _native._record_mismatch(relinkable_cache / "build-ok", key, library) is None


def test_an_inline_session_gives_the_build_listener_back(pytester: pytest.Pytester) -> None:
    outer = _native.build_listener()
    assert outer is not None  # this session's plugin listens for builds
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.runpytest_inprocess("-p", "no:randomly").assert_outcomes(passed=1)
    assert _native.build_listener() is outer


@pytest.fixture
def fresh_state() -> Any:
    """Let this test decide afresh (the suite's own process already loaded the extension)."""
    saved = (_native._state.tried, _native._state.module, _native._state.reason)
    forget_decision()
    yield
    _native._state.tried, _native._state.module, _native._state.reason = saved


def test_needs_build_follows_the_policy_and_the_cache(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, fresh_state: None
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "jit")
    assert _native.needs_build()  # empty cache
    assert not cache_root.exists()  # asking creates nothing
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    assert not _native.needs_build()
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "aot")
    assert not _native.needs_build()
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "jit")
    _native._state.tried = True  # this process has decided already
    assert not _native.needs_build()


def test_load_cached_never_compiles_and_leaves_the_decision_open(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, fresh_state: None
) -> None:
    def compiles(*args: object, **kwargs: object) -> ModuleType:
        raise AssertionError("load_cached compiled")

    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "jit")
    monkeypatch.setattr(_native, "_jit_build", compiles)
    assert _native.load_cached() is None
    assert not _native.loaded()  # a later load() may still build
    assert _native.unavailable_reason() is None


def test_load_cached_checks_the_build_record_once(
    native_module: ModuleType,
    copied_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_state: None,
) -> None:
    # the copy's library would register the extension's ops a second time
    monkeypatch.setattr(_native, "_import_library", lambda path: native_module)
    checks: list[str | None] = []
    check = _native._record_mismatch

    def counted(*args: Any) -> str | None:
        checks.append(check(*args))
        return checks[-1]

    monkeypatch.setattr(_native, "_record_mismatch", counted)
    module = _native.load_cached()
    assert module is native_module and _native.loaded()
    assert checks == [None]
    assert _native.load() is module and checks == [None]


@pytest.mark.parametrize("works", [True, False], ids=["built", "failed"])
def test_prepare_reports_progress_and_the_outcome(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, fresh_state: None, works: bool
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "jit")

    def fake_build(**kwargs: object) -> ModuleType:
        if not works:
            raise _native.NativeBuildError("c++: not found")
        return ModuleType("fake_native")

    monkeypatch.setattr(_native, "build", fake_build)
    lines: list[str] = []
    _native.prepare(lines.append)
    assert len(lines) == 2, lines
    assert "building the native determinism harness" in lines[0]
    assert "python -m pytest_backends build-native" in lines[0]
    if works:
        assert "built in" in lines[1]
    else:
        assert "unavailable" in lines[1] and "c++: not found" in lines[1]
        assert "pure-Python fallback" in lines[1]
    lines.clear()
    _native.prepare(lines.append)  # decided: nothing more to do, nothing printed
    assert lines == []


def test_a_listener_that_raises_never_breaks_a_build(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rude(why: str) -> None:
        raise RuntimeError("terminal gone")

    def failing(directory: Path, files: list[Path], verbose: bool) -> ModuleType:
        raise RuntimeError("compiler missing")

    outer = _native.build_listener()
    monkeypatch.setattr(_native, "_jit_build", failing)
    _native.set_build_listener(rude)
    try:
        with pytest.raises(_native.NativeBuildError, match="compiler missing"):
            _native.build()
    finally:
        _native.set_build_listener(outer)


def test_only_implicit_builds_are_announced(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build()`` is asked for by its caller (build-native, a test); ``load()`` is implicit."""

    def no_compiler(*args: object, **kwargs: object) -> ModuleType:
        raise RuntimeError("no compiler in this test")

    heard: list[str] = []
    monkeypatch.setattr(_native, "_jit_build", no_compiler)
    monkeypatch.setattr(_native, "_load_aot", lambda: None)
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "jit")
    previous = _native.build_listener()
    saved = (_native._state.tried, _native._state.module, _native._state.reason)
    _native.set_build_listener(heard.append)
    try:
        with pytest.raises(_native.NativeBuildError, match="no compiler in this test"):
            _native.build(force=True)
        assert heard == []
        (_native.cache_dir() / _native._FAILED_MARKER).unlink()
        forget_decision()
        assert _native.load() is None
        assert len(heard) == 1, heard
    finally:
        _native.set_build_listener(previous)
        _native._state.tried, _native._state.module, _native._state.reason = saved
