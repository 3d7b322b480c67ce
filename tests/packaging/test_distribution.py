"""What users install: the wheel built from the source tree, and the package pytest imports.

The wheel is built from a clean copy of the files setuptools reads (no stale
``build/`` directory can hide a module that packaging forgot), and must hold
every module and native source of the tree, the license and the metadata the
README promises.  When the suite runs against an installed package (``make
test INSTALL=wheel``, which CI runs), the package pytest imported is checked
against the source tree too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import pytest_backends

HERE = Path(__file__).resolve().parents[2]
NEEDED = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "pytest_backends", "native")


def _source_tree() -> Path:
    """The checkout the package is built from (``PYTEST_BACKENDS_SOURCE_TREE`` for copied tests)."""
    root = Path(os.environ.get("PYTEST_BACKENDS_SOURCE_TREE", HERE))
    if not all((root / name).exists() for name in NEEDED):
        pytest.skip(f"no source tree at {root} (set PYTEST_BACKENDS_SOURCE_TREE)")
    return root


def _expected_files(root: Path) -> set[str]:
    """Every file of the package as its path inside the wheel."""
    files = {p.relative_to(root).as_posix() for p in (root / "pytest_backends").rglob("*.py")}
    files.add("pytest_backends/py.typed")
    for path in (root / "native").rglob("*"):
        if path.suffix in {".cpp", ".h", ".cu"}:
            files.add("pytest_backends/native/" + path.relative_to(root / "native").as_posix())
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = _source_tree()
    copy = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build", "dist")
    for name in NEEDED:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=ignore)
        else:
            shutil.copy2(source, copy / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("--disable-pip-version-check", "-w", str(out), str(copy)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (built,) = out.glob("*.whl")
    return built


def test_wheel_holds_every_module_and_native_source(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_expected_files(_source_tree()) - names)
    assert not missing, f"the wheel lacks {len(missing)} file(s): {missing[:10]}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # subpackages are real packages in the wheel, not stray files
    packages = {"pytest_backends/matrix/__init__.py", "pytest_backends/determinism/__init__.py"}
    assert packages <= names


def test_wheel_metadata(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (meta_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(archive.read(meta_name).decode())
    assert meta["License-Expression"] == "BSD-3-Clause"
    requires = meta.get_all("Requires-Dist") or []
    # torch is the user's choice of build: only an extra may ask for it
    torch_reqs = [r for r in requires if r.startswith("torch")]
    assert torch_reqs and all("extra ==" in r for r in torch_reqs), torch_reqs
    assert any(r.startswith("pytest>=") for r in requires)
    assert meta.get_all("Project-URL")
    (entry_points,) = [n for n in archive.namelist() if n.endswith("entry_points.txt")]
    text = archive.read(entry_points).decode()
    assert "[pytest11]" in text and "backends = pytest_backends.plugin" in text


def test_imported_package_has_every_module_of_the_tree() -> None:
    """The package pytest imported (installed or editable) is complete."""
    root = _source_tree()
    installed = Path(pytest_backends.__file__).resolve().parent
    present = {
        "pytest_backends/" + p.relative_to(installed).as_posix()
        for p in installed.rglob("*")
        if p.is_file()
    }
    expected = {f for f in _expected_files(root) if not f.startswith("pytest_backends/native/")}
    missing = sorted(expected - present)
    assert not missing, f"{installed} lacks {missing[:10]}"
    if os.environ.get("PYTEST_BACKENDS_EXPECT_INSTALLED"):
        assert installed != (root / "pytest_backends").resolve(), installed
        assert "site-packages" in installed.parts, f"expected the installed package: {installed}"
        from pytest_backends import _native

        assert _native.source_dir().is_relative_to(installed)
