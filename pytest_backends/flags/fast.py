"""Reading many rows in one call: the groups behind a cheap fingerprint.

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
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_backends.flags.row import Flag

__all__ = ["ReadGroup", "grouped"]


@dataclass(frozen=True, eq=False)
class ReadGroup:
    """Rows read together: ``read()`` returns the raw values of ``names``, in that order."""

    names: tuple[str, ...]
    read: Callable[[], tuple[object, ...]]


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


def grouped(torch: Any, rows: list[Flag]) -> list[Flag]:
    """``rows`` with the rows that are read together marked with their :class:`ReadGroup`."""
    by_name = {r.name: r for r in rows if r.in_snapshot and not r.unmanaged}
    groups = [
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
