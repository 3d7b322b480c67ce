"""The machine a benchmark ran on, and where its figures go: shared by every benchmark.

Each result file names the CPU model and the features that matter to the
figures beside it (the CPU model changes between runs of this project's
benchmarks), so :func:`describe` reads ``/proc/cpuinfo`` once for all of them.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable
from pathlib import Path


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = "", frozenset[str]()
    numbers: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = frozenset(value.split())
            elif key in ("cpu family", "model", "stepping") and key not in numbers:
                numbers[key] = value.strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in numbers and "model" in numbers:
        # A virtual machine's model name can be as bare as "Intel(R) Xeon(R) Processor":
        # the numbers tell two such CPUs apart.
        model += f" (family {numbers['cpu family']}, model {numbers['model']})"
    return model, flags


def cpu_model() -> str:
    """The CPU's model name, with its family and model numbers where ``/proc/cpuinfo`` has them."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, as ``/proc/cpuinfo`` spells them (empty where unreadable)."""
    return _cpuinfo()[1]


def describe(wanted: Iterable[str]) -> str:
    """``"<model>; <n> logical CPUs; features: a, b"``: the ``wanted`` features it has."""
    have = ", ".join(f for f in wanted if f in cpu_flags()) or "none of note"
    return f"{cpu_model()}; {os.cpu_count()} logical CPUs; features: {have}"


def write_result(text: str, out: Path) -> None:
    """Print ``text`` and write it to ``out`` (a file under ``benchmarks/results``)."""
    print(text, end="" if text.endswith("\n") else "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text if text.endswith("\n") else text + "\n")
