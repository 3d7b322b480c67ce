"""The environment lines of a report, under pytest-xdist too.

A report's ``environment`` lists what the machine supports (torch, CUDA,
cuDNN, CPU capability, ...). Without xdist the process that runs the tests
writes the report and knows these facts. Under xdist the controller runs no
test, so it probes its own facts at the end of the session, and every worker
sends its own lines back (through :mod:`pytest_backends._xdist`); a worker line that differs from
the controller's (a worker pinned to another CPU capability level, say) is
added, prefixed with the workers that report it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pytest_backends import _xdist

__all__ = ["CHANNEL", "ControllerEnvironment", "WorkerEnvironment", "combine", "lines"]

#: What a worker leaves for the controller: its environment lines.
CHANNEL = _xdist.channel("environment")


def lines() -> list[str]:
    """This process's environment lines (probes torch; cached per process)."""
    from pytest_backends.matrix.availability import header_lines, probe

    return [line.removeprefix("backends: ") for line in header_lines(probe())]


def _parts(text: str) -> list[str]:
    return [part.strip() for part in text.split(";") if part.strip()]


def combine(controller: Sequence[str], workers: Mapping[str, Sequence[str]]) -> list[str]:
    """The controller's lines, then each worker fact that differs from them.

    Facts are compared one ``;``-separated part at a time, so a worker whose
    CPU capability differs adds ``gw1: CPU capability: AVX2 (x86_64)`` and not
    its whole line.
    """
    known = {part for line in controller for part in _parts(line)}
    extra: dict[str, list[str]] = {}
    for worker in sorted(workers, key=_worker_order):
        for line in workers[worker]:
            for part in _parts(line):
                if part not in known:
                    extra.setdefault(part, []).append(worker)
    out = list(controller)
    out += [f"{', '.join(names)}: {part}" for part, names in extra.items()]
    return out


def _worker_order(name: str) -> tuple[int, str]:
    digits = name.removeprefix("gw")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


class WorkerEnvironment:
    """Worker side: send this worker's environment lines to the controller."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from pytest_backends.matrix.availability import torch_imported

        if _xdist.is_worker(self.config) and torch_imported():
            _xdist.put(self.config, CHANNEL, lines())


class ControllerEnvironment:
    """Controller side: collect the workers' environment lines as they finish."""

    def __init__(self) -> None:
        self.workers: dict[str, list[str]] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Keep the lines a finished worker sent (a crashed worker sends none)."""
        sent = _xdist.collected(node, CHANNEL)
        if isinstance(sent, list) and all(isinstance(line, str) for line in sent):
            self.workers[_xdist.node_id(node)] = sent
