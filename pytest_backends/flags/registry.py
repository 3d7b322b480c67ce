"""The registry: snapshot, validate, apply, restore and diff the rows, and the public API.

Reading many rows in one call: the groups behind a cheap fingerprint.

A fingerprint calls one reader per row, so its cost is the number of calls.  Rows
whose state lives in one place are read together here, by one call that returns the
raw values of all of them, each exactly what the row's own ``read`` returns:

* rows that are attributes of one object (the print options): one ``attrgetter``;
* rows that are a pure function of one cheaper value, read once: a *gate* whose
  closed state proves every row of the group holds a known value (no autocast
  dispatch key enabled means every covered device's autocast is off; empty hook
  dictionaries mean no global module hook; a config module not imported means no
  override), and only an open gate reads the rows one by one.

A gate is proved on the running torch before it is used (autocast: each device
is switched on in turn and must open the gate), never assumed from a version.

A row whose getter is slow and whose usual value is proved by a cheaper getter
gets a faster reader of the same raw value (the torch-function state is
``ENABLED`` exactly while ``_is_torch_function_enabled()`` says so).  The
fingerprint itself is one generated function that calls every reader, with the
bound arguments of ``functools.partial`` readers passed directly.
"""

from __future__ import annotations

import contextlib
import difflib
import dis
import functools
import operator
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_backends.flags.catalogue import build_catalogue
from pytest_backends.flags.row import Flag, Invalid, ReadGroup, unfrozen


def _gated(
    gate: Callable[[], object], closed: tuple[object, ...], readers: Sequence[Callable[[], object]]
) -> Callable[[], tuple[object, ...]]:
    """``closed`` while ``gate()`` is falsy, else every reader's value."""
    readers = tuple(readers)

    def read() -> tuple[object, ...]:
        if not gate():
            return closed
        return tuple([r() for r in readers])

    return read


def _autocast_group(torch: Any, by_name: dict[str, Flag]) -> ReadGroup | None:
    gate = getattr(torch._C, "_is_any_autocast_enabled", None)
    enabled = [n for n in by_name if n.startswith("autocast.") and n.endswith(".enabled")]
    if gate is None or not enabled or gate():
        return None
    covered = []
    for name in enabled:
        row = by_name[name]
        if row.read() is not False:
            continue
        try:
            row.write(True)
            opens = gate() is True and row.read() is True
        except Exception:  # a device type this build refuses: read on its own
            opens = False
        finally:
            with contextlib.suppress(Exception):
                row.write(False)
        if opens and row.read() is False and not gate():
            covered.append(name)
    if len(covered) < 2:
        return None
    return ReadGroup(
        tuple(covered),
        _gated(gate, (False,) * len(covered), [by_name[n].read for n in covered]),
    )


def _attribute_group(names: list[str], owner: object, attrs: list[str]) -> ReadGroup | None:
    if len(names) < 2 or owner is None:
        return None
    return ReadGroup(tuple(names), functools.partial(operator.attrgetter(*attrs), owner))


def _print_group(torch: Any, by_name: dict[str, Flag]) -> ReadGroup | None:
    options = getattr(getattr(torch, "_tensor_str", None), "PRINT_OPTS", None)
    names = [n for n in by_name if n.startswith("printoptions.")]
    return _attribute_group(names, options, [n.removeprefix("printoptions.") for n in names])


def _module_hook_group(by_name: dict[str, Flag]) -> ReadGroup | None:
    module = sys.modules.get("torch.nn.modules.module")
    names = [n for n in by_name if n.startswith("nn.module_")]
    maps = [getattr(module, "_global" + n.removeprefix("nn.module"), None) for n in names]
    if len(names) < 2 or not all(isinstance(m, dict) for m in maps):
        return None

    # a row's raw value is the tuple of its dictionary's keys: () while empty
    gate = functools.partial(any, maps)
    return ReadGroup(
        tuple(names), _gated(gate, ((),) * len(names), [by_name[n].read for n in names])
    )


def _config_group(by_name: dict[str, Flag], prefix: str, module: str) -> ReadGroup | None:
    """Options of a config module not imported yet: unset until something imports it."""
    names = [n for n in by_name if n.startswith(prefix)]
    if len(names) < 2 or module in sys.modules:
        return None  # imported: each row reads its override's ContextVar directly
    unset = by_name[names[0]].read()
    if any(by_name[n].read() is not unset for n in names):
        return None
    gate = functools.partial(operator.contains, sys.modules, module)
    return ReadGroup(
        tuple(names), _gated(gate, (unset,) * len(names), [by_name[n].read for n in names])
    )


