"""Which function-scoped fixture's teardown changed which flags, during one test's teardown.

A flag a fixture changes after its ``yield`` (or in a finalizer) is found at
the end of the test's teardown, like one the test body left changed. The
guard tells them apart by a fingerprint when the teardown phase begins and
one after each such fixture is finalized: a change between two of them is
that fixture's. Only fixtures with teardown code are followed, so a test
whose fixtures have none pays nothing.

Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TeardownOwners", "fixture_label", "teardown_messages"]


def fixture_label(fixturedef: Any) -> str:
    """How reports name a fixture: its name, scope and where it is defined."""
    where = getattr(fixturedef, "baseid", "") or getattr(
        getattr(fixturedef, "func", None), "__module__", "a plugin"
    )
    return f"fixture {fixturedef.argname!r} ({fixturedef.scope} scope, defined in {where})"


def teardown_messages(by_fixture: Mapping[str, Mapping[str, tuple[object, object]]]) -> list[str]:
    """One leak message per fixture whose teardown left flags changed."""
    from pytest_backends.isolation.snapshot import diff_lines

    return [
        f"{label} changed torch backend flags in its teardown (after its yield, or in a "
        f"finalizer) and did not restore them:\n{diff_lines(changes)}\nThey were restored "
        "for the next test; restore them in the fixture's teardown."
        for label, changes in by_fixture.items()
    ]


def _pytest_own(finalizer: Any) -> bool:
    """pytest's own finalizer of every fixture (it forgets the cached value): no user code."""
    return (
        getattr(finalizer, "__name__", "") == "<lambda>"
        and getattr(finalizer, "__module__", "") == "_pytest.fixtures"
    )


def _has_teardown(fixturedef: Any) -> bool:
    """Whether the fixture registered teardown code while it was set up (unknown: True)."""
    finalizers = getattr(fixturedef, "_finalizers", None)
    if finalizers is None:
        return True
    return any(not _pytest_own(f) for f in finalizers)


class TeardownOwners:
    """The fixtures of one test whose teardown may change flags, and what each changed."""

    def __init__(self) -> None:
        self._labels: dict[int, str] = {}
        self._checkpoint: Any = None
        #: flag name -> the label of the fixture whose teardown made its last change
        self.changed_by: dict[str, str] = {}

    def watch(self, fixturedef: Any, label: str) -> None:
        """Follow ``fixturedef``'s teardown if it is function-scoped and has one."""
        if fixturedef.scope == "function" and _has_teardown(fixturedef):
            self._labels[id(fixturedef)] = label

    def follows(self, fixturedef: Any = None) -> bool:
        """Whether ``fixturedef`` (None: any fixture of the test) is followed."""
        return bool(self._labels) if fixturedef is None else id(fixturedef) in self._labels

    def begin(self, registry: Any) -> None:
        """The teardown phase begins: the state each followed fixture's change is taken from."""
        if self._labels:
            self._checkpoint = registry.fingerprint()

    def finalized(self, registry: Any, fixturedef: Any) -> None:
        """``fixturedef`` was finalized: what changed since the last checkpoint is its."""
        label = self._labels.pop(id(fixturedef), None)
        if label is None or self._checkpoint is None:
            return
        fp = registry.fingerprint()
        if fp == self._checkpoint:
            return
        before, after = registry.to_plain(self._checkpoint), registry.to_plain(fp)
        for name in registry.diff(before, after):
            self.changed_by[name] = label
        self._checkpoint = fp

    def split(
        self, leaked: Mapping[str, tuple[object, object]]
    ) -> tuple[dict[str, dict[str, tuple[object, object]]], dict[str, tuple[object, object]]]:
        """``leaked`` as ``({fixture label: its leaks}, the rest)``."""
        by_fixture: dict[str, dict[str, tuple[object, object]]] = {}
        rest: dict[str, tuple[object, object]] = {}
        for name, change in leaked.items():
            label = self.changed_by.get(name)
            if label is None:
                rest[name] = change
            else:
                by_fixture.setdefault(label, {})[name] = change
        return by_fixture, rest
