"""Changes made by a conftest's test-phase hooks are the hook's, not the test's.

A ``pytest_runtest_setup``, ``pytest_runtest_call`` or ``pytest_runtest_teardown``
implementation in a ``conftest.py`` runs inside the test's protocol, between the
guard's two boundaries, so a flag it sets would be blamed on every test (or, in
teardown, on whichever fixture is finalized next). The guard wraps each such
implementation when its conftest is registered: a fingerprint before it runs, and
what it changed is the hook's (the guard's ``hook_changed``). Only conftests with
such hooks load this module, so a suite without them pays nothing.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from pytest_backends.isolation.snapshot import Fingerprint, diff_lines

__all__ = ["HOOKS_TITLE", "HookChange", "hook_findings", "hook_message", "watch_conftest"]

#: Set on a wrapped implementation, so that it is never wrapped twice.
_WATCHED = "__pytest_backends_watched__"

#: What one hook call changed: its label, the test phase, and ``{row: (before, after)}``.
HookChange = tuple[str, str, dict[str, tuple[object, object]]]

#: The summary section of changes made by hooks.
HOOKS_TITLE = "torch backend flags changed by hooks"

_PHASES = {
    "pytest_runtest_setup": "setup",
    "pytest_runtest_call": "call",
    "pytest_runtest_teardown": "teardown",
}


def hook_message(label: str, phase: str, diff_text: str) -> str:
    """The report of what hook ``label`` left changed in a test's ``phase``."""
    return (
        f"{label} changed torch backend flags in the {phase} of tests and did not restore "
        f"them:\n{diff_text}\nThey were restored after each test; the tests are not to "
        "blame. Set them in an autouse fixture with pytest_backends.override_flags(), "
        "which restores them, or restore them in the hook."
    )


def hook_findings(reg: Any, changes: list[HookChange], after: dict[str, object]) -> list[str]:
    """The messages for what the hooks of one test left changed at its end (``after``).

    A row a later hook put back (a teardown hook undoing its setup hook) is
    no finding; a row left changed is the last hook's that changed it.
    """
    if not changes:
        return []
    first: dict[str, object] = {}
    last: dict[str, tuple[str, str]] = {}
    for label, phase, delta in changes:
        for name, (before, _after) in delta.items():
            first.setdefault(name, before)
            last[name] = (label, phase)
    left = {name: (b, after.get(name)) for name, b in first.items() if after.get(name) != b}
    left = reg.visible(left, {**after, **first}, after)
    by_hook: dict[tuple[str, str], dict[str, tuple[object, object]]] = {}
    for name, change in left.items():
        by_hook.setdefault(last[name], {})[name] = change
    return [hook_message(label, phase, diff_lines(d)) for (label, phase), d in by_hook.items()]


class _Guard(Protocol):
    def checkpoint(self) -> Fingerprint | None: ...

    def hook_changed(self, label: str, phase: str, before_fp: Fingerprint) -> None: ...


def watch_conftest(guard: _Guard, plugin: object, manager: pytest.PytestPluginManager) -> None:
    """Wrap ``plugin``'s (a conftest's) test-phase hook implementations for ``guard``."""
    path = str(getattr(plugin, "__file__", ""))
    try:
        where = os.path.relpath(path)
    except ValueError:  # another drive
        where = path
    for name, phase in _PHASES.items():
        for impl in getattr(manager.hook, name).get_hookimpls():
            if impl.plugin is not plugin or getattr(impl.function, _WATCHED, False):
                continue
            if impl.hookwrapper or getattr(impl, "wrapper", False):
                continue  # a generator around the others: what it changes is theirs too
            impl.function = _watched(guard, impl.function, f"the {name} hook in {where}", phase)


def _watched(
    guard: _Guard, function: Callable[..., object], label: str, phase: str
) -> Callable[..., object]:
    @functools.wraps(function)
    def watched(*args: Any, **kwargs: Any) -> object:
        before = guard.checkpoint()
        if before is None:
            return function(*args, **kwargs)
        try:
            return function(*args, **kwargs)
        finally:
            guard.hook_changed(label, phase, before)

    setattr(watched, _WATCHED, True)
    return watched