def _native_group(torch: Any, by_name: dict[str, Flag]) -> ReadGroup | None:
    """python_native: every row is a function of the registry's three name sets."""
    names = [n for n in by_name if n.startswith("python_native.")]
    state = None
    with contextlib.suppress(Exception):
        state = sys.modules["torch._native.registry"]._filter_state
    if len(names) < 2 or state is None:
        return None
    if any(getattr(state, a, None) for a in ("_dsl_names", "_op_symbols", "_dispatch_keys")):
        return None
    closed = tuple(by_name[n].read() for n in names)

    def gate() -> bool:
        return bool(state._dsl_names or state._op_symbols or state._dispatch_keys)

    return ReadGroup(tuple(names), _gated(gate, closed, [by_name[n].read for n in names]))


def _legacy_precision_group(by_name: dict[str, Flag]) -> ReadGroup | None:
    """The two legacy precision getters, called directly while they do not raise."""
    names = [n for n in ("float32_matmul_precision", "cudnn.allow_tf32") if n in by_name]
    direct: list[Any] = [getattr(by_name[n].read, "args", (None,))[0] for n in names]
    if len(names) < 2 or not all(callable(d) for d in direct):
        return None
    first, second = direct
    slow = [by_name[n].read for n in names]

    def read() -> tuple[object, ...]:
        try:
            return (first(), second())
        except RuntimeError:  # the APIs were mixed: the rows' own reads say so
            return (slow[0](), slow[1]())

    return ReadGroup(tuple(names), read)


def _torch_function_reader(torch: Any, row: Flag | None) -> Callable[[], object] | None:
    """The torch-function state read through the cheap ``_is_torch_function_enabled``.

    Proved here: the gate is true with the state ``ENABLED`` and false under both
    ways of disabling torch-function handling, which change the state.
    """
    C = torch._C
    gate = getattr(C, "_is_torch_function_enabled", None)
    disablers = [
        getattr(C, n, None) for n in ("DisableTorchFunction", "DisableTorchFunctionSubclass")
    ]
    if row is None or gate is None or not gate() or not all(callable(d) for d in disablers):
        return None
    slow = row.read
    enabled = slow()
    try:
        for disabler in disablers:
            with disabler():  # type: ignore[misc]
                if gate() or slow() == enabled:
                    return None
    except Exception:  # an unusual build: keep the row's own reader
        return None
    if not gate() or slow() != enabled:
        return None

    def read() -> object:
        return enabled if gate() else slow()

    return read


def _nesting_reader(torch: Any, row: Flag | None) -> Callable[[], object] | None:
    """The autocast nesting count with torch's two C functions bound, not looked up."""
    increment: Any = getattr(torch._C, "autocast_increment_nesting", None)
    decrement: Any = getattr(torch._C, "autocast_decrement_nesting", None)
    if row is None or not callable(increment) or not callable(decrement):
        return None
    exposed: Any = getattr(torch, "autocast_increment_nesting", None)
    if exposed is not increment:
        return None  # patched or wrapped: the row's own reader says what torch does

    def read() -> object:
        level = increment()
        decrement()
        return int(level) - 1

    return read if read() == row.read() else None


def _global_reader(read: Callable[[], object]) -> Callable[[], object] | None:
    """``read``'s module-global lookup, for a getter whose whole body is ``return NAME``."""
    code = getattr(read, "__code__", None)
    namespace = getattr(read, "__globals__", None)
    closure = getattr(read, "__closure__", None)
    if code is None or not isinstance(namespace, dict) or code.co_argcount or closure:
        return None
    ops = [i for i in dis.get_instructions(code) if i.opname not in ("RESUME", "CACHE", "NOP")]
    if [i.opname for i in ops] != ["LOAD_GLOBAL", "RETURN_VALUE"]:
        return None
    name = ops[0].argval
    if name not in namespace:
        return None
    return functools.partial(namespace.get, name)


def _mha_reader(row: Flag | None) -> Callable[[], object] | None:
    """The MHA fast-path switch as its module global (the getter also asks TorchScript)."""
    module = sys.modules.get("torch.backends.mha")
    namespace = getattr(module, "__dict__", {})
    setter = getattr(module, "set_fastpath_enabled", None)
    if row is None or "_is_fastpath_enabled" not in namespace or not callable(setter):
        return None
    fast = functools.partial(namespace.get, "_is_fastpath_enabled")
    value = row.read()
    try:
        setter(not value)
        proved = fast() is row.read() is (not value)
    finally:
        setter(value)
    return fast if proved and fast() is value else None


