"""The one protocol of the plugin's op recorders: record the ops that run while entered.

Four recorders share it: the determinism check's
:class:`~pytest_backends.determinism.record_python.PythonRecorder` and
:class:`~pytest_backends.determinism.record_native.NativeRecorder`, the batch
locator's :class:`~pytest_backends.batch.locate.RowRecorder` and the kernel-path
comparison's :class:`~pytest_backends.paths.record.PathRecorder`. Each module
checks its class against :class:`Recorder` under ``mypy --strict``.

Importing this module imports nothing.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self

__all__ = ["Recorder"]


class Recorder(Protocol):
    """Records the ops that run while it is entered (``with recorder: ...``).

    Only the entering and leaving are shared: what a recorder keeps differs with
    what its feature compares (a determinism run's keyed log, behind
    :class:`~pytest_backends.determinism.record.RunLogRecorder`; detached copies
    per op for the batch locator; ops aligned by call site for the kernel-path
    comparison), so each feature reads its own recorder's result. The matrix's
    :class:`~pytest_backends.matrix.op_recorder.ProfilerOpRecorder` is not one:
    it records through ``torch.profiler``, which may refuse to start (another
    profiler runs), so it starts with ``start() -> bool`` and is skipped where
    that fails, rather than raising as entering a recorder does.
    """

    def __enter__(self) -> Self:
        """Start recording."""
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> object:
        """Stop recording."""
        ...
