"""Threads that may change flags behind a test's back, and where they came from.

torch's flags are process-global, so a change found after a test may have
been made by another thread.  The guard names the suspects in its message: a
thread an earlier test started, or one running the suite's own code (a
conftest.py, a helper module); never the threads of pytest and its plugins,
which exist before any conftest runs.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pytest_backends.isolation.watch import TorchStateWatch

__all__ = ["ThreadOrigins", "hint"]


class ThreadOrigins:
    """Where the threads alive in this process came from, as far as the suite is concerned."""

    def __init__(self, watch: TorchStateWatch) -> None:
        self.watch = watch
        self._by_test: weakref.WeakKeyDictionary[threading.Thread, str] = (
            weakref.WeakKeyDictionary()
        )
        self._suite: weakref.WeakKeyDictionary[threading.Thread, str | None] = (
            weakref.WeakKeyDictionary()
        )
        # Threads still running when the test that started them ended: (thread, name, origin).
        self._strays: list[tuple[weakref.ref[threading.Thread], str, str]] = []
        # the last listing of alive(), and the version of threading's registries it was taken at
        self._listing: tuple[list[threading.Thread], int | None] = ([], None)
        self._registries: tuple[object, object, Callable[[], int] | None] | None = None

    def alive(self) -> list[threading.Thread]:
        """``threading.enumerate()``: the same list again while no thread started or ended.

        A thread's start and end write ``threading``'s registries of threads, which
        moves their dicts' version tags (see ``flags.module_attributes.version_reader``);
        where those cannot be read, every call lists the threads. The caller must not
        change the list.
        """
        active, limbo = getattr(threading, "_active", None), getattr(threading, "_limbo", None)
        registries = self._registries
        if registries is None or registries[0] is not active or registries[1] is not limbo:
            # loaded with torch's flags (the catalogue): a session without torch imports
            # nothing more for this, and lists the threads each time until torch comes
            versions: Any = sys.modules.get("pytest_backends.flags.module_attributes")
            if versions is None:
                return threading.enumerate()
            dicts = [d for d in (active, limbo) if isinstance(d, dict)]
            registries = self._registries = (
                active,
                limbo,
                versions.version_reader(dicts) if len(dicts) == 2 else None,
            )
            self._listing = ([], None)
        version = registries[2]() if registries[2] is not None else None  # before the listing
        listing, seen = self._listing
        if version is not None and version == seen:
            return listing
        listing = threading.enumerate()
        self._listing = (listing, version)
        return listing

    def started_by(self, threads: Iterable[threading.Thread], nodeid: str) -> None:
        """Remember that the test ``nodeid`` started ``threads``, still running at its end."""
        for thread in threads:
            self._by_test[thread] = f"by {nodeid}"
            self._strays.append((weakref.ref(thread), thread.name, f"by {nodeid}"))

    def finished(self) -> list[tuple[str, str]]:
        """``(name, origin)`` of the threads that outlived their test and have finished since.

        A thread that ends between two checks is named where the second one finds a
        change, although it is no longer running.
        """
        return [(name, origin) for ref, name, origin in self._strays if _ended(ref)]

    def settled(self) -> None:
        """A check found no change: a thread finished since is no suspect of a later one."""
        if self._strays:
            self._strays = [s for s in self._strays if not _ended(s[0])]

    def suspects(self, alive: list[threading.Thread] | None = None) -> list[tuple[str, str]]:
        """``(name, origin)`` of the live threads that may change flags.

        ``alive``: ``threading.enumerate()`` as the caller just took it.
        """
        current = threading.current_thread()
        suspects = []
        for thread in threading.enumerate() if alive is None else alive:
            if thread is current or thread in self.watch.infra_threads:
                continue
            origin = self._by_test.get(thread) or self._suite_origin(thread)
            if origin is not None:
                suspects.append((thread.name, origin))
        return suspects

    def _suite_origin(self, thread: threading.Thread) -> str | None:
        """ "outside any test (running <code>)" for a thread running the suite's code."""
        if thread not in self._suite:
            func = getattr(thread, "_target", None) or type(thread).run
            code = getattr(func, "__code__", None)
            name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
            in_suite = code is not None and self._in_rootdir(code.co_filename)
            self._suite[thread] = f"outside any test (running {name})" if in_suite else None
        return self._suite[thread]

    def _in_rootdir(self, file: str) -> bool:
        root = self.watch.rootpath
        if not file or root is None or "site-packages" in file:
            return False
        try:
            return Path(file).resolve().is_relative_to(root.resolve())
        except (OSError, ValueError):
            return False


def _ended(ref: weakref.ref[threading.Thread]) -> bool:
    thread = ref()
    return thread is None or not thread.is_alive()


def hint(
    threads: list[tuple[str, str]],
    when: str = "during this test",
    finished: list[tuple[str, str]] | None = None,
) -> str:
    """The message's paragraph naming ``threads`` and ``finished`` ones (empty when none)."""
    lines = "".join(
        f"\n  thread {name!r}, started {origin}, was running {when}" for name, origin in threads
    ) + "".join(
        f"\n  thread {name!r}, started {origin}, was still running when that test ended "
        "(it has finished since)"
        for name, origin in finished or ()
    )
    if not lines:
        return ""
    return f"\nFlags are process-global, so another thread may have made this change:{lines}"
