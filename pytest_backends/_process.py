"""How a child process ended, read from outside it (Linux ``/proc``).

The CPU level controller and the matrix report both name the way a
pytest-xdist worker died (``killed by signal SIGSEGV``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

__all__ = ["describe_exit", "exit_status"]


def describe_exit(status: int) -> str:
    """``exit code 1`` or ``killed by signal SIGSEGV`` from a ``waitpid``-style status."""
    if status & 0x7F:
        number = status & 0x7F
        try:
            return f"killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit code {(status >> 8) & 0xFF}"


def exit_status(pid: int, wait_s: float = 1.0) -> int | None:
    """The exit status of a dead, unreaped child (Linux ``/proc``), or ``None``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = text[text.rfind(")") + 2 :].split()
        # fields[0] is field 3 (state); field 52 is the exit code.
        if fields and fields[0] in ("Z", "X") and len(fields) >= 50:
            return int(fields[49])
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
