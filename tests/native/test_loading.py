"""Finding, building and loading the extension: cache layout, permissions, lock, AOT."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from pytest_backends import _native

REPO = Path(__file__).resolve().parents[2]
# The session fixture's result (tests/native/conftest.py NativeBuild).
NativeBuild = Any


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_BACKENDS_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache" / "pytest_backends"
    monkeypatch.setenv("PYTEST_BACKENDS_CACHE_DIR", str(root))
    return root


def test_concurrent_builders_compile_at_most_once(
    native_build: NativeBuild, native_module: ModuleType
) -> None:
    children = native_build.children
    assert len(children) == 2
    assert all("error" not in c for c in children), children
    compiled = sum(int(str(c["compiled"])) for c in children)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Another worker's builders may have compiled first.
        assert compiled <= 1
    else:
        assert compiled == (1 if native_build.fresh else 0)
    files = {str(c["file"]) for c in children}
    assert len(files) == 1
    assert Path(files.pop()).parent.parent == native_build.cache_root


def test_cache_dir_is_per_user_and_keyed_by_torch_python_and_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_BACKENDS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    expected_device = "cpu" if not torch.cuda.is_available() else "cu"
    path = _native.cache_dir()
    assert path.parent == tmp_path / "pytest_backends"
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    assert path.name.startswith(f"{torch.__version__}-{py}-")
    assert path.name.split("-")[-1].startswith(expected_device)
    assert not path.exists()  # asking for the path creates nothing


def test_private_dir_is_created_with_mode_0700(cache_root: Path) -> None:
    directory = _native._private_dir(_native.cache_dir())
    for d in (directory, cache_root):
        assert (d.stat().st_mode & 0o777) == 0o700


def test_build_refuses_a_cache_writable_by_others(cache_root: Path) -> None:
    cache_root.mkdir(parents=True)
    cache_root.chmod(0o777)
    with pytest.raises(_native.NativeBuildError, match="writable by other users"):
        _native.build()
    assert not _native.cache_dir().exists()


def test_build_refuses_a_symlinked_cache(cache_root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    cache_root.parent.mkdir(parents=True)
    cache_root.symlink_to(elsewhere)
    with pytest.raises(_native.NativeBuildError, match="not a plain directory"):
        _native.build()


def test_library_writable_by_others_is_not_imported(tmp_path: Path) -> None:
    lib = tmp_path / "_pytest_backends_native.so"
    lib.write_bytes(b"not a library")
    lib.chmod(0o666)
    with pytest.raises(_native.NativeBuildError, match="writable by other users"):
        _native._import_library(lib)


def test_failed_build_leaves_a_marker_and_is_not_retried(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[int] = []

    def failing(directory: Path, files: list[Path], verbose: bool) -> ModuleType:
        attempts.append(1)
        raise RuntimeError("c++: not found")

    monkeypatch.setattr(_native, "_jit_build", failing)
    with pytest.raises(_native.NativeBuildError, match="c\\+\\+: not found"):
        _native.build()
    assert (_native.cache_dir() / "build-failed").is_file()
    with pytest.raises(_native.NativeBuildError, match="earlier build of these sources failed"):
        _native.build()
    assert len(attempts) == 1
    with pytest.raises(_native.NativeBuildError, match="not found"):
        _native.build(force=True)
    assert len(attempts) == 2


def test_aot_build_for_another_torch_is_rejected() -> None:
    stale = SimpleNamespace(torch_version=lambda: "1.0.0", __name__="fake_native")
    with pytest.raises(_native.NativeBuildError, match=r"built for torch 1\.0\.0"):
        _native._check_built_for_this_torch(stale)  # type: ignore[arg-type]


def test_aot_policy_without_an_aot_build_reports_why(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "aot")
    saved = _native._state.reason
    try:
        assert _native._decide() is None
        assert "no ahead-of-time build" in str(_native._state.reason)
    finally:
        _native._state.reason = saved
    assert not cache_root.exists()  # no JIT attempted


def test_aot_build_is_preferred_and_needs_no_cache(
    native_build: NativeBuild, native_module: ModuleType, tmp_path: Path
) -> None:
    aot = tmp_path / "aot"
    aot.mkdir()
    shutil.copy2(str(native_module.__file__), aot / "_pytest_backends_native.so")
    result = _python(
        f"""
        import pytest_backends, torch
        pytest_backends.__path__.append({str(aot)!r})
        from pytest_backends import _native
        from pytest_backends.determinism import digest
        module = _native.load()
        print(module.__file__)
        print(digest.backend(), digest.digest_bytes(torch.arange(5)).hex())
        """,
        PYTEST_BACKENDS_NATIVE="aot",
        PYTEST_BACKENDS_CACHE_DIR=str(tmp_path / "unused-cache"),
    )
    assert result.returncode == 0, result.stderr
    file, line = result.stdout.strip().splitlines()[-2:]
    assert Path(file).parent == aot
    from pytest_backends.determinism.digest import digest_bytes

    assert line == f"native {digest_bytes(torch.arange(5), backend='python').hex()}"
    assert not (tmp_path / "unused-cache").exists()


def test_importing_the_modules_neither_imports_torch_nor_builds(tmp_path: Path) -> None:
    result = _python(
        """
        import sys
        import pytest_backends.determinism.digest, pytest_backends._native, pytest_backends.__main__
        print("torch" in sys.modules)
        """,
        PYTEST_BACKENDS_CACHE_DIR=str(tmp_path / "cache"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert not (tmp_path / "cache").exists()


def test_build_native_command_reuses_the_cached_build(
    native_build: NativeBuild, native_module: ModuleType
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest_backends", "build-native"],
        cwd=REPO,
        env=_env(PYTEST_BACKENDS_CACHE_DIR=str(native_build.cache_root)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"library:   {native_module.__file__}" in result.stdout
    assert "kernels:   CPU" in result.stdout


def test_build_native_command_fails_cleanly_on_an_insecure_cache(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    result = subprocess.run(
        [sys.executable, "-m", "pytest_backends", "build-native"],
        cwd=REPO,
        env=_env(PYTEST_BACKENDS_CACHE_DIR=str(root)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "writable by other users" in result.stderr
    assert "Traceback" not in result.stderr
