"""Stage 1 of the determinism pipeline, the record: what one run of a test leaves behind.

Both recorders (the Python :class:`~pytest_backends.determinism.record_python.PythonRecorder`
and the C++ one behind :class:`~pytest_backends.determinism.record_native.NativeRecorder`,
each a :class:`RunLogRecorder`) turn a run into
the same :class:`RunLog`: per op call, its name, where it ran and a key per input and per
output. Keys are :class:`Digest` objects (a tensor's contents), tagged tuples
(``("uninitialized", dtype, shape)``, ``("opaque", ...)``, ``("generator", ...)``, ...)
or plain values. :class:`RunRecord` adds what the harness needs besides the log: the
tensors that entered the record from outside, and whether the run compiled. The next
stage, :mod:`~pytest_backends.determinism.compare`, reads only these types.

What the recorders write while recording lives here too, so that stage 1 imports
no later stage: where an op was called (:func:`caller_suffix`, :func:`caller_place`;
:mod:`~pytest_backends.determinism.locate` finds the same frames), why some ops
went unseen (:func:`unseen_reason`) and a failure in one line (:func:`failure_text`).

Nothing here imports torch (the frame helpers read its path when first called).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_backends.determinism.op_tables import SlotTag
from pytest_backends.recorder import Recorder

__all__ = [
    "UNPROVEN_TAGS",
    "Digest",
    "OpCall",
    "RunLog",
    "RunLogRecorder",
    "RunRecord",
    "Slot",
    "caller_place",
    "caller_suffix",
    "dtype_name",
    "failure_text",
    "unseen_reason",
    "user_frame",
]

#: Key tags of inputs that cannot be proven equal between runs: an op whose
#: inputs hold one is never blamed (see :func:`~pytest_backends.determinism.compare.compare_runs`).
UNPROVEN_TAGS = frozenset({SlotTag.OPAQUE, "object"})

#: A key: a Digest, a tagged tuple, a plain value, or a tuple of keys.
Slot = Any

_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``"float32"`` for ``torch.float32`` (cached: this runs for every recorded op)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "", 1)
    return name


class Digest:
    """The digest of one tensor: on the device while recording, host values after ``finish``.

    One object per digested tensor, shared by every op that uses the tensor;
    keys compare equal when their host values are equal.
    """

    __slots__ = ("external", "extra", "storage", "value")

    def __init__(self, external: bool = False, extra: tuple[Any, ...] = ()) -> None:
        # Host values; ``("empty", dtype, shape)`` for a tensor without elements.
        self.value: tuple[Any, ...] | None = None
        self.external = external
        self.storage = 0
        # Shape and strides of an overlapping view, digested by the memory it covers.
        self.extra = extra

    def __eq__(self, other: object) -> bool:
        return type(other) is Digest and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Digest{self.value!r}"


@dataclass
class OpCall:
    """One op call: name (``"aten::index_add_"``), where it ran, and keys of its data.

    ``inputs`` and ``outputs`` hold one key per argument and per output tensor.
    ``alerted`` is True when the op raised or warned that it has no
    deterministic implementation. ``tainted`` names the op that created
    uninitialised memory this op read (``"aten::empty (test_x.py:12)"``).
    """

    name: str
    device: str | None
    dtype: str | None
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    alerted: bool = False
    tainted: str | None = None

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        """``(op, device, dtype)``: the census key."""
        return (self.name, self.device, self.dtype)


@dataclass
class RunLog:
    """The op calls of one run, in order, with host-side keys.

    A native record arrives summarised: ``fingerprint`` (equal for two runs
    exactly when their calls compare equal), ``keys`` (its census keys, each
    with whether an op under it alerted) and ``load``, which fills ``calls``
    when a comparison needs them (see :meth:`loaded`).
    """

    calls: list[OpCall] = field(default_factory=list)
    fingerprint: int | None = None
    keys: list[tuple[str, str | None, str | None, bool]] | None = None
    load: Callable[[], list[OpCall]] | None = None

    def loaded(self) -> RunLog:
        """This log with ``calls`` filled in (a no-op unless the record was summarised)."""
        if self.load is not None:
            self.calls = self.load()
            self.load = None
        return self


@dataclass
class RunRecord:
    """One run: its log, the tensors that entered it, and whether it compiled.

    ``first_uses`` holds ``(op index, tensor)`` pairs, the tensor as a weak
    reference (Python recorder) or as an identity that the native recorder
    keeps from being reused (``keep`` holds that recorder).
    """

    log: RunLog
    first_uses: Sequence[tuple[int, Any]] = field(default_factory=list)
    compiled: bool = False
    keep: Any = None
    #: Why some of the run's ops ran where the recorder cannot see, or None.
    blind: str | None = None
    #: Indices of the ops that read memory shared with something outside torch (NumPy).
    outside: frozenset[int] = frozenset()
    #: Op index -> ``"test_x.py:6"``: where the ops in ``outside`` were called (where known).
    outside_places: dict[int, str] = field(default_factory=dict)
    #: Names of the other threads alive when the run began or ended.
    threads: tuple[str, ...] = ()

    def entered_at(self, index: int) -> set[int]:
        """Identities of the live tensors that entered the record at op ``index``."""
        found = set()
        for i, ref in self.first_uses:
            if i == index:
                if type(ref) is int:
                    found.add(ref)
                    continue
                t = ref()
                if t is not None:
                    found.add(id(t))
        return found


class RunLogRecorder(Recorder, Protocol):
    """A recorder of one determinism run: entered for the run, then :meth:`finish` gives its log.

    :class:`~pytest_backends.determinism.record_python.PythonRecorder` and
    :class:`~pytest_backends.determinism.record_native.NativeRecorder` implement
    it; :class:`~pytest_backends.determinism.runs.Runs` reads only this.
    """

    @property
    def failure(self) -> str | None:
        """The recorder's own exception (one line), after which it stopped recording."""
        ...

    @property
    def first_uses(self) -> Sequence[tuple[int, Any]]:
        """``(op index, tensor)`` of every tensor that entered the record (:class:`RunRecord`)."""
        ...

    @property
    def blind(self) -> str | None:
        """Why ops of this run ran where the recorder cannot see (None: nowhere)."""
        ...

    @property
    def outside(self) -> Sequence[int]:
        """Indices of the ops that read memory shared with something outside torch."""
        ...

    @property
    def outside_places(self) -> Mapping[int, str]:
        """Op index -> ``"test_x.py:6"``: where the ops in :attr:`outside` were called."""
        ...

    def finish(self, raised: BaseException | None = None) -> RunLog:
        """The run's log (``raised``: the run's exception, if any)."""
        ...

    def keep(self) -> Any:
        """What keeps the identities in ``first_uses`` from being reused (or None)."""
        ...


