"""The files a CPU level worker leaves for its controller, in case it dies.

The worker writes its pid, the test it is running and a fault-handler dump
into a directory the controller made; when the worker crashes, the controller
reads them to say which test, in which config, died how.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Notes", "fault_tail"]


@dataclass
class Notes:
    """Per-worker files in the controller's notes directory."""

    root: Path

    def current(self, worker: str) -> Path:
        """The note naming the test ``worker`` is running (and its config)."""
        return self.root / f"{worker}.current.json"

    def fault(self, worker: str) -> Path:
        """The fault-handler dump of ``worker``."""
        return self.root / f"{worker}.fault"

    def pid(self, worker: str) -> Path:
        """The process id of ``worker``."""
        return self.root / f"{worker}.pid"


def fault_tail(text: str, lines: int = 12) -> str:
    """The useful part of a fault-handler dump: the error line and the first frames."""
    kept = [line for line in text.splitlines() if line.strip()]
    fatal = [i for i, line in enumerate(kept) if "Fatal Python error" in line]
    if fatal:
        kept = kept[fatal[-1] :]
    shown = kept[:lines] + (["..."] if len(kept) > lines else [])
    return "\n".join(f"    {line}" for line in shown)
