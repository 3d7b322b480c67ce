"""One op table for both recorders: ``op_tables.py`` is the source, nothing else holds a copy.

The Python recorder reads the tables when it first meets an op
(:func:`pytest_backends.determinism.keys.op_info`); the C++ recorder receives
them from :func:`pytest_backends.determinism.record_native.native_module`
before it records anything. These tests fail when the two recorders disagree
with the source, or when a native source file starts keeping a table of its own.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from pytest_backends import _native
from pytest_backends.determinism import op_tables
from pytest_backends.determinism.keys import op_info
from pytest_backends.determinism.record_native import NativeRecorder, native_module

#: The native sources of the package under test (the wheel ships them as pytest_backends/native).
NATIVE = _native.source_dir()
TABLE_OPS = sorted(
    op_tables.UNINITIALIZED | op_tables.OVERWRITES | op_tables.REBINDS | set(op_tables.WORKSPACES)
)


def _overloads(name: str) -> list[Any]:
    """Every overload of ``aten::name`` in the running torch (none: the op is not in it)."""
    packet = getattr(torch.ops.aten, name.split("::", 1)[1], None)
    if packet is None:
        return []
    return [getattr(packet, overload) for overload in packet.overloads()]


def _flags(info: Any) -> tuple[bool, bool, bool, frozenset[int]]:
    return (info.uninitialized, info.overwrites, info.rebinds, info.workspaces)


def _expected(name: str) -> tuple[bool, bool, bool, frozenset[int]]:
    return (
        name in op_tables.UNINITIALIZED,
        name in op_tables.OVERWRITES,
        name in op_tables.REBINDS,
        op_tables.WORKSPACES.get(name, frozenset()),
    )


@pytest.mark.parametrize("name", TABLE_OPS)
def test_the_python_recorder_reads_the_one_op_table(name: str) -> None:
    overloads = _overloads(name)
    if not overloads:
        pytest.skip(f"{name} is not in torch {torch.__version__}")
    for overload in overloads:
        assert _flags(op_info(overload)) == _expected(name), overload


def test_ops_outside_the_tables_get_no_table_flag() -> None:
    for overload in (torch.ops.aten.add.Tensor, torch.ops.aten.mm.default):
        assert _flags(op_info(overload)) == (False, False, False, frozenset())


def test_the_native_recorder_holds_the_one_op_table() -> None:
    native = native_module()
    if native is None:
        pytest.skip(
            "the native extension is not built here (python -m pytest_backends build-native)"
        )
    uninitialized, overwrites, rebinds, workspaces, markers = native.op_tables()
    assert set(markers) == op_tables.MARKER_NAMESPACES
    assert set(uninitialized) == op_tables.UNINITIALIZED
    assert set(overwrites) == op_tables.OVERWRITES
    assert set(rebinds) == op_tables.REBINDS
    assert {k: frozenset(v) for k, v in workspaces.items()} == op_tables.WORKSPACES
    # Set once: the same tables again change nothing; once an op has been recorded
    # (its flags taken from the tables), other tables are refused.
    with NativeRecorder(native) as recorder:
        torch.ones(2).add(1)
    recorder.finish()
    native.set_op_tables(uninitialized, overwrites, rebinds, workspaces, markers)
    if native.op_tables() != (uninitialized, overwrites, rebinds, workspaces, markers):
        raise AssertionError("setting the same tables changed them")
    try:
        with pytest.raises(RuntimeError, match="set once"):
            native.set_op_tables([], overwrites, rebinds, workspaces, markers)
    finally:
        if native.op_tables() != (uninitialized, overwrites, rebinds, workspaces, markers):
            native.set_op_tables(uninitialized, overwrites, rebinds, workspaces, markers)


def _ranges_then_add(ranges: int) -> None:
    x = torch.ones(2)
    for _ in range(ranges):
        with torch.autograd.profiler.record_function("x"):
            pass
    with torch.autograd.profiler.record_function("step"):
        x.add(1)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_range_markers_are_not_recorded(recorder: str) -> None:
    """record_function ranges are no ops: a different number of them leaves the same record,
    and the ops inside a range are still recorded."""
    from pytest_backends.determinism.compare import compare_runs
    from pytest_backends.determinism.record_python import PythonRecorder

    native = native_module()
    if recorder == "native" and native is None:
        pytest.skip("the native extension is not built here")
    assert op_info(torch.ops.profiler._record_function_enter_new.default).marker
    assert not op_info(torch.ops.aten.add.Tensor).marker
    logs = []
    for ranges in (1, 3):
        rec: Any = NativeRecorder(native) if recorder == "native" else PythonRecorder()
        with rec:
            _ranges_then_add(ranges)
        logs.append(rec.finish().loaded())
    assert [c.name for c in logs[0].calls] == ["aten::ones", "aten::add"]
    assert [c.name for c in logs[1].calls] == ["aten::ones", "aten::add"]
    assert compare_runs(logs).reproducible


def _op_literals(source: str) -> list[str]:
    """String literals of C++ ``source`` (comments left out) that name an op (``aten::...``).

    The dispatcher names ops ``aten::name``, so a table kept in C++ would hold such names.
    """
    code = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)
    return re.findall(r'"(aten::[A-Za-z0-9_.]*)"', code)


def test_no_native_source_keeps_a_copy_of_the_op_tables() -> None:
    sources = [p for p in NATIVE.rglob("*") if p.suffix in (".cpp", ".h", ".cu", ".cuh")]
    assert sources, f"no native sources under {NATIVE}"
    copies = [
        f"{path.name}: {literal!r}"
        for path in sources
        for literal in _op_literals(path.read_text(encoding="utf-8"))
    ]
    assert copies == [], "op names written in native code (op_tables.py is the one source)"


def test_a_native_copy_would_be_found() -> None:
    """The scan above can fail: a table written in C++ is caught (comments and other
    strings are not)."""
    code = (
        '// "aten::add" in a comment\n'
        'TORCH_CHECK(ok, "no tables");\n'
        'static const char* kOps[] = {"aten::empty", "aten::zero_", "empty"};\n'
    )
    assert _op_literals(code) == ["aten::empty", "aten::zero_"]


def test_the_batch_locator_reads_the_one_op_table() -> None:
    from pytest_backends.batch import locate as batch_locate

    assert batch_locate.UNINITIALIZED is op_tables.UNINITIALIZED
    tables = {id(t) for t in (op_tables.UNINITIALIZED, op_tables.OVERWRITES, op_tables.REBINDS)}
    for name, value in vars(batch_locate).items():
        if isinstance(value, (frozenset, set, dict)) and any(
            isinstance(x, str) and x.startswith("aten::") for x in value
        ):
            assert id(value) in tables, f"batch/locate.py keeps its own op table {name}"


def test_the_native_recorder_writes_the_one_set_of_slot_tags() -> None:
    source = (NATIVE / "recorder.cpp").read_text()
    written = set(re.findall(r'\bslot = py::make_tuple\("(\w+)"', source))
    assert written == op_tables.SLOT_TAGS


def _tag_literals(source: str) -> list[str]:
    """Slot tags spelled as strings where a slot is made or read: a tuple's first
    element, a comparison with ``slot[0]`` or ``tag``, a set of two or more tags."""
    import ast

    def is_tag(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in op_tables.SLOT_TAGS

    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple) and node.elts and is_tag(node.elts[0]):
            found.append(f"{node.lineno}: tuple {node.elts[0].value!r}")  # type: ignore[attr-defined]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            reads_tag = any(
                (isinstance(s, ast.Name) and s.id == "tag")
                or (isinstance(s, ast.Subscript) and isinstance(s.slice, ast.Constant))
                for s in sides
            )
            if reads_tag and any(is_tag(s) for s in sides):
                found.append(f"{node.lineno}: comparison")
        elif (
            isinstance(node, (ast.Set, ast.Tuple, ast.List))
            and sum(is_tag(e) for e in node.elts) >= 2
        ):
            found.append(f"{node.lineno}: a set of tags")
    return found


def test_python_modules_take_the_slot_tags_from_op_tables() -> None:
    from pathlib import Path

    import pytest_backends

    package = Path(pytest_backends.__file__).parent
    spelled = [
        f"{path.relative_to(package)}:{where}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "op_tables.py"
        for where in _tag_literals(path.read_text(encoding="utf-8"))
    ]
    assert spelled == [], "slot tags spelled outside op_tables.py (use op_tables.SlotTag)"


def test_a_spelled_slot_tag_would_be_found() -> None:
    code = (
        'key = ("uninitialized", dtype, shape)\n'
        'if slot[0] == "opaque": pass\n'
        'if tag in ("digest", "unread"): pass\n'
        'out["digest"] = h\n'
        'kind = "uninitialized"\n'
    )
    assert len(_tag_literals(code)) == 3


def test_slot_tags_are_the_one_set() -> None:
    tags = {v for k, v in vars(op_tables.SlotTag).items() if k.isupper()}
    assert tags == op_tables.SLOT_TAGS and len(tags) == 8