def faster_readers(torch: Any, rows: Sequence[Flag]) -> dict[str, Callable[[], object]]:
    """Proved cheaper readers of the same raw value, by row name, for the fingerprint.

    A row's own ``read`` stays as it is (the oracle the fingerprint is tested against).
    """
    by_name = {r.name: r for r in rows if r.in_snapshot and not r.unmanaged}
    faster = {
        "modes.torch_function_state": _torch_function_reader(
            torch, by_name.get("modes.torch_function_state")
        ),
        "autocast.nesting": _nesting_reader(torch, by_name.get("autocast.nesting")),
        "mha.fastpath_enabled": _mha_reader(by_name.get("mha.fastpath_enabled")),
    }
    for name, row in by_name.items():
        if name not in faster:
            faster[name] = _global_reader(row.read)
    return {name: read for name, read in faster.items() if read is not None}


def grouped(torch: Any, rows: list[Flag]) -> list[Flag]:
    """``rows`` with the rows that are read together marked with their :class:`ReadGroup`."""
    by_name = {r.name: r for r in rows if r.in_snapshot and not r.unmanaged}
    from pytest_backends.flags.native_switches import native_group

    switches = native_group(torch, by_name)
    if switches is not None:  # its rows are in no other group
        by_name = {n: r for n, r in by_name.items() if n not in switches.names}
    groups = [
        switches,
        _autocast_group(torch, by_name),
        _print_group(torch, by_name),
        _module_hook_group(by_name),
        _config_group(by_name, "inductor.", "torch._inductor.config"),
        _native_group(torch, by_name),
        _legacy_precision_group(by_name),
    ]
    member: dict[str, ReadGroup] = {}
    for group in groups:
        if group is not None:
            member.update(dict.fromkeys(group.names, group))
    return [replace(r, group=member[r.name]) if r.name in member else r for r in rows]


