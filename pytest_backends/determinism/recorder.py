"""Per-op recording of one test run, and the comparison of several runs.

:class:`OpRecorder` is a ``TorchDispatchMode``: every aten (or custom) op the
test calls passes through it, and it records the op's name, a key of its
inputs and the digests of its outputs. Input keys reuse the digest of a
tensor that an earlier op produced as long as the tensor's version counter
has not moved, so in a chain of ops each tensor is digested about once.
Digests stay on the device until :meth:`OpRecorder.finish`, which copies
them to the host with one transfer per device.

:func:`compare_runs` blames an op only when it produced different outputs
from identical inputs; differences that follow from already-different inputs
are not blamed on the op that happens to show them.

Importing this module imports torch: load it only when the harness runs.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends.determinism.api import ALERT_TEXT
from pytest_backends.determinism.census import VERDICTS

__all__ = [
    "Comparison",
    "Divergence",
    "OpCall",
    "OpRecorder",
    "RunLog",
    "compare_runs",
]

# Ops whose output is uninitialised memory: compared by dtype and shape only.
_UNINITIALIZED = frozenset(
    {
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::empty_permuted",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "aten::resize_as_",
    }
)

_STABLE_REPR = (
    bool,
    int,
    str,
    complex,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)

# A slot is an int (index of a pending digest, until resolved) or a tagged tuple.
Slot = Any


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "", 1)


@dataclass
class OpCall:
    """One op call: name (``"aten::index_add_"``), where it ran, and keys of its data.

    ``inputs`` and ``outputs`` hold one key per argument and per output tensor
    (digests after :meth:`OpRecorder.finish`). ``alerted`` is True when the op
    raised or warned that it has no deterministic implementation.
    """

    name: str
    device: str | None
    dtype: str | None
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    alerted: bool = False

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        """``(op, device, dtype)``: the census key."""
        return (self.name, self.device, self.dtype)


@dataclass
class RunLog:
    """The op calls of one run, in order, with host-side keys."""

    calls: list[OpCall] = field(default_factory=list)


class OpRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every op dispatched while the mode is active.

    Use one recorder per run: ``with OpRecorder() as rec: ...`` then
    ``rec.finish()``.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._calls: list[OpCall] = []
        self._pending: list[torch.Tensor] = []
        # id(tensor) -> (weak reference, version counter, slot); the reference guards
        # against a dead tensor's id being reused within the run.
        self._known: dict[int, tuple[weakref.ref[torch.Tensor], int, Slot]] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = func.name().split(".", 1)[0]
        inputs = tuple(self._arg_slot(a) for a in args) + tuple(
            ("kw", k, self._arg_slot(v)) for k, v in sorted(kwargs.items())
        )
        watch = (
            torch.are_deterministic_algorithms_enabled()
            and torch.is_deterministic_algorithms_warn_only_enabled()
        )
        try:
            if watch:
                out, alerted = self._call_watching(func, args, kwargs)
            else:
                out, alerted = func(*args, **kwargs), False
        except RuntimeError as exc:
            device, dtype = _where((), args, kwargs)
            self._calls.append(
                OpCall(
                    name,
                    device,
                    dtype,
                    inputs,
                    (("raised", type(exc).__name__),),
                    ALERT_TEXT in str(exc),
                )
            )
            raise
        tensors = list(_tensors(out))
        device, dtype = _where(tensors, args, kwargs)
        if name in _UNINITIALIZED:
            outputs = tuple(self._uninitialized_slot(t) for t in tensors)
        elif func.is_view and not _written_positions(func):
            # A view's contents follow from its inputs, so its key is derived from
            # theirs instead of digesting (and first copying) the viewed data.
            outputs = tuple(
                self._remember(t, ("view", ("value", name), ("value", str(j)), ("list", *inputs)))
                for j, t in enumerate(tensors)
            )
        else:
            outputs = tuple(self._output_slot(t) for t in tensors)
        if not tensors:
            mutated = [args[i] for i in _written_positions(func) if i < len(args)]
            if mutated:
                # In-place ops that return nothing (``_foreach_add_``): their results
                # are the arguments they wrote to.
                tensors = list(_tensors(mutated))
                device, dtype = _where(tensors, args, kwargs)
                outputs = tuple(self._output_slot(t) for t in tensors)
            elif out is not None:
                outputs = (_value_slot(out),)
        self._calls.append(OpCall(name, device, dtype, inputs, outputs, alerted))
        return out

    @staticmethod
    def _call_watching(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, bool]:
        """Call ``func`` under ``warn_only`` and tell whether it alerted.

        torch buffers the alert warning until the outermost torch call returns
        to Python, so it cannot be caught per op here. Instead the op first runs
        with errors instead of warnings; if it raises the alert, it runs again
        under ``warn_only`` to give the user the warning. Kernels alert before
        they compute (PyTorch's Note [Writing Nondeterministic Operations]), so
        the failed attempt changed nothing.
        """
        torch.use_deterministic_algorithms(True, warn_only=False)
        try:
            return func(*args, **kwargs), False
        except RuntimeError as exc:
            if ALERT_TEXT not in str(exc):
                raise
        finally:
            torch.use_deterministic_algorithms(True, warn_only=True)
        return func(*args, **kwargs), True

    def _digest_slot(self, t: torch.Tensor) -> Slot:
        if t.layout != torch.strided or t.device.type == "meta" or t.is_quantized:
            return ("opaque", _dtype_name(t), tuple(t.shape), str(t.layout), t.device.type)
        from pytest_backends.determinism.digest import digest

        try:
            d = digest(t)
        except (TypeError, RuntimeError, NotImplementedError):
            return ("opaque", _dtype_name(t), tuple(t.shape), type(t).__name__)
        self._pending.append(d)
        return len(self._pending) - 1

    def _remember(self, t: torch.Tensor, slot: Slot) -> Slot:
        # Inference tensors have no version counter: they are digested at every use.
        with contextlib.suppress(RuntimeError, TypeError):
            self._known[id(t)] = (weakref.ref(t), t._version, slot)
        return slot

    def _tensor_slot(self, t: torch.Tensor) -> Slot:
        hit = self._known.get(id(t))
        if hit is not None and hit[0]() is t:
            try:
                if hit[1] == t._version:
                    return hit[2]
            except (RuntimeError, TypeError):
                return self._digest_slot(t)
        self._first_use(t)
        return self._remember(t, self._digest_slot(t))

    def _first_use(self, t: torch.Tensor) -> None:
        """Called for an input no recorded op of this run produced or last wrote."""

    def _output_slot(self, t: torch.Tensor) -> Slot:
        return self._remember(t, self._digest_slot(t))

    def _uninitialized_slot(self, t: torch.Tensor) -> Slot:
        return self._remember(t, ("uninitialized", _dtype_name(t), tuple(t.shape)))

    def _arg_slot(self, a: object) -> Slot:
        if isinstance(a, torch.Tensor):
            return self._tensor_slot(a)
        if isinstance(a, (list, tuple)):
            return ("list", *(self._arg_slot(x) for x in a))
        return _value_slot(a)

    def finish(self) -> RunLog:
        """The run's log, with every digest copied to the host."""
        host = _to_host(self._pending)
        calls = [
            OpCall(
                c.name,
                c.device,
                c.dtype,
                tuple(_resolve(s, host) for s in c.inputs),
                tuple(_resolve(s, host) for s in c.outputs),
                c.alerted,
            )
            for c in self._calls
        ]
        self._calls, self._pending = [], []
        self._known = {}
        return RunLog(calls)


@functools.cache
def _written_positions(func: Any) -> tuple[int, ...]:
    """Positions of the arguments the op's schema marks as written (``Tensor(a!)``)."""
    return tuple(
        i
        for i, arg in enumerate(func._schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )


def _value_slot(a: object) -> Slot:
    if isinstance(a, float):
        return ("float", a.hex())
    if isinstance(a, _STABLE_REPR):
        return ("value", repr(a))
    if isinstance(a, (list, tuple)):
        return ("list", *(_value_slot(x) for x in a))
    return ("object", type(a).__name__)


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _where(
    outputs: Sequence[torch.Tensor], args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[str | None, str | None]:
    for t in outputs:
        return t.device.type, _dtype_name(t)
    for t in _tensors([*args, *kwargs.values()]):
        return t.device.type, _dtype_name(t)
    return None, None


def _to_host(pending: list[torch.Tensor]) -> list[Slot]:
    by_device: dict[torch.device, list[int]] = {}
    for i, d in enumerate(pending):
        by_device.setdefault(d.device, []).append(i)
    host: list[Slot] = [None] * len(pending)
    for indices in by_device.values():
        rows = torch.stack([pending[i].reshape(-1) for i in indices]).cpu().tolist()
        for i, row in zip(indices, rows):
            host[i] = ("digest", *row)
    return host


def _resolve(slot: Slot, host: list[Slot]) -> Slot:
    if isinstance(slot, int):
        return host[slot]
    if isinstance(slot, tuple) and slot and slot[0] in ("list", "kw", "view"):
        return tuple(_resolve(s, host) for s in slot)
    return slot


# --- comparison ---------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """Where a run first differed from run 0.

    ``kind`` is ``"op"`` (the op produced different outputs from identical
    inputs: it is nondeterministic), ``"inputs"`` (the first differing op's
    inputs already differed, so the cause lies outside torch ops) or
    ``"sequence"`` (the runs called different ops).
    """

    kind: str
    run: int
    op_index: int
    op: str
    device: str | None
    dtype: str | None
    output_index: int | None = None
    other_op: str | None = None

    def describe(self, runs: int) -> str:
        """A sentence for a failure message."""
        where = ", ".join(x for x in (self.device, self.dtype) if x)
        where = f" ({where})" if where else ""
        if self.kind == "op":
            return (
                f"nondeterministic op {self.op}{where}: output {self.output_index} differs "
                f"between run 0 and run {self.run} from identical inputs "
                f"(op #{self.op_index} of the run; {runs} runs)"
            )
        if self.kind == "inputs":
            return (
                f"run {self.run} first differs from run 0 at op {self.op}{where} "
                f"(op #{self.op_index}, output {self.output_index}), but that op's inputs "
                "already differed: the difference comes from outside torch ops, e.g. state "
                "carried over between runs (function-scoped fixture values are shared by all "
                "runs; a test that mutates them, or a module or global, is not repeatable) "
                "or randomness not drawn from torch, random or numpy"
            )
        return (
            f"run {self.run} called a different op sequence than run 0 from op "
            f"#{self.op_index} on (run 0: {self.op}, run {self.run}: {self.other_op}) "
            "with no op output differing before: control flow depends on something "
            "outside torch ops"
        )


@dataclass
class Comparison:
    """The outcome of :func:`compare_runs`.

    ``blamed`` lists the ops that produced different outputs from identical
    inputs, earliest first, one entry per op position. ``unexplained`` is the
    earliest divergence that is not preceded by a blamed op in its run.
    ``verdicts`` maps ``(op, device, dtype)`` to this test's verdict.
    """

    runs: int
    blamed: list[Divergence]
    unexplained: Divergence | None
    verdicts: dict[tuple[str, str | None, str | None], str]

    @property
    def reproducible(self) -> bool:
        """True when every run matched run 0."""
        return not self.blamed and self.unexplained is None


def _first_difference(a: tuple[Slot, ...], b: tuple[Slot, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_runs(logs: Sequence[RunLog]) -> Comparison:
    """Compare every run with run 0, op by op."""
    ref = logs[0].calls
    status: dict[int, str] = {}  # op index in run 0 -> "nondeterministic"/"deterministic"
    blamed: dict[int, Divergence] = {}
    unexplained: Divergence | None = None
    for r in range(1, len(logs)):
        calls = logs[r].calls
        first_blamed = False
        first_diff_seen = False
        for i in range(max(len(ref), len(calls))):
            if i >= len(ref) or i >= len(calls) or calls[i].name != ref[i].name:
                if not first_diff_seen:
                    a = ref[i] if i < len(ref) else None
                    b = calls[i] if i < len(calls) else None
                    base = a or b
                    assert base is not None
                    d = Divergence(
                        "sequence",
                        r,
                        i,
                        a.name if a else "(end of run)",
                        base.device,
                        base.dtype,
                        None,
                        b.name if b else "(end of run)",
                    )
                    if unexplained is None or (i, r) < (unexplained.op_index, unexplained.run):
                        unexplained = d
                break
            a, b = ref[i], calls[i]
            same_inputs = a.inputs == b.inputs
            out_diff = _first_difference(a.outputs, b.outputs)
            if out_diff is None:
                if same_inputs:
                    status.setdefault(i, "deterministic")
                continue
            if same_inputs:
                status[i] = "nondeterministic"
                if i not in blamed:
                    blamed[i] = Divergence("op", r, i, a.name, a.device, a.dtype, out_diff)
                if not first_diff_seen:
                    first_blamed = True
            elif not first_diff_seen:
                d = Divergence("inputs", r, i, a.name, a.device, a.dtype, out_diff)
                if unexplained is None or (i, r) < (unexplained.op_index, unexplained.run):
                    unexplained = d
            first_diff_seen = True
            if not first_blamed:
                break
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    for log in logs:
        for call in log.calls:
            if call.alerted:
                _merge(verdicts, call.key, "raises_under_deterministic_mode")
    for i, call in enumerate(ref):
        _merge(verdicts, call.key, status.get(i, "inconclusive"))
    return Comparison(len(logs), [blamed[i] for i in sorted(blamed)], unexplained, verdicts)


def _merge(
    verdicts: dict[tuple[str, str | None, str | None], str],
    key: tuple[str, str | None, str | None],
    verdict: str,
) -> None:
    old = verdicts.get(key)
    if old is None or VERDICTS.index(verdict) < VERDICTS.index(old):
        verdicts[key] = verdict
