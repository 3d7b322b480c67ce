"""Recording the ops a test runs with ``torch.profiler``, for the kernel-path verifier.

The verifier (:mod:`pytest_backends.matrix.verify`) checks op names and, for
oneDNN, attributes primitives to the ops that ran them; this module only
records: op names, op events with input shapes and parents, and the CUDA
kernels that ran.  Torch is imported when a recorder starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_backends.kernels import PROBE_SCOPE, OpEvent

__all__ = ["ProfilerOpRecorder"]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Hide the banner lines kineto writes to fd 2 when a profiler starts and stops."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class ProfilerOpRecorder:
    """Records the names of every op the dispatcher runs (``torch.profiler``, CPU side).

    With ``shapes`` it also keeps the op events (:attr:`events`: name, input
    shapes, parent), which attributing oneDNN primitives needs.
    """

    shapes: bool = False
    cuda: bool = False
    _profiler: Any = field(default=None, repr=False)
    error: str | None = None
    events: list[OpEvent] = field(default_factory=list)
    #: names of the CUDA kernels that ran (with ``cuda``)
    kernels: list[str] = field(default_factory=list)

    def start(self) -> bool:
        """Start recording; ``False`` (with :attr:`error`) if the profiler cannot start."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._profiler = profile(activities=activities, record_shapes=self.shapes)
        try:
            with _quiet_stderr():
                self._profiler.__enter__()
        except RuntimeError as exc:  # e.g. the test session already runs a profiler
            self._profiler, self.error = None, f"the profiler could not start: {exc}"
            return False
        return True

    def stop(self) -> frozenset[str]:
        """Stop recording and return the op names seen."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return frozenset()
        with _quiet_stderr():
            profiler.__exit__(None, None, None)
        # the tolerance model's one-time probes are not the test's ops
        everything = list(profiler.events())
        raw = [e for e in everything if not _inside_probe(e) and not _on_gpu(e)]
        if self.shapes:
            self.events = _op_events(raw)
        if self.cuda:
            self.kernels = [e.name for e in everything if _on_gpu(e)]
            for event in raw:  # kernels launched by ops appear as their children too
                self.kernels.extend(k.name for k in getattr(event, "kernels", ()) or ())
        return frozenset(event.name for event in raw)


def _on_gpu(event: Any) -> bool:
    return "CUDA" in str(getattr(event, "device_type", ""))


def _inside_probe(event: Any) -> bool:
    while event is not None:
        if event.name == PROBE_SCOPE:
            return True
        event = getattr(event, "cpu_parent", None)
    return False


def _op_events(raw: Sequence[Any]) -> list[OpEvent]:
    """Profiler events in start order, with shapes and parent indices."""
    ordered = sorted(raw, key=lambda e: (e.time_range.start, -e.time_range.end))
    index = {id(e): i for i, e in enumerate(ordered)}
    events = []
    for event in ordered:
        parent = getattr(event, "cpu_parent", None)
        shapes = tuple(
            tuple(int(d) for d in shape)
            for shape in (getattr(event, "input_shapes", None) or ())
            if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape)
        )
        events.append(OpEvent(event.name, shapes, index.get(id(parent)) if parent else None))
    return events
