"""Flags a test module sets while it is imported: they belong to that module's tests.

pytest imports every test module before running any test, so a flag a module
sets at import time would otherwise reach the tests of every module collected
after it.  The guard treats it like a module-scoped autouse fixture: it is
applied around the module's own tests and the baseline is restored for every
other module's tests, whatever the collection order; the module is named once,
as a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from pytest_backends.isolation.findings import Findings
from pytest_backends.isolation.markers import marker_mode
from pytest_backends.isolation.snapshot import diff_lines, registry
from pytest_backends.isolation.watch import TorchStateWatch, torch_own

__all__ = ["ModuleFlags"]

_SECTION = "torch backend flags set while importing test modules (warning)"


class ModuleFlags:
    """The flags each test module set while imported (by the module's node id)."""

    def __init__(self) -> None:
        self._by_module: dict[str, dict[str, object]] = {}

    def check_import(
        self,
        collector: pytest.Collector,
        watch: TorchStateWatch,
        default_mode: str,
        restore: Callable[[Any, Mapping[str, object]], None],
        findings: Findings,
    ) -> None:
        """After ``collector`` (a file) was imported: keep what it changed, restore the baseline."""
        if watch.settled or not watch.ready():
            return
        reg = registry()
        fp = reg.fingerprint()
        if fp == watch.baseline_fp:
            return
        diff = reg.diff(watch.baseline, reg.to_plain(fp))
        own = torch_own(diff)
        if own:  # torch's own first-use setting: the baseline from now on
            watch.baseline.update(own)
            diff = {name: change for name, change in diff.items() if name not in own}
            if not diff:
                watch.baseline_fp = fp
        if not diff:
            return
        mode, _error = marker_mode(collector, default_mode)
        if mode == "off":
            # not guarded: nothing restores, so the change is the baseline from now on
            watch.checkpoint(f"{collector.nodeid} (import, not checked)")
            return
        self._by_module[collector.nodeid] = {name: a for name, (_b, a) in diff.items()}
        restore(reg, watch.baseline)
        watch.baseline_fp = reg.fingerprint()
        findings.add(
            _SECTION,
            f"{collector.nodeid} changed torch backend flags while it was imported:\n"
            f"{diff_lines(diff)}\n"
            "pytest imports every test module before running any test, so these flags would "
            "also reach the tests of every module collected after it. pytest-backends applies "
            "them to this module's own tests only and restores the baseline for every other "
            "module's tests. To make this explicit, set them in a fixture (scope='module', "
            "autouse=True) with pytest_backends.override_flags(), or in conftest.py to make "
            "them the suite's baseline.",
            fails=False,
        )

    def of(self, item: pytest.Item) -> dict[str, object] | None:
        """The flags ``item``'s module set while it was imported, if any."""
        if not self._by_module:
            return None
        node: Any = item
        while node is not None:
            if isinstance(node, pytest.File):
                return self._by_module.get(node.nodeid)
            node = node.parent
        return None
