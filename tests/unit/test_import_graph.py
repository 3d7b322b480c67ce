"""The package's import graph: no circles (function-level imports included), one registrar.

Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import pytest_backends

PACKAGE = Path(pytest_backends.__file__).parent
NAME = "pytest_backends"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "native" not in path.relative_to(PACKAGE).parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node``, skipping ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from _walk(other)
            continue
        yield child
        yield from _walk(child)


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name in known and name != module:
                found.add(name)
    # A package's __init__ runs before its submodules: only real code edges count here.
    return {name for name in found if known_path_is_code(name)}


def known_path_is_code(name: str) -> bool:
    path = _modules()[name]
    return path.name != "__init__.py" or bool(path.read_text(encoding="utf-8").strip('\n" '))


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_find_cycles_finds_a_circle_through_function_level_imports(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_walker_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pytest_backends import flags\n"
        "def f():\n    from pytest_backends.matrix import hooks as m\n"
        "    import pytest_backends.tolerance\n"
    )
    known = {"pytest_backends.flags", "pytest_backends.matrix.hooks", "pytest_backends.tolerance"}
    got = imports_of("pytest_backends.x", source, known)
    assert got == {"pytest_backends.matrix.hooks", "pytest_backends.tolerance"}


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 20, "the walker found too few modules"
    cycles = find_cycles(graph)
    assert cycles == [], "import circles (function-level imports included): " + "; ".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_only_plugin_py_registers_plugins_and_hookspecs() -> None:
    offenders = []
    for name, path in _modules().items():
        if name == f"{NAME}.plugin":
            continue
        text = path.read_text(encoding="utf-8")
        for call in ("pluginmanager.register(", "add_hookspecs("):
            if call in text:
                offenders.append(f"{name}: {call}")
    assert offenders == []


@pytest.mark.parametrize(
    "foundation",
    [
        "pytest_backends._keys",
        "pytest_backends.flags",
        "pytest_backends.matrix.configs",
        "pytest_backends.capability.levels",
        "pytest_backends.determinism.digest",
    ],
)
def test_foundations_import_no_feature_plugin(foundation: str) -> None:
    graph = import_graph()
    reachable: set[str] = set()
    todo = [foundation]
    while todo:
        for succ in graph[todo.pop()]:
            if succ not in reachable:
                reachable.add(succ)
                todo.append(succ)
    plugins = {name for name in reachable if name.endswith(".plugin")}
    assert plugins == set(), f"{foundation} reaches feature plugins {sorted(plugins)}"


def test_every_stash_key_lives_in_keys_module() -> None:
    elsewhere = [
        name
        for name, path in _modules().items()
        if name not in {f"{NAME}._keys", f"{NAME}._shared", f"{NAME}._selected", f"{NAME}._feature"}
        # The matrix keeps its keys next to their use (the feature contract).
        and not name.startswith(f"{NAME}.matrix.")
        and "StashKey" in path.read_text(encoding="utf-8")
    ]
    assert elsewhere == []
    from pytest_backends import _keys

    keys = [getattr(_keys, n) for n in _keys.__all__ if n.endswith("_KEY")]
    assert len({id(k) for k in keys}) == len(keys) > 5
    names = [getattr(_keys, n) for n in _keys.__all__ if not n.endswith("_KEY")]
    assert len(set(names)) == len(names), "two report properties share a name"
