"""The package's import graph: no circles (function-level imports included), one registrar.

Imports under ``if TYPE_CHECKING:`` are left out of the runtime graph (they
never run), but a second graph counts them: a circle of type-level imports
(two modules that each name the other's types) is forbidden too.
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


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``package``."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = package.split(".")
    anchor = anchor[: len(anchor) - node.level + 1]
    return ".".join([*anchor, base] if base else anchor)


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
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


#: The features: each a package or a module (see ``pytest_backends._feature``).
FEATURE_ROOTS = {
    "isolation": f"{NAME}.isolation",
    "capability": f"{NAME}.capability",
    "matrix": f"{NAME}.matrix",
    "determinism": f"{NAME}.determinism",
    "batch": f"{NAME}.batch",
    "nothing_selected": f"{NAME}.nothing_selected",
    "label": f"{NAME}.label",
    "native_build": f"{NAME}.native_build",
}
#: Modules that use every feature by design: the registrar and the command line.
TOP = {f"{NAME}.plugin", f"{NAME}.__main__"}


def feature_of(module: str) -> str | None:
    for feature, root in FEATURE_ROOTS.items():
        if module == root or module.startswith(root + "."):
            return feature
    return None


def _defines_a_plugin(path: Path) -> bool:
    """Whether the module builds plugins: a class with ``pytest_*`` hooks, or ``plugins()``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "plugins":
            return True
        if isinstance(node, ast.ClassDef) and any(
            isinstance(child, ast.FunctionDef) and child.name.startswith("pytest_")
            for child in node.body
        ):
            return True
    return False


def hook_layer() -> set[str]:
    """The modules that make up the features' hook layers (plugin classes, ``plugins()``)."""
    return {
        name
        for name, path in _modules().items()
        if feature_of(name) is not None and _defines_a_plugin(path)
    }


def all_imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Like :func:`imports_of`, ``if TYPE_CHECKING:`` imports included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known and name != module}


def type_level_imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports, ``if TYPE_CHECKING:`` and function bodies included.

    ``from package import submodule`` is an edge to the submodule alone: a
    package's face re-exports lazily and is no party to a circle of types.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [name for name in subs if name in known]
            if len(names) < len(subs):
                names.append(base)
        else:
            continue
        found |= {name for name in names if name in known and name != module}
    return found


def type_level_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: type_level_imports_of(name, path, known) for name, path in modules.items()}


def test_type_level_imports_are_counted(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pytest_backends.b import T\n"
        "from pytest_backends import c\n"
    )
    known = {"pytest_backends", "pytest_backends.b", "pytest_backends.c"}
    got = type_level_imports_of("pytest_backends.a", source, known)
    assert got == {"pytest_backends.b", "pytest_backends.c"}
    graph = {"pytest_backends.a": got, "pytest_backends.b": {"pytest_backends.a"}}
    assert find_cycles(graph) == [["pytest_backends.a", "pytest_backends.b"]]


def test_the_package_has_no_type_level_circle() -> None:
    """A feature's settings live in a leaf both its feature module and hook layer import."""
    cycles = find_cycles(type_level_graph())
    assert len(cycles) == 0, "type-level import circles: " + "; ".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_every_feature_root_exists_and_the_hook_layer_is_found() -> None:
    modules = _modules()
    assert all(root in modules for root in FEATURE_ROOTS.values())
    layer = hook_layer()
    assert f"{NAME}.nothing_selected" in layer and f"{NAME}.matrix.report_plugin" in layer


def test_no_module_imports_another_features_hook_layer() -> None:
    graph = import_graph()
    layer = hook_layer()
    offenders = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module not in TOP
        for target in targets
        if target in layer and feature_of(target) != feature_of(module)
    )
    assert offenders == [], "features import only foundations, _shared and themselves"


def test_the_shared_module_imports_no_feature_not_even_for_type_checking() -> None:
    modules = _modules()
    known = set(modules)
    shared = f"{NAME}._shared"
    imported = all_imports_of(shared, modules[shared], known)
    assert [name for name in imported if feature_of(name) is not None] == []
    assert imported <= {f"{NAME}._options"}


