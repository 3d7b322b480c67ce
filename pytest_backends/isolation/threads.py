"""Threads that may change flags behind a test's back, and where they came from.

torch's flags are process-global, so a change found after a test may have
been made by another thread.  The guard names the suspects in its message: a
thread an earlier test started, or one running the suite's own code (a
conftest.py, a helper module); never the threads of pytest and its plugins,
which exist before any conftest runs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from pathlib import Path

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

    def started_by(self, threads: Iterable[threading.Thread], nodeid: str) -> None:
        """Remember that the test ``nodeid`` started ``threads``."""
        for thread in threads:
            self._by_test[thread] = f"by {nodeid}"

    def suspects(self) -> list[tuple[str, str]]:
        """``(name, origin)`` of the live threads that may change flags."""
        current = threading.current_thread()
        suspects = []
        for thread in threading.enumerate():
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


def hint(threads: list[tuple[str, str]], when: str = "during this test") -> str:
    """The message's paragraph naming ``threads`` (empty when there are none)."""
    if not threads:
        return ""
    lines = "".join(
        f"\n  thread {name!r}, started {origin}, was running {when}" for name, origin in threads
    )
    return f"\nFlags are process-global, so another thread may have made this change:{lines}"
