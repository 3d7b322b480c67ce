"""The determinism modules import in stage order, and one checked test crosses few files.

The check reads in one pass: the hook layer collects a test's runs, stage 1
records them, and ``check`` runs stages 2 to 4 and the census entry. No module
imports a later one (any import counts: module level, in a function, or for
type checking only), so each can be read knowing only what came before it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_backends

PACKAGE = Path(pytest_backends.__file__).parent
DETERMINISM = PACKAGE / "determinism"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "architecture.rst"

#: Each determinism module's place: a module imports only modules of its place or earlier.
RANK = {
    # foundations: the user API, digests, the op tables, a source location
    "api": 0,
    "digest": 0,
    "op_tables": 0,
    "location": 0,
    # stage 1: what a run leaves, and the recorders that make it
    "record": 1,
    "keys": 1,
    "outside": 1,
    "uninitialized": 1,
    "record_python": 1,
    "record_native": 1,
    # what the check reads besides the runs: the census and baseline files, the options
    "census": 2,
    "settings": 2,
    "compare": 3,
    "locate": 4,
    "verdict": 5,
    "check": 6,
    # the hook layer: the runs of one test, the hooks, the feature, the command-line tools
    "runs": 7,
    "carried": 7,
    "rng_objects": 7,
    "plugin": 8,
    "feature": 9,
    "census_merge": 9,
    "baseline_refresh": 9,
}

#: One checked test, from pytest's hook to its verdict attached to the reports.
PATH = [
    "determinism/plugin.py",
    "determinism/runs.py",
    "determinism/record_native.py",
    "determinism/record.py",
    "determinism/check.py",
    "determinism/compare.py",
    "determinism/locate.py",
    "determinism/verdict.py",
    "determinism/census.py",
    "_shared.py",
]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _imported(tree: ast.Module) -> set[str]:
    """Every module name imported anywhere in ``tree`` (``from a import b``: ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, "the package imports absolutely"
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _determinism_imports(name: str) -> set[str]:
    prefix = "pytest_backends.determinism."
    imported = _imported(_tree(DETERMINISM / f"{name}.py"))
    return {m[len(prefix) :] for m in imported if m.startswith(prefix)} & set(RANK) - {name}


def _has_hooks(path: Path) -> bool:
    """Whether a module defines pytest hooks (a class with ``pytest_*`` methods)."""
    return any(
        isinstance(node, ast.FunctionDef) and node.name.startswith("pytest_")
        for node in ast.walk(_tree(path))
    )


def test_every_determinism_module_has_a_place() -> None:
    modules = {p.stem for p in DETERMINISM.glob("*.py")} - {"__init__"}
    assert modules == set(RANK), "give a new module its place in RANK"


def test_no_determinism_module_imports_a_later_one() -> None:
    backwards = sorted(
        f"{name} -> {target}"
        for name in RANK
        for target in _determinism_imports(name)
        if RANK[target] > RANK[name]
    )
    assert backwards == []


def test_the_recorders_import_no_later_stage() -> None:
    later = {"compare", "locate", "verdict", "census", "check", "runs", "plugin"}
    for name in ("record", "record_python", "record_native", "keys", "outside", "uninitialized"):
        assert _determinism_imports(name) & later == set(), name


def test_the_check_imports_no_hook_module_and_not_pytest() -> None:
    hook_modules = {p.stem for p in DETERMINISM.glob("*.py") if _has_hooks(p)}
    assert {"plugin", "runs"} <= hook_modules
    imported = _imported(_tree(DETERMINISM / "check.py"))
    assert _determinism_imports("check") & hook_modules == set()
    assert not {"pytest", "torch", "_pytest"} & {m.split(".")[0] for m in imported}


def test_one_checked_test_crosses_at_most_ten_files_each_imported_on_the_way() -> None:
    assert len(PATH) <= 10
    seen: list[str] = []
    for file in PATH:
        path = PACKAGE / file
        module = "pytest_backends." + file.removesuffix(".py").replace("/", ".")
        if seen:
            # Each file is reached from one before it: the path is a real chain of imports.
            assert any(module in _imported(_tree(PACKAGE / before)) for before in seen), file
        seen.append(file)
        assert path.is_file()
    page = ARCHITECTURE.read_text("utf-8")
    assert all(f"``{file}``" in page for file in PATH), "the architecture page lists the path"