@pytest.mark.parametrize(
    "foundation",
    [
        "pytest_backends._shared",
        "pytest_backends._xdist",
        "pytest_backends._options",
        "pytest_backends._feature",
        "pytest_backends.flags",
        "pytest_backends.matrix.configs",
        "pytest_backends.capability.levels",
        "pytest_backends.determinism.digest",
    ],
)
def test_foundations_reach_no_hook_layer(foundation: str) -> None:
    graph = import_graph()
    reachable: set[str] = set()
    todo = [foundation]
    while todo:
        for succ in graph[todo.pop()]:
            if succ not in reachable:
                reachable.add(succ)
                todo.append(succ)
    assert reachable & hook_layer() == set(), f"{foundation} reaches a feature's hook layer"


def _assignments(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.value is not None:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            yield node.target.id, node.value


def test_stash_keys_live_next_to_their_feature_and_have_one_name() -> None:
    modules = _modules()
    assert f"{NAME}._keys" not in modules, "the key hub is gone"
    aliases = []
    for name, path in modules.items():
        for target, value in _assignments(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(value, ast.Attribute) and value.attr.endswith("_KEY"):
                # A feature may name a shared key as its contract's SETTINGS_KEY.
                shared = isinstance(value.value, ast.Name) and value.value.id == "_shared"
                if not (target == "SETTINGS_KEY" and shared):
                    aliases.append(f"{name}: {target} = ...{value.attr}")
    assert aliases == []


def test_the_xdist_channel_is_the_only_one() -> None:
    offenders = []
    for name, path in _modules().items():
        if name == f"{NAME}._xdist":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("workerinput", "workeroutput"):
                offenders.append(f"{name}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in ("workerinput", "workeroutput")
            ):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_verdicts_travel_as_report_properties_not_attributes() -> None:
    offenders = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("report", "rep", "new")
            ):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_properties_have_one_writer_and_one_reader() -> None:
    """Only ``_shared.attach`` writes ``user_properties`` and only ``_shared.read`` reads them."""
    shared = f"{NAME}._shared"
    offenders = []
    for name, path in _modules().items():
        if name == shared:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "user_properties":
                offenders.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr in (
                "add_property",
                "carry",
                "call_data",
                "report_data",
                "report_property",
            ):
                offenders.append(f"{name}:{node.lineno} {node.attr}")
    assert offenders == []


def private_imports() -> list[str]:
    """``from pytest_backends.x import _name`` where ``_name`` is not a module: a private
    name traded between modules (pluggy's rule: modules trade public names)."""
    modules = _modules()
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(NAME):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{node.module}.{alias.name}" not in modules:
                    found.append(f"{name}: {node.module}.{alias.name}")
    return found


#: Private names the flag modules still trade among themselves (80 before the flag
#: modules made the names they share public; none elsewhere).
FLAGS_PRIVATE_IMPORTS = 0


def test_modules_trade_public_names() -> None:
    found = private_imports()
    outside = [entry for entry in found if not entry.startswith(f"{NAME}.flags.")]
    assert outside == []
    assert len(found) <= FLAGS_PRIVATE_IMPORTS


def test_shipped_files_cite_no_design_notes_users_do_not_have() -> None:
    shipped = [
        path
        for path in sorted(PACKAGE.rglob("*"))
        if path.suffix in (".py", ".cpp", ".h", ".cu", ".cuh")
    ]
    assert shipped
    citing = [str(p.relative_to(PACKAGE)) for p in shipped if "DESIGN" in p.read_text()]
    assert citing == []


def test_no_module_is_over_600_lines_except_declarative_tables() -> None:
    tables = {f"{NAME}._options"}
    long = {
        name: n
        for name, path in _modules().items()
        if name not in tables and (n := len(path.read_text(encoding="utf-8").splitlines())) > 620
    }
    assert long == {}
