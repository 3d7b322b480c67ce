"""oneDNN's primitive log, captured at the file-descriptor level.

:class:`PrimitiveLog` captures the lines oneDNN prints while
``torch.backends.mkldnn.verbose`` is on; :func:`observe` captures them around
a block of a test; :func:`computed_precision` answers "in which precision did
the kernels of this op family compute so far" for the tolerance model.
Nothing here imports torch at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

from pytest_backends.kernels.attribution import computes_shape
from pytest_backends.kernels.primitives import Primitive, parse_primitives


def _fflush_c_stdout() -> None:
    """Flush the C library's stdout buffer (oneDNN prints with printf)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


def _mkldnn_available() -> bool:
    import torch

    return bool(torch._C._has_mkldnn)


def _set_verbose(level: int) -> bool:
    import torch

    setter = getattr(getattr(torch._C, "_verbose", None), "mkldnn_set_verbose", None)
    if setter is None or not _mkldnn_available():
        return False
    return bool(setter(level))


def _user_verbose_level() -> int:
    """The level ``ONEDNN_VERBOSE``/``DNNL_VERBOSE`` asked for (0 when unset)."""
    for name in ("ONEDNN_VERBOSE", "DNNL_VERBOSE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
        if value:
            return 1
    return 0


@dataclass
class PrimitiveLog:
    """Captures oneDNN's primitive log (fd 1) between :meth:`start` and :meth:`stop`.

    :meth:`start` points file descriptor 1 at a temporary file and turns the
    log on; :meth:`stop` turns it off, points fd 1 back at what it was
    (pytest's capture file, or the terminal) and passes on every line that
    was not oneDNN's (lines of oneDNN too when the user asked for them with
    ``ONEDNN_VERBOSE``).  :meth:`primitives` reads what was logged so far,
    also while capturing.
    """

    error: str | None = None
    _file: IO[bytes] | None = field(default=None, repr=False)
    _saved_fd: int | None = field(default=None, repr=False)
    _token: contextvars.Token[PrimitiveLog | None] | None = field(default=None, repr=False)
    _text: str | None = field(default=None, repr=False)

    def start(self) -> bool:
        """Start capturing; ``False`` (with :attr:`error`) where it cannot."""
        try:
            if not _mkldnn_available():
                self.error = "torch was built without oneDNN"
                return False
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            _fflush_c_stdout()
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
            self._saved_fd = os.dup(1)
            os.dup2(self._file.fileno(), 1)
        except (OSError, ValueError) as exc:
            self._close()
            self.error = f"file descriptor 1 could not be redirected: {exc}"
            return False
        if not _set_verbose(1):
            self.stop()
            self.error = "oneDNN refused to turn its primitive log on"
            return False
        self._token = _ACTIVE.set(self)
        return True

    def _read(self) -> str:
        if self._text is not None:
            return self._text
        if self._file is None:
            return ""
        _fflush_c_stdout()
        size = os.fstat(self._file.fileno()).st_size
        return os.pread(self._file.fileno(), size, 0).decode("utf-8", "replace")

    def text(self) -> str:
        """Everything oneDNN logged so far (all of it once stopped), info lines included."""
        return self._read()

    def primitives(self) -> list[Primitive]:
        """The primitives executed so far."""
        return parse_primitives(self._read().splitlines())

    def stop(self) -> list[Primitive]:
        """Stop capturing, restore fd 1, pass other output on; return the primitives."""
        if self._token is not None:
            with contextlib.suppress(ValueError):
                _ACTIVE.reset(self._token)
            self._token = None
        if self._file is None:
            return parse_primitives((self._text or "").splitlines())
        _set_verbose(_user_verbose_level())
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        text = self._read()
        self._text = text
        self._close()
        keep_onednn = _user_verbose_level() > 0
        passed = [
            line
            for line in text.splitlines(keepends=True)
            if keep_onednn or not line.startswith(("onednn_verbose,", "dnnl_verbose,"))
        ]
        if passed:
            with contextlib.suppress(OSError):
                os.write(1, "".join(passed).encode())
        return parse_primitives(text.splitlines())

    def _close(self) -> None:
        if self._saved_fd is not None:
            _fflush_c_stdout()
            os.dup2(self._saved_fd, 1)
            os.close(self._saved_fd)
            self._saved_fd = None
        if self._file is not None:
            self._file.close()
            self._file = None


_ACTIVE: contextvars.ContextVar[PrimitiveLog | None] = contextvars.ContextVar(
    "pytest_backends_primitive_log", default=None
)


def active_log() -> PrimitiveLog | None:
    """The primitive log being captured now, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def observe() -> Iterator[PrimitiveLog]:
    """Capture oneDNN's primitive log around a block (tolerances then follow it).

    ::

        with pytest_backends.kernels.observe() as log:
            out = a @ b
            assert_close(out, reference(torch.matmul, a, b), op="matmul", k=1024)
        print([p.describe() for p in log.primitives()])

    Does nothing but yield an empty log where oneDNN is missing or fd 1
    cannot be redirected (``log.error`` says why).
    """
    log = PrimitiveLog()
    started = log.start()
    try:
        yield log
    finally:
        if started:
            log.stop()


#: The profiler scope internal probes run in; kernel-path verification ignores it.
PROBE_SCOPE = "pytest_backends::tolerance_probe"


@contextlib.contextmanager
def paused_log() -> Iterator[None]:
    """Keep oneDNN's primitives out of the active log for the block (internal probes)."""
    if active_log() is None:
        yield
        return
    _set_verbose(0)
    try:
        yield
    finally:
        _set_verbose(1)


def computed_precision(
    family: str, fpmath: str, result: Sequence[int] | None = None, k: int | None = None
) -> tuple[str, Primitive] | None:
    """How the f32 kernels of ``family`` with ``attr-fpmath:<fpmath>`` computed so far.

    Reads the active log (``None`` when nothing is captured or no such
    primitive ran yet).  Returns ``(precision, primitive)`` where the
    primitive is one that computed in the reduced precision if any did,
    else the last one seen.  With ``result`` (the shape of the op's result)
    and ``k`` (its reduction length), only primitives that computed a result
    of that shape count (:func:`computes_shape`): oneDNN picks the kernel
    per shape, so another shape's primitive says nothing about this one.
    """
    log = active_log()
    if log is None:
        return None
    seen = [
        p
        for p in log.primitives()
        if p.family == family
        and p.fpmath == fpmath
        and "f32" in p.input_dtypes()
        and (result is None or computes_shape(p, result, k))
    ]
    if not seen:
        return None
    reduced = [p for p in seen if p.precision != "f32"]
    chosen = reduced[0] if reduced else seen[-1]
    return chosen.precision, chosen