def failure_text(exc: BaseException) -> str:
    """``"RuntimeError: first line"``: a harness failure in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def unseen_reason(type_name: str) -> str:
    """The "not checked" reason for ops on a ``__torch_dispatch__`` tensor subclass."""
    return (
        f"ops on {type_name} tensors (a tensor subclass with __torch_dispatch__, such as a "
        "wrapper subclass or a jagged NestedTensor) run inside its __torch_dispatch__, where "
        "no op recorder sees them, so a nondeterministic op there would go unnoticed"
    )


_skipped_dirs: tuple[str, ...] = ()


def _skipped() -> tuple[str, ...]:
    """The directories of torch and of this plugin (computed once, when first needed)."""
    global _skipped_dirs
    if not _skipped_dirs:
        import torch

        _skipped_dirs = (
            str(Path(torch.__file__).resolve().parent),
            str(Path(__file__).resolve().parent.parent),
        )
    return _skipped_dirs


def user_frame(frame: Any) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame outside torch and this plugin."""
    skipped = _skipped_dirs or _skipped()
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skipped) and not filename.startswith("<"):
            return filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def caller_suffix() -> str:
    """``" (test_x.py:12)"``: where the innermost frame outside torch and this plugin is."""
    location = user_frame(sys._getframe(1))
    return "" if location is None else f" ({Path(location[0]).name}:{location[1]})"


def caller_place() -> str:
    """``"test_x.py:12"``: :func:`caller_suffix` without its parentheses ("" when unknown)."""
    location = user_frame(sys._getframe(1))
    return "" if location is None else f"{Path(location[0]).name}:{location[1]}"