class FlagRegistry:
    """Snapshot, validate, apply and restore the flags that exist in a torch."""

    def __init__(self, torch: Any, rows: list[Flag], absent: Mapping[str, str]) -> None:
        self._torch = torch
        rows = grouped(torch, rows)
        self.rows: tuple[Flag, ...] = tuple(sorted(rows, key=lambda r: r.order))
        self.by_name: dict[str, Flag] = {r.name: r for r in self.rows}
        self.absent: dict[str, str] = dict(absent)
        self.snapshot_rows: tuple[Flag, ...] = tuple(r for r in self.rows if r.in_snapshot)
        self._readers, self._layout = _plan(self.snapshot_rows, faster_readers(torch, rows))
        self._read_all = _call_all(self._readers)

    def names(self) -> list[str]:
        """Every flag name that can be set in this torch (snapshot rows and aliases)."""
        return [r.name for r in self.rows]

    def fingerprint(self) -> tuple[object, ...]:
        """Raw values of every snapshot row: cheap to take and to compare.

        One entry per reader: a row read alone, or the tuple of a group's rows.
        """
        return self._read_all()

    def to_plain(self, fingerprint: tuple[object, ...]) -> dict[str, object]:
        """Turn a :meth:`fingerprint` into a ``{name: plain value}`` snapshot."""
        return {
            r.name: r.plain(fingerprint[i] if j < 0 else fingerprint[i][j])  # type: ignore[index]
            for r, i, j in self._layout
        }

    def snapshot(self) -> dict[str, object]:
        """Every snapshot row as a plain value."""
        return self.to_plain(self.fingerprint())

    def validate(self, mapping: Mapping[str, object]) -> dict[str, object]:
        """Check names and values; return normalised values or raise ``ValueError``."""
        if not isinstance(mapping, Mapping):
            raise ValueError(f"expected a mapping of flag name to value, got {mapping!r}")
        normalised: dict[str, object] = {}
        for name, value in mapping.items():
            row = self.by_name.get(name) if isinstance(name, str) else None
            if row is None:
                raise ValueError(self._unknown_message(name))
            try:
                normalised[name] = row.check(value)
            except Invalid as exc:
                raise ValueError(f"invalid value for flag {name!r}: {exc}") from None
        return normalised

    def _unknown_message(self, name: object) -> str:
        if isinstance(name, str) and name in self.absent:
            version = getattr(self._torch, "__version__", "?")
            return f"flag {name!r} does not exist in this torch ({version}): {self.absent[name]}"
        known = self.names()
        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        return f"unknown backend flag {name!r}.{hint} Known flags: {', '.join(known)}"

    def apply(self, normalised: Mapping[str, object]) -> None:
        """Write already-validated values, parents before children.

        A value this build or machine refuses raises ``ValueError``; callers
        restore their snapshot (as :func:`override_flags` does).
        """
        ordered = sorted(normalised.items(), key=lambda kv: self.by_name[kv[0]].order)
        with unfrozen(self._torch):
            for name, value in ordered:
                if not self.by_name[name].last:
                    self._write(name, value)
        for name, value in ordered:
            if self.by_name[name].last:
                self._write(name, value)

    def _write(self, name: str, value: object) -> None:
        try:
            self.by_name[name].write(value)
        except (RuntimeError, TypeError, ValueError) as exc:
            # e.g. MAGMA on a CPU build, fp16 reductions on a CPU without fp16,
            # opt_einsum enabled without the package
            raise ValueError(
                f"flag {name!r} cannot be set to {value!r} with this torch and machine: {exc}"
            ) from exc

    def restore(self, snapshot: Mapping[str, object]) -> None:
        """Put every flag in ``snapshot`` back; all rows are tried before failing."""
        unknown = [n for n in snapshot if n not in self.by_name]
        if unknown:
            raise ValueError(self._unknown_message(unknown[0]))
        current = self.snapshot()
        errors: list[str] = []
        rows = [r for r in self.rows if r.name in snapshot]
        with unfrozen(self._torch):
            for row in rows:
                if not row.last:
                    self._restore_row(row, snapshot[row.name], current, errors)
        for row in rows:
            if row.last:
                self._restore_row(row, snapshot[row.name], current, errors)
        if errors:
            raise RuntimeError("could not restore torch backend flags: " + "; ".join(errors))

    def _restore_row(
        self, row: Flag, want: object, current: Mapping[str, object], errors: list[str]
    ) -> None:
        if row.parent is None and current.get(row.name) == want:
            return
        if row.unmanaged:
            return  # unknown to the plugin: reported, never written
        if row.unrestorable is not None:
            errors.append(f"{row.name} cannot be restored: {row.unrestorable}")
            return
        try:
            row.write(self._precision_value(row, want) if row.parent else want)
        except Exception as exc:  # keep going: one bad row must not block the rest
            errors.append(f"{row.name}={want!r}: {type(exc).__name__}: {exc}")

    def _precision_value(self, row: Flag, want: object) -> object:
        """The string to write so that a precision row reads ``want`` again.

        The getters report *effective* values (a leaf set to "none" reads what
        it inherits), so a leaf whose wanted value equals its parent's is
        written as "none" to keep it inheriting, as torch's defaults do.
        """
        assert row.parent is not None
        parent_value = self.by_name[row.parent].read()
        return "none" if want == parent_value else want

    @staticmethod
    def diff(
        before: Mapping[str, object], after: Mapping[str, object]
    ) -> dict[str, tuple[object, object]]:
        """``{name: (before, after)}`` for every flag whose value differs.

        A list and a tuple of equal items are one value (a snapshot read back
        from JSON has lists where it had tuples).
        """
        names = list(before) + [n for n in after if n not in before]
        return {
            n: (before.get(n), after.get(n))
            for n in names
            if before.get(n) != after.get(n) and not _same_items(before.get(n), after.get(n))
        }

    @staticmethod
    def visible(
        diff: Mapping[str, tuple[object, object]],
        before: Mapping[str, object],
        after: Mapping[str, object],
    ) -> dict[str, tuple[object, object]]:
        """``diff`` less the precision strings whose effective value did not change.

        A ``*.fp32_precision`` leaf set to ``"none"`` inherits from its backend's
        and then the generic string (``"ieee"`` where all are ``"none"``). The
        legacy setters (``allow_tf32``, ``set_float32_matmul_precision``) write
        the leaf itself: ``"none"`` becomes ``"ieee"`` with the kernels' precision
        unchanged. Such a change is still restored, but is not a leak to report.
        """
        return {
            n: change
            for n, change in diff.items()
            if not n.endswith(_PRECISION) or _effective(n, before) != _effective(n, after)
        }


_PRECISION = "fp32_precision"


def _same_items(a: object, b: object) -> bool:
    return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b)


