"""Fixtures for the determinism harness tests: the planted nondeterministic ops."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

PLANTED_PATH = Path(__file__).with_name("planted_ops.py")
_MODULE_NAME = "pytest_backends_tests_planted_ops"


@pytest.fixture(scope="session")
def planted() -> ModuleType:
    """The planted ops module (``pbtest::noisy``, ``pbtest::spread``), loaded once per process."""
    module = sys.modules.get(_MODULE_NAME)
    if module is None:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, PLANTED_PATH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE_NAME] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def native_cache_root() -> Path:
    """The native extension's build cache, resolved before pytester moves ``HOME``."""
    from pytest_backends import _native

    return _native._cache_root()


@pytest.fixture
def planted_conftest(
    pytester: pytest.Pytester, native_cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """A pytester directory whose conftest defines the planted ops and the backends marker.

    Its subprocesses share this process's native build cache: pytester points
    ``HOME`` at a fresh directory, which would otherwise rebuild it every run.
    """
    monkeypatch.setenv("PYTEST_BACKENDS_CACHE_DIR", str(native_cache_root))
    pytester.makeconftest(PLANTED_PATH.read_text(encoding="utf-8"))
    pytester.makeini(
        "[pytest]\n"
        "markers =\n"
        "    backends: backend configurations\n"
        "addopts = -p no:randomly -p no:cacheprovider\n"
    )
    return pytester
