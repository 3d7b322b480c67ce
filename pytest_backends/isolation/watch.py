"""torch's state from the moment torch finished importing, and the suite's baseline.

An import hook (a meta path finder placed before the others) takes the
snapshot when ``import torch`` finishes, before any user code can change a
flag, so the guard works whoever imports torch and a suite that never imports
torch never pays for it.  Changes made while a conftest.py or plugin is
imported or configured become the suite's baseline, with the source that made
them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_backends.isolation.snapshot import Fingerprint, registry

__all__ = ["HOOK_SOURCE", "WATCH", "Change", "TorchStateWatch", "torch_own", "watch_torch"]

#: Where a change made by a hook (not while importing a file) is said to come from.
HOOK_SOURCE = "a hook of a conftest.py or plugin"


@dataclass
class Change:
    """Flags changed by one source outside any test (a conftest, a test module)."""

    source: str
    diff: dict[str, tuple[object, object]]


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch`` like the other finders do, and calls back once it has executed."""

    def __init__(self, on_loaded: Callable[[], None]) -> None:
        self._on_loaded = on_loaded
        self._busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec
        on_loaded = self._on_loaded

        def exec_then_snapshot(module: types.ModuleType) -> None:
            exec_module(module)
            on_loaded()

        # An instance attribute on this spec's own loader: module.__loader__ stays
        # torch's real loader.  An unusual loader that refuses it just means the
        # snapshot is taken when the guard first looks.
        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_then_snapshot  # type: ignore[union-attr]
        found: importlib.machinery.ModuleSpec = spec
        return found


class TorchStateWatch:
    """torch's state from the moment torch finished importing, and the suite's baseline.

    One per process, because torch's state is per process.  ``baseline`` is
    the import-time state plus what conftest files and plugins changed before
    the first test; ``baseline_changes`` says who changed what.
    """

    def __init__(self) -> None:
        self.import_state: dict[str, object] | None = None
        self.baseline: dict[str, object] = {}
        self.baseline_fp: Fingerprint | None = None
        self.baseline_changes: list[Change] = []
        self.error: str | None = None
        self.settled = False  # set when the first test starts: no more baseline changes
        self.rootpath: Path | None = None
        # threads that exist before any conftest runs (pytest's, xdist's): never suspects
        self.infra_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet(
            threading.enumerate()
        )
        self._finder: _TorchFinder | None = None

    def install(self, rootpath: Path | None) -> None:
        """Take the snapshot now if torch is loaded, else when it finishes importing."""
        if rootpath is not None and self.rootpath is None:
            self.rootpath = rootpath
        if self.import_state is not None or self._finder is not None:
            return
        if "torch" in sys.modules:
            self._snapshot()
            return
        self._finder = _TorchFinder(self._loaded)
        sys.meta_path.insert(0, self._finder)

    def _loaded(self) -> None:
        finder, self._finder = self._finder, None
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
        self._snapshot()

    def _snapshot(self) -> None:
        if self.import_state is not None:
            return
        try:
            reg = registry()
            fp = reg.fingerprint()
        except Exception as exc:  # never break `import torch` for the user
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.import_state = reg.to_plain(fp)
        self.baseline, self.baseline_fp = dict(self.import_state), fp

    def ready(self) -> bool:
        """Whether torch is loaded and its import-time state known."""
        if self.import_state is None and "torch" in sys.modules and self.error is None:
            torch = sys.modules["torch"]
            spec = getattr(torch, "__spec__", None)
            if not getattr(spec, "_initializing", False):
                self._snapshot()  # torch came in without the hook (installed late)
        return self.import_state is not None

    def checkpoint(self, source: str) -> None:
        """Adopt any change since the last checkpoint into the baseline, naming ``source``."""
        if self.settled or not self.ready():
            return
        reg = registry()
        fp = reg.fingerprint()
        if fp == self.baseline_fp:
            return
        current = reg.to_plain(fp)
        diff = reg.diff(self.baseline, current)
        self.baseline, self.baseline_fp = current, fp
        for name in torch_own(diff):  # torch's own, not the source's
            del diff[name]
        if diff:
            self.baseline_changes.append(Change(source, diff))

    def source_of(self, plugin: object) -> str | None:
        """A readable source for a registered plugin module (conftest paths relative)."""
        if not isinstance(plugin, types.ModuleType):
            return None
        file = getattr(plugin, "__file__", None)
        if not file:
            return f"plugin {plugin.__name__}"
        if self.rootpath is not None:
            try:
                return os.path.relpath(file, self.rootpath)
            except ValueError:  # another drive on Windows
                pass
        return str(file)

    def baseline_lines(self) -> list[str]:
        """One line per source whose changes are still in the baseline."""
        if self.import_state is None:
            return []
        by_source: dict[str, list[str]] = {}
        for change in self.baseline_changes:
            for name in change.diff:
                for other in by_source.values():
                    other[:] = [e for e in other if not e.startswith(f"{name}=")]
                value = self.baseline.get(name)
                if value != self.import_state.get(name):
                    by_source.setdefault(change.source, []).append(f"{name}={value}")
        return [
            f"session baseline differs from torch defaults: {', '.join(entries)} ({source})"
            for source, entries in by_source.items()
            if entries
        ]

    # -- hooks (the watch is registered as a plugin before conftests load) --

    def pytest_plugin_registered(self, plugin: object) -> None:
        """A conftest (or plugin module) was imported: its changes become the baseline."""
        source = self.source_of(plugin)
        if source is not None:
            self.checkpoint(source)

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        """Changes made by pytest_configure hooks of conftests and plugins."""
        self.checkpoint(HOOK_SOURCE)


#: The process's watch.  Module state on purpose: torch's flags are per
#: process, and the import hook must exist before any conftest imports torch.
WATCH = TorchStateWatch()


def watch_torch(config: pytest.Config) -> TorchStateWatch:
    """Install the import hook (idempotent); the watch, for ``plugin.py`` to register."""
    WATCH.install(getattr(config, "rootpath", None))
    return WATCH


def torch_own(delta: Mapping[str, tuple[object, object]]) -> dict[str, object]:
    """The changes in ``delta`` that are torch's own first-use settings (see :mod:`.first_use`).

    The rule's module is imported only once a flag changed: an idle session never needs it.
    """
    if not delta:
        return {}
    from pytest_backends.isolation.first_use import FIRST_USE

    return FIRST_USE.claim(delta)
