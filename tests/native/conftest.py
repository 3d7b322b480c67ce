"""Build the native extension once per test session, the way xdist workers would.

Two child processes call ``_native.build()`` on the same cache directory at
once; the lock must make exactly one of them compile (when the cache starts
empty) and both must load the result. The test process then loads that build.
The cache is the normal per-user one (or ``PYTEST_BACKENDS_CACHE_DIR``), so the
whole suite, xdist workers included, builds at most once and a later run
reuses the build. When no C++ compiler or
ninja is present the native cases skip; with ``PYTEST_BACKENDS_REQUIRE_NATIVE=1``,
or when both are present, a failed build fails them instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from native_state import forget_decision

from pytest_backends import _native

REPO = Path(__file__).resolve().parents[2]

# Reports whether this process compiled (its _jit_build ran) and what it loaded.
_BUILDER = textwrap.dedent(
    """
    import json, sys
    from pytest_backends import _native

    compiled = []
    real = _native._jit_build

    def counting(*args, **kwargs):
        compiled.append(1)
        return real(*args, **kwargs)

    _native._jit_build = counting
    try:
        module = _native.build()
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(1)
    print(json.dumps({"compiled": len(compiled), "file": module.__file__}))
    """
)


@dataclass(frozen=True)
class NativeBuild:
    """The outcome of the session build."""

    cache_root: Path
    fresh: bool
    children: tuple[dict[str, object], ...]
    module: ModuleType | None
    error: str | None


def _toolchain_present() -> bool:
    return shutil.which(os.environ.get("CXX", "c++")) is not None and (
        shutil.which("ninja") is not None or (Path(sys.executable).parent / "ninja").exists()
    )


def _run_builders(cache_root: Path, count: int) -> tuple[dict[str, object], ...]:
    env = {**os.environ, "PYTEST_BACKENDS_CACHE_DIR": str(cache_root)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILDER],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        lines = out.strip().splitlines()
        try:
            results.append(json.loads(lines[-1]))
        except (IndexError, json.JSONDecodeError):
            results.append({"error": f"exit {proc.returncode}: {err[-2000:]}"})
    return tuple(results)


@pytest.fixture(scope="session")
def native_build() -> Iterator[NativeBuild]:
    """Build (or reuse) the extension once, with two concurrent builders."""
    cache_root = _native._cache_root()
    fresh = not any(cache_root.glob(f"*/{_native.EXTENSION_NAME}.so"))
    children = _run_builders(cache_root, 2)
    errors = [str(c["error"]) for c in children if "error" in c]

    old_env = os.environ.get("PYTEST_BACKENDS_CACHE_DIR")
    old_state = (_native._state.tried, _native._state.module, _native._state.reason)
    module: ModuleType | None = None
    if not errors:
        if _native._state.module is not None:
            # This process already loaded the extension (an earlier test used it):
            # a second copy would register the ops twice, so keep that one.
            module = _native._state.module
        else:
            os.environ["PYTEST_BACKENDS_CACHE_DIR"] = str(cache_root)
            forget_decision()
            module = _native.load()
            if module is None:
                errors.append(_native.unavailable_reason() or "load() returned None")
    yield NativeBuild(cache_root, fresh, children, module, "; ".join(errors) or None)
    if old_env is None:
        os.environ.pop("PYTEST_BACKENDS_CACHE_DIR", None)
    else:
        os.environ["PYTEST_BACKENDS_CACHE_DIR"] = old_env
    if module is None:
        _native._state.tried, _native._state.module, _native._state.reason = old_state


@pytest.fixture(scope="session")
def native_module(native_build: NativeBuild) -> ModuleType:
    """The loaded extension; skips (or fails, see the module docstring) without one."""
    if native_build.module is None:
        message = f"native extension unavailable: {native_build.error}"
        if os.environ.get("PYTEST_BACKENDS_REQUIRE_NATIVE") == "1" or _toolchain_present():
            pytest.fail(message)
        pytest.skip(message)
    return native_build.module


@pytest.fixture(params=["native", "python"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each digest case runs with the native kernel and with the torch-ops fallback."""
    name: str = request.param
    if name == "native":
        request.getfixturevalue("native_module")
    return name