def _effective(name: str, snapshot: Mapping[str, object]) -> object:
    """The precision ``name`` has in ``snapshot``, its ``"none"`` resolved through its parents."""
    parts = name.split(".")
    while True:
        value = snapshot.get(".".join(parts))
        if value is not None and value != "none":
            return value
        if len(parts) == 1:
            return "ieee"
        parts = [*parts[:-2], parts[-1]]


def _plan(
    rows: tuple[Flag, ...], faster: Mapping[str, Callable[[], object]]
) -> tuple[tuple[Callable[[], object], ...], tuple[tuple[Flag, int, int], ...]]:
    """The fingerprint's readers, and where each row's raw value sits in it.

    A row read alone is at ``fingerprint[i]`` (``j == -1``); a row of a
    :class:`ReadGroup` at ``fingerprint[i][j]``.
    A group is read once, where its first row is; a group some of whose rows
    are not snapshot rows here is not used (its rows are read alone).  A row read
    alone is read through its entry in ``faster`` where it has one.
    """
    present = {r.name for r in rows}
    readers: list[Callable[[], object]] = []
    at: dict[int, int] = {}
    layout: list[tuple[Flag, int, int]] = []
    for row in rows:
        group = row.group
        if group is None or not set(group.names) <= present:
            layout.append((row, len(readers), -1))
            readers.append(faster.get(row.name, row.read))
            continue
        if id(group) not in at:
            at[id(group)] = len(readers)
            readers.append(group.read)
        layout.append((row, at[id(group)], group.names.index(row.name)))
    return tuple(readers), tuple(layout)


def _call_all(readers: tuple[Callable[[], object], ...]) -> Callable[[], tuple[object, ...]]:
    """One function returning ``(readers[0](), readers[1](), ...)``.

    Generated, because a fingerprint is a loop of about a hundred calls of a few tens
    of nanoseconds each: a tuple display of calls skips the loop's own bytecode
    (about a quarter of the cost).  A ``functools.partial`` of positional arguments
    is called as its function with those arguments, which skips the partial's own
    call (the same call, a fifth cheaper).
    """
    bound: list[object] = []
    calls: list[str] = []
    for reader in readers:
        if type(reader) is functools.partial and not reader.keywords:
            names = [f"b{len(bound) + k}" for k in range(1 + len(reader.args))]
            bound += [reader.func, *reader.args]
            calls.append(f"{names[0]}({', '.join(names[1:])}), ")
        else:
            calls.append(f"b{len(bound)}(), ")
            bound.append(reader)
    params = ", ".join(f"b{i}" for i in range(len(bound)))
    source = f"def read_all({params}):\n    return lambda: ({''.join(calls)})\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<pytest_backends fingerprint>", "exec"), namespace)
    return namespace["read_all"](*bound)  # type: ignore[no-any-return]


@functools.cache
def registry() -> FlagRegistry:
    """The registry for the running torch (built once, on first use)."""
    import torch
    import torch.backends.opt_einsum

    rows, absent = build_catalogue(torch)
    return FlagRegistry(torch, rows, absent)


def flag_names() -> list[str]:
    """Every flag name that can be set with :func:`override_flags` in this torch."""
    return registry().names()


def snapshot_flags() -> dict[str, object]:
    """Every flag that exists in this torch, as plain values."""
    return registry().snapshot()


def restore_flags(snapshot: Mapping[str, object]) -> None:
    """Restore the flags captured by :func:`snapshot_flags`."""
    registry().restore(snapshot)


def diff_flags(
    before: Mapping[str, object], after: Mapping[str, object]
) -> dict[str, tuple[object, object]]:
    """``{name: (before, after)}`` for every flag that differs between two snapshots."""
    return FlagRegistry.diff(before, after)


def format_diff(diff: Mapping[str, tuple[object, object]]) -> str:
    """One ``name: before -> after`` line per changed flag."""
    return "\n".join(f"  {name}: {b!r} -> {a!r}" for name, (b, a) in diff.items())


@contextlib.contextmanager
def override_flags(mapping: Mapping[str, object]) -> Iterator[dict[str, object]]:
    """Set the given flags, and restore **every** flag on exit, also on exceptions.

    Names and values are validated before anything changes: an unknown name or
    an invalid value raises ``ValueError`` naming the flag and the allowed
    values.  The context value is the snapshot taken on entry.
    """
    reg = registry()
    normalised = reg.validate(mapping)
    before = reg.snapshot()
    try:
        reg.apply(normalised)
        yield before
    finally:
        reg.restore(before)


def torch_imported() -> bool:
    """Whether something in this process has imported torch already (never imports it)."""
    return "torch" in sys.modules
