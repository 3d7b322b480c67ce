"""Per-op recording of one test run, and the comparison of several runs.

:class:`OpRecorder` is a ``TorchDispatchMode``: every aten (or custom) op the
test calls passes through it, and it records the op, a key of its inputs and
the digests of its outputs. The per-op path is kept short because it runs
for every op of a suite:

* A tensor's key is computed once: an op's output is digested when the op
  returns, and later uses reuse that key as long as the tensor's version
  counter has not moved. Outputs of pure view ops (``view``, ``t``,
  ``select``, ...) are keyed by the view op and its inputs' keys, never
  digested.
* Tensors that come from outside the run (parameters, fixture values) are
  digested on their first use, in every run: a key is never carried from one
  run to the next, so a storage swapped between runs
  (``layer.weight.data = other``), a write that bypasses the version counter
  (``p.data.add_()``) or memory written outside torch ops is seen by content.
  Overlapping views (``expand``) are digested by the memory they cover, and a
  view whose storage is too small for it (freed with ``resize_(0)``) is not
  read at all: it is "opaque", an input that cannot be proven equal.
* Generators passed to ops are keyed by their state at call time; storages
  and other Python objects cannot be proven equal. ``set_`` points a tensor at
  other memory, which is keyed where an op first reads it.
* Digests stay on the device until :meth:`OpRecorder.finish`, which copies
  them to the host with one transfer per device.

Some outputs are not results and are compared by dtype and shape only:
uninitialised memory (``empty``, ``new_empty``, ...) and the workspace or
reserve buffers of fused kernels (oneDNN and cuDNN RNNs, the fused LSTM/GRU
cells, the debug mask of fused attention). Reading uninitialised memory is
tracked: an op whose differing output comes from reading such memory
(directly, through a view, or after a partial in-place write) is reported as
an uninitialised read, never as a nondeterministic kernel.

:func:`compare_runs` blames an op only when it produced different outputs
from identical inputs; differences that follow from already-different inputs
are not blamed on the op that happens to show them. :func:`locate` re-runs a
failing test once with source locations (file, line, function, module path;
for backward ops the forward op they came from), so locations cost nothing
while a test passes.

Importing this module imports torch: load it only when the harness runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends import _tree
from pytest_backends.determinism import op_tables
from pytest_backends.determinism.api import ALERT_TEXT
from pytest_backends.determinism.census import VERDICTS

__all__ = [
    "Comparison",
    "Digest",
    "Divergence",
    "Location",
    "OpCall",
    "OpRecorder",
    "RunLog",
    "compare_runs",
    "locate",
    "merge_verdict",
]

_UNINITIALIZED = op_tables.UNINITIALIZED
_WORKSPACES = op_tables.WORKSPACES
_OVERWRITES = op_tables.OVERWRITES
_REBINDS = op_tables.REBINDS

#: Key tags of inputs that cannot be proven equal between runs: an op whose
#: inputs hold one is never blamed (see :func:`compare_runs`).
UNPROVEN_TAGS = frozenset({"opaque", "object"})

_PLAIN = frozenset(
    {
        bool,
        int,
        str,
        complex,
        type(None),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)

# A key: a Digest, a tagged tuple, a plain value, or a tuple of keys.
Slot = Any


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


@dataclass(frozen=True)
class Location:
    """Where an op was called from: the innermost frame outside torch and this plugin.

    ``module`` is the ``nn.Module`` path (``"layers.0.self_attn"``) and
    ``module_type`` its class name, when the op ran inside a module's
    ``forward``. For a backward op, ``forward`` is the location of the forward
    op it differentiates and ``forward_op`` that op's name.
    """

    file: str
    line: int
    function: str
    module: str | None = None
    module_type: str | None = None
    forward_op: str | None = None
    forward: Location | None = None

    def describe(self) -> str:
        """``"test_x.py:12 in test_fn, module layers.0 (Linear)"``."""
        text = f"{self.file}:{self.line} in {self.function}"
        if self.module:
            text += f", module {self.module} ({self.module_type})"
        elif self.module is not None:
            text += f", module {self.module_type} (outermost)"
        if self.forward is not None:
            text += f"; backward of {self.forward_op} called at {self.forward.describe()}"
        return text


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


@dataclass(frozen=True)
class _OpInfo:
    op: Any
    call: Callable[..., Any]
    name: str
    written: tuple[int, ...]
    pure_view: bool
    uninitialized: bool
    workspaces: frozenset[int]
    overwrites: bool
    out_positions: tuple[int, ...]
    out_names: frozenset[str]
    #: ``set_``: the tensor now shows other memory; its contents are keyed where first read.
    rebinds: bool = False


# Keyed by id: ``OpOverload.__hash__`` is a Python method, too slow for every op. The
# entry holds the op, so its id is never reused while the entry exists.
_INFO: dict[int, _OpInfo] = {}


def _op_info(func: Any) -> _OpInfo:
    info = _INFO.get(id(func))
    if info is not None:
        return info
    name = func.name().split(".", 1)[0]
    schema = func._schema
    written = tuple(
        i
        for i, arg in enumerate(schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )
    outs = [
        (i, arg.name)
        for i, arg in enumerate(schema.arguments)
        if getattr(arg, "is_out", False) or (arg.kwarg_only and i in written)
    ]
    info = _OpInfo(
        func,
        # ``OpOverload.__call__`` is a Python frame around this callable.
        getattr(func, "_op", func),
        name,
        written,
        bool(func.is_view) and not written,
        name in _UNINITIALIZED,
        _WORKSPACES.get(name, frozenset()),
        name in _OVERWRITES,
        tuple(i for i, _ in outs),
        frozenset(n for _, n in outs),
        name in _REBINDS,
    )
    _INFO[id(func)] = info
    return info


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "", 1)
    return name


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


_Tensor = torch.Tensor


class OpRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every op dispatched while the mode is active.

    Use one recorder per run: ``with OpRecorder() as rec: ...`` then
    ``rec.finish()``. ``previous`` (the previous run's recorder) is accepted
    for compatibility; no key is carried from it.
    """

    def __init__(self, previous: OpRecorder | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # Per call: (info, inputs, outputs, (device type, dtype) or None, alerted, tainted)
        self._calls: list[tuple[Any, ...]] = []
        self._pending: list[torch.Tensor] = []
        self._pending_keys: list[Digest] = []
        # id(tensor) -> (weak reference, version counter, key); the reference guards
        # against a dead tensor's id being reused within the run.
        self._known: dict[int, tuple[Any, int, Slot]] = {}
        # Keys are never carried from the previous run: an outside tensor is keyed by
        # its contents at its first use in every run, so a storage swapped between runs
        # (``layer.weight.data = other``) or memory written outside torch ops is seen.
        #: Why ops of this run ran where the recorder cannot see (None: nowhere).
        self.blind: str | None = None
        # Storage pointer -> (weak reference to a tensor keeping it alive, origin).
        self._tainted: dict[int, tuple[Any, str]] = {}
        self._finished = False
        self._digest_fn = _digest_function()
        self._prune_at = 4096

    # --- the per-op path --------------------------------------------------------

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self._record(func, args, {} if kwargs is None else kwargs)

    def _call(self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Run the op (subclasses tell the op's own exceptions from the recorder's here)."""
        return info.call(*args, **kwargs)

    def _record(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        # Not ``__torch_dispatch__`` itself: torch wraps that in a Dynamo-disabling frame,
        # which a subclass calling ``super().__torch_dispatch__`` would pay twice per op.
        info = _INFO.get(id(func)) or _op_info(func)
        key = self._key
        tainted = None
        # The origin of uninitialised memory that an overwrite copies on (circular padding
        # copies slices of a partly written buffer into the buffer).
        passes: str | None = None
        if info.overwrites or (self._tainted and info.pure_view):
            # Views and overwrites do not read the data they write: a partly written buffer
            # (``out[i] = row`` in a loop) is keyed by shape until an op reads it.
            inputs, passes = self._unread_keys(info, args)
            tainted = passes
        else:
            # ``_key`` inlined for its two common cases: a tensor whose key is known
            # and a plain value.
            keys: list[Slot] = []
            known = self._known
            for a in args:
                cls = type(a)
                if cls is _Tensor:
                    hit = known.get(id(a))
                    # A known entry means ``_version`` worked for this very tensor.
                    if hit is not None and hit[0]() is a and hit[1] == a._version:
                        keys.append(hit[2])
                    else:
                        keys.append(self._input(a))
                    continue
                elif cls in _PLAIN:
                    keys.append(a)
                    continue
                elif cls is list:  # sizes, strides, padding: ints are their own keys
                    keys.append(tuple([x if type(x) is int else key(x) for x in a]))
                    continue
                keys.append(key(a))
            inputs = tuple(keys)
            if self._tainted:
                tainted = self._reads_tainted(info, args, kwargs)
        if kwargs:
            inputs += tuple([(k, key(v)) for k, v in sorted(kwargs.items())])
        try:
            if torch.are_deterministic_algorithms_enabled() and (
                torch.is_deterministic_algorithms_warn_only_enabled()
            ):
                out, alerted = self._call_watching(info, args, kwargs)
            else:
                out = self._call(info, args, kwargs)
                alerted = False
        except RuntimeError as exc:
            ref = next(_tensors([*args, *kwargs.values()]), None)
            where = (ref.device.type, ref.dtype) if ref is not None else None
            raised = (("raised", type(exc).__name__),)
            self._calls.append((info, inputs, raised, where, ALERT_TEXT in str(exc), None))
            raise
        if type(out) is _Tensor and not (
            info.uninitialized or info.pure_view or info.workspaces or info.rebinds or passes
        ):
            # The common case: one plain tensor out.
            key_out = self._output(out)
            self._calls.append(
                (
                    info,
                    inputs,
                    (key_out,),
                    ("cpu" if out.is_cpu else out.device.type, out.dtype),
                    alerted,
                    tainted,
                )
            )
            if info.overwrites and self._tainted:
                self._clear_taint(info, args, kwargs)
            return out
        if isinstance(out, torch.Tensor):
            tensors: list[torch.Tensor] = [out]
        elif isinstance(out, (list, tuple)):
            tensors = list(_tensors(out))
        else:
            tensors = []
        if info.uninitialized:
            outputs = tuple([self._uninitialized(t, info.name) for t in tensors])
        elif passes is not None:
            # The written part holds bytes no op wrote: compared not at all.
            outputs = tuple([self._pass_taint(t, passes) for t in tensors])
        elif info.rebinds:
            outputs = tuple([self._rebound(t) for t in tensors])
        elif info.pure_view:
            # A view's contents follow from its inputs, so its key is derived from
            # theirs instead of digesting (and first copying) the viewed data.
            outputs = tuple(
                [self._remember(t, ("view", info.name, j, inputs)) for j, t in enumerate(tensors)]
            )
        elif info.workspaces:
            outputs = tuple(
                [
                    self._remember(t, ("workspace", _dtype_name(t.dtype), tuple(t.shape)))
                    if j in info.workspaces
                    else self._output(t)
                    for j, t in enumerate(tensors)
                ]
            )
        else:
            outputs = tuple([self._output(t) for t in tensors])
        if not tensors:
            mutated = [args[i] for i in info.written if i < len(args)]
            if mutated:
                # In-place ops that return nothing (``_foreach_add_``): their results
                # are the arguments they wrote to.
                tensors = list(_tensors(mutated))
                outputs = tuple([self._output(t) for t in tensors])
            elif out is not None:
                outputs = (_value_key(out),)
        if info.overwrites and self._tainted and passes is None:
            self._clear_taint(info, args, kwargs)
        # Only the device and dtype: holding the tensor would keep it alive (and make
        # torch wrap the returned tensor anew with an extra ``detach``).
        ref = tensors[0] if tensors else next(_tensors([*args, *kwargs.values()]), None)
        # ``is_cpu`` is far cheaper than building ``ref.device``.
        where = None if ref is None else ("cpu" if ref.is_cpu else ref.device.type, ref.dtype)
        self._calls.append((info, inputs, outputs, where, alerted, tainted))
        return out

    def _key(self, a: object) -> Slot:
        if isinstance(a, torch.Tensor):
            if type(a) is not _Tensor and self._unseen(a):
                return _opaque(a)
            hit = self._known.get(id(a))
            if hit is not None and hit[0]() is a:
                try:
                    if hit[1] == a._version:
                        return hit[2]
                except (RuntimeError, TypeError):
                    return self._digest(a, external=True)
            return self._input(a)
        cls = type(a)
        if cls in _PLAIN:
            return a
        if cls is float:
            return a.hex()  # type: ignore[attr-defined]
        if isinstance(a, torch.Generator):
            return self._generator_key(a)
        if cls is list or cls is tuple:
            # Sizes and strides: ints are their own keys.
            return tuple([x if type(x) is int else self._key(x) for x in a])  # type: ignore[attr-defined]
        if isinstance(a, (list, tuple)):
            return tuple([self._key(x) for x in a])
        return _value_key(a)

    def _unread_keys(
        self, info: _OpInfo, args: Sequence[Any]
    ) -> tuple[tuple[Slot, ...], str | None]:
        """Keys of a view's or an overwrite's inputs, and the taint an overwrite copies on.

        The tensors an overwrite writes are not read: they are keyed by shape. A
        source on uninitialised memory is keyed by shape too, and its taint passes
        to what the overwrite writes.
        """
        keys: list[Slot] = []
        passes = None
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                written = info.overwrites and i in info.written
                origin = self._taint_of(a) if self._tainted else None
                if origin is not None:
                    if not written and info.overwrites and passes is None:
                        passes = origin
                    keys.append(("uninitialized", _dtype_name(a.dtype), tuple(a.shape)))
                    continue
                if written:
                    keys.append(("unread", _dtype_name(a.dtype), tuple(a.shape)))
                    continue
            keys.append(self._key(a))
        return tuple(keys), passes

    def _pass_taint(self, t: torch.Tensor, origin: str) -> Slot:
        """Key an overwrite's output that holds bytes copied from uninitialised memory."""
        ptr = _storage_ptr(t)
        if ptr:
            entry = self._tainted.get(ptr)
            if entry is None or entry[0]() is None:
                self._tainted[ptr] = (weakref.ref(t), origin)
        return self._remember(t, ("uninitialized", _dtype_name(t.dtype), tuple(t.shape)))

    def _rebound(self, t: torch.Tensor) -> Slot:
        """Key ``set_``'s output by shape: its new memory is keyed where an op first reads it."""
        self._known.pop(id(t), None)
        return ("rebound", _dtype_name(t.dtype), tuple(t.shape))

    def _unseen(self, t: torch.Tensor) -> bool:
        """Whether ops on ``t`` run inside a ``__torch_dispatch__`` that no recorder sees."""
        cls = type(t)
        python = _PYTHON_DISPATCH.get(cls)
        if python is None:
            try:
                python = bool(torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python))
            except (RuntimeError, TypeError, AttributeError):
                python = False
            # The tracers' own tensors (FakeTensor, FunctionalTensor) carry no test data:
            # their ops are the compiler's, as for the native recorder.
            python = python and not cls.__module__.startswith(_TRACER_MODULES)
            _PYTHON_DISPATCH[cls] = python
        if python and self.blind is None:
            self.blind = unseen_reason(cls.__name__)
        return python

    def _generator_key(self, gen: torch.Generator) -> Slot:
        """A generator is keyed by its state at call time: equal states draw equal numbers."""
        try:
            state = gen.get_state()
        except (RuntimeError, TypeError, NotImplementedError):
            return ("object", "Generator")
        return ("generator", gen.device.type, self._digest(state))

    def _input(self, t: torch.Tensor) -> Slot:
        """The key of a tensor no op of this run produced (or that changed since)."""
        self._first_use(t)
        return self._remember(t, self._digest(t, external=True))

    def _output(self, t: torch.Tensor) -> Slot:
        # ``_remember(t, _digest(t))`` inlined for the common case: this runs for
        # nearly every output of every op.
        if t.is_meta or type(t) is not _Tensor or not t.is_contiguous():
            return self._remember(t, self._digest(t))
        key = Digest()
        if t.numel():
            try:
                d = self._digest_fn(t)
            except (NotImplementedError, TypeError, RuntimeError):
                return self._remember(t, self._digest(t))
            self._pending.append(d)
            self._pending_keys.append(key)
        else:
            # Nothing to read: the dtype and shape are the whole digest.
            key.value = ("empty", _dtype_name(t.dtype), tuple(t.shape))
        return self._remember(t, key)

    def _digest(self, t: torch.Tensor, external: bool = False) -> Slot:
        if t.is_meta:
            return ("opaque", _dtype_name(t.dtype), tuple(t.shape), "meta")
        if type(t) is not _Tensor and self._unseen(t):
            return _opaque(t)
        covered = covered_memory(t)
        if covered is None:
            return ("opaque", _dtype_name(t.dtype), tuple(t.shape), "unreadable")
        view, extra = covered
        try:
            d = self._digest_fn(view)
        except NotImplementedError:  # a device without a native kernel: same values
            try:
                d = _digest_module().digest(view, backend="python")
            except (TypeError, RuntimeError, NotImplementedError):
                return _opaque(t)
        except (TypeError, RuntimeError):  # sparse, quantized, ...: not digestible
            return _opaque(t)
        key = Digest(external, extra)
        if external:
            key.storage = _storage_ptr(t)
        self._pending.append(d)
        self._pending_keys.append(key)
        return key

    def _remember(self, t: torch.Tensor, key: Slot) -> Slot:
        # Inference tensors have no version counter: they are digested at every use.
        # (A plain try: contextlib.suppress costs a microsecond on this per-op path.)
        known = self._known
        try:  # noqa: SIM105
            known[id(t)] = (weakref.ref(t), t._version, key)
        except (RuntimeError, TypeError):
            pass
        if len(known) > self._prune_at:
            self._prune()
        return key

    def _prune(self) -> None:
        # Entries of dead tensors only cost memory and GC time: drop them now and then.
        self._known = {k: v for k, v in self._known.items() if v[0]() is not None}
        self._prune_at = max(2 * len(self._known), 4096)

    def _uninitialized(self, t: torch.Tensor, name: str) -> Slot:
        if t.numel():
            origin = name + caller_suffix()
            ptr = _storage_ptr(t)
            if ptr:
                self._tainted[ptr] = (weakref.ref(t), origin)
        return self._remember(t, ("uninitialized", _dtype_name(t.dtype), tuple(t.shape)))

    def _read_tensors(
        self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Iterator[torch.Tensor]:
        skip = set(info.out_positions)
        if info.overwrites:
            skip.update(info.written)
        for i, a in enumerate(args):
            if i not in skip:
                yield from _tensors(a)
        for name, v in kwargs.items():
            if name not in info.out_names:
                yield from _tensors(v)

    def _reads_tainted(
        self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> str | None:
        for t in self._read_tensors(info, args, kwargs):
            origin = self._taint_of(t)
            if origin is not None:
                return origin
        return None

    def _taint_of(self, t: torch.Tensor) -> str | None:
        """The origin of the uninitialised memory ``t`` is on, if any.

        An entry counts only while the tensor that created it is alive: after
        that, its address may belong to a new storage.
        """
        if not t.numel():
            return None
        ptr = _storage_ptr(t)
        entry = self._tainted.get(ptr)
        if entry is None:
            return None
        if entry[0]() is None:
            del self._tainted[ptr]
            return None
        return entry[1]

    def _clear_taint(self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """A write that covers a whole storage makes its memory initialised."""
        written = [args[i] for i in info.written if i < len(args)]
        for t in _tensors(written):
            try:
                storage = t.untyped_storage()
                whole = t.is_contiguous() and t.numel() * t.element_size() == storage.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
            if whole:
                self._tainted.pop(int(storage.data_ptr()), None)

    def _call_watching(
        self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[Any, bool]:
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
            return self._call(info, args, kwargs), False
        except RuntimeError as exc:
            if ALERT_TEXT not in str(exc):
                raise
        finally:
            torch.use_deterministic_algorithms(True, warn_only=True)
        return self._call(info, args, kwargs), True

    # --- after the run ----------------------------------------------------------

    def _first_use(self, t: torch.Tensor) -> None:
        """Called for an input no recorded op of this run produced or last wrote."""

    def finish(self) -> RunLog:
        """The run's log, with every digest copied to the host."""
        by_device: dict[torch.device, list[int]] = {}
        for i, d in enumerate(self._pending):
            by_device.setdefault(d.device, []).append(i)
        for indices in by_device.values():
            rows = torch.stack([self._pending[i] for i in indices]).cpu().tolist()
            for i, row in zip(indices, rows):
                key = self._pending_keys[i]
                key.value = tuple(row) + key.extra
        calls = []
        for info, inputs, outputs, where, alerted, tainted in self._calls:
            if where is None:
                device = dtype = None
            else:
                device, dtype = where[0], _dtype_name(where[1])
            calls.append(OpCall(info.name, device, dtype, inputs, outputs, alerted, tainted))
        self._calls, self._pending, self._pending_keys = [], [], []
        self._finished = True
        return RunLog(calls)


def _digest_module() -> Any:
    from pytest_backends.determinism import digest

    return digest


def _digest_function() -> Callable[[torch.Tensor], torch.Tensor]:
    """The fastest way to digest one tensor: the native op's C++ entry point if loaded."""
    module = _digest_module()
    op = module._native_digest_op(None)
    if op is None:
        fn: Callable[[torch.Tensor], torch.Tensor] = module._python_digest
        return fn
    # OpOverload.__call__ is a Python frame around this callable.
    return getattr(op, "_op", op)  # type: ignore[no-any-return]


_PYTHON_DISPATCH: dict[type, bool] = {}
_TRACER_MODULES = ("torch._subclasses", "torch._functorch", "torch.fx", "torch._export")


def unseen_reason(type_name: str) -> str:
    """The "not checked" reason for ops on a ``__torch_dispatch__`` tensor subclass."""
    return (
        f"ops on {type_name} tensors (a tensor subclass with __torch_dispatch__, such as a "
        "wrapper subclass or a jagged NestedTensor) run inside its __torch_dispatch__, where "
        "no op recorder sees them, so a nondeterministic op there would go unnoticed"
    )


def covered_memory(t: torch.Tensor) -> tuple[torch.Tensor, tuple[Any, ...]] | None:
    """The tensor to digest for ``t`` and what to add to its key; None when it is unreadable.

    A view whose storage is smaller than the view needs (a storage freed with
    ``untyped_storage().resize_(0)``) cannot be read. An overlapping view (an
    ``expand``, stride 0) is digested by the memory it covers, with its sizes and
    strides added to the key, never materialised.
    """
    try:
        if t.layout != torch.strided or t.numel() == 0:
            return t, ()
        sizes, strides = tuple(t.shape), tuple(t.stride())
        span = 1
        for n, stride in zip(sizes, strides):
            span += (n - 1) * stride
        offset = t.storage_offset()
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return t, ()  # no storage to check (the digest says whether it can read it)
    if storage.nbytes() < (offset + span) * t.element_size():
        return None
    if span < t.numel():
        return t.as_strided((span,), (1,), offset), ("strided", sizes, strides)
    return t, ()


def _opaque(t: torch.Tensor) -> Slot:
    return ("opaque", _dtype_name(t.dtype), tuple(t.shape), str(t.layout), type(t).__name__)


def _value_key(a: object) -> Slot:
    if isinstance(a, float):
        return a.hex()
    if type(a) in _PLAIN:
        return a
    if isinstance(a, (list, tuple)):
        return tuple(_value_key(x) for x in a)
    return ("object", type(a).__name__)


def _tensors(value: object) -> Iterator[torch.Tensor]:
    return (leaf for leaf in _tree.iter_leaves(value) if isinstance(leaf, torch.Tensor))


# --- source locations -------------------------------------------------------------

_SKIPPED_DIRS = (
    str(Path(torch.__file__).resolve().parent),
    str(Path(__file__).resolve().parent.parent),
)


def _user_frame(frame: Any) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame outside torch and this plugin."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIPPED_DIRS) and not filename.startswith("<"):
            return filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def caller_suffix() -> str:
    """``" (test_x.py:12)"``: where the innermost frame outside torch and this plugin is."""
    location = _user_frame(sys._getframe(1))
    return "" if location is None else f" ({Path(location[0]).name}:{location[1]})"


def _module_path(frame: Any) -> tuple[str, str] | None:
    """(path, class name) of the innermost ``nn.Module`` whose ``forward`` is running."""
    modules: list[torch.nn.Module] = []
    while frame is not None:
        if frame.f_code.co_name in ("_call_impl", "_wrapped_call_impl"):
            module = frame.f_locals.get("self")
            if isinstance(module, torch.nn.Module) and (not modules or modules[-1] is not module):
                modules.append(module)
        frame = frame.f_back
    if not modules:
        return None
    modules.reverse()  # outermost first
    names: list[str] = []
    for parent, child in itertools.pairwise(modules):
        name = next((n for n, m in parent.named_modules() if m is child), None)
        if name is None:
            names = []  # not a submodule: start the path again from this module
        else:
            names.append(name)
    return ".".join(names), type(modules[-1]).__name__


class _Locator:
    """Op names and the locations of chosen ops (by index), observed op by op in one re-run.

    ``observe`` is called after each op, in order, from the op's thread: the
    innermost Python frames are the op's callers, and its autograd node exists.
    """

    def __init__(self, targets: set[int]) -> None:
        self.targets = targets
        self.names: dict[int, str] = {}
        self._frames: dict[int, tuple[tuple[str, int, str], tuple[str, str] | None]] = {}
        self._first_of_seq: dict[int, int] = {}
        self._last_peek = -1
        self._backward_of: dict[int, int] = {}
        get_seq = getattr(torch._C._autograd, "_get_sequence_nr", None)
        self._get_seq: Callable[[], int] | None = get_seq

    def observe(self, name: str, frame: Any, index: int | None = None) -> None:
        """Note op ``name`` (at ``index``, by default the next one) called from ``frame``."""
        if index is None:
            index = len(self.names)
        self.names[index] = name
        node = _current_node()
        user = _user_frame(frame)
        if user is not None:
            self._frames[index] = (user, _module_path(frame))
        if node is None and self._get_seq is not None:
            # The autograd node of this op (if any) took the number before this one.
            peek = self._get_seq()
            if peek != self._last_peek:
                self._first_of_seq.setdefault(peek - 1, index)
                self._last_peek = peek
        elif node is not None:
            forward = self._first_of_seq.get(node._sequence_nr())
            if forward is not None:
                self._backward_of[index] = forward

    def locations(self) -> dict[int, Location]:
        found: dict[int, Location] = {}
        for index in self.targets:
            loc = self._location(index)
            if loc is None:
                continue
            forward = self._backward_of.get(index)
            if forward is not None:
                loc = dataclasses.replace(
                    loc, forward_op=self.names[forward], forward=self._location(forward)
                )
            found[index] = loc
        return found

    def _location(self, index: int) -> Location | None:
        entry = self._frames.get(index)
        if entry is None:
            return None
        (file, line, function), module = entry
        return Location(
            _short_path(file),
            line,
            function,
            module[0] if module else None,
            module[1] if module else None,
        )


class _LocatingMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Feeds a :class:`_Locator` from a Python dispatch mode."""

    def __init__(self, locator: _Locator) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.locator = locator

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.locator.observe(func.name().split(".", 1)[0], sys._getframe(1))
        return out


def _current_node() -> Any:
    current = getattr(torch._C, "_current_autograd_node", None)
    return current() if current is not None else None


def _short_path(file: str) -> str:
    try:
        return str(Path(file).resolve().relative_to(Path.cwd()))
    except ValueError:
        return file


def locate(comparison: Comparison, run: Callable[[], object], native: Any = None) -> Comparison:
    """``comparison`` with source locations, found by calling ``run`` once more.

    ``run`` repeats run 0 (the caller restores the RNGs first). Locations are
    attached where the re-run called the same op at the same position.
    ``native`` is the extension module when the runs were recorded by the
    native recorder (its op sequence is the one to follow), else None.
    Exceptions from ``run`` are ignored: the locations found before it raised
    are kept.
    """
    divergences = [*comparison.blamed, *comparison.uninitialized]
    if comparison.unexplained is not None:
        divergences.append(comparison.unexplained)
    if not divergences:
        return comparison
    recorder = _Locator({d.op_index for d in divergences})
    watch: Any
    if native is not None:
        watch = native.RunRecorder()
        watch.set_observer(lambda index, name: recorder.observe(name, sys._getframe(1), index))
        watch.start()
    else:
        watch = _LocatingMode(recorder)
        watch.__enter__()
    try:
        run()
    except Exception:
        pass
    finally:
        if native is not None:
            watch.stop()
        else:
            watch.__exit__(None, None, None)
    where = recorder.locations()

    def placed(d: Divergence) -> Divergence:
        index = d.op_index
        if index in where and recorder.names.get(index) == d.op:
            return dataclasses.replace(d, location=where[index])
        return d

    return dataclasses.replace(
        comparison,
        blamed=[placed(d) for d in comparison.blamed],
        uninitialized=[placed(d) for d in comparison.uninitialized],
        unexplained=placed(comparison.unexplained) if comparison.unexplained else None,
    )


# --- comparison ---------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """Where a run first differed from run 0.

    ``kind`` is ``"op"`` (the op produced different outputs from identical
    inputs: it is nondeterministic), ``"uninitialized"`` (the op read
    uninitialised memory, created by ``origin``), ``"inputs"`` (the first
    differing op's inputs already differed, so the cause lies outside torch
    ops), ``"unproven"`` (its inputs looked equal, but one of them, named in
    ``origin``, cannot be proven equal: the op is not blamed) or
    ``"sequence"`` (the runs called different ops). ``location`` is
    filled in by :func:`locate`.
    """

    kind: str
    run: int
    op_index: int
    op: str
    device: str | None
    dtype: str | None
    output_index: int | None = None
    other_op: str | None = None
    origin: str | None = None
    location: Location | None = None

    def describe(self, runs: int) -> str:
        """A sentence for a failure message."""
        where = ", ".join(x for x in (self.device, self.dtype) if x)
        where = f" ({where})" if where else ""
        at = f" at {self.location.describe()}" if self.location is not None else ""
        if self.kind == "op":
            return (
                f"nondeterministic op {self.op}{where}{at}: output {self.output_index} differs "
                f"between run 0 and run {self.run} from identical inputs "
                f"(op #{self.op_index} of the run; {runs} runs)"
            )
        if self.kind == "unproven":
            return (
                f"{self.op}{where}{at} (op #{self.op_index}) gave a different output "
                f"{self.output_index} in run {self.run}, but its {self.origin} cannot be "
                "proven equal between runs, so the op is not blamed"
            )
        if self.kind == "uninitialized":
            return (
                f"reads uninitialised memory from {self.origin}: {self.op}{where}{at} "
                f"(op #{self.op_index}, output {self.output_index}) differs between run 0 and "
                f"run {self.run} because it read memory that no op wrote; initialise it "
                "(torch.zeros, torch.full) or write every element before reading it. This is "
                "a bug in the test or the code under test, not a nondeterministic kernel"
            )
        if self.kind == "inputs":
            return (
                f"run {self.run} first differs from run 0 at op {self.op}{where}{at} "
                f"(op #{self.op_index}, output {self.output_index}), but that op's inputs "
                "already differed: the difference comes from outside torch ops, e.g. state "
                "carried over between runs (function-scoped fixture values are shared by all "
                "runs; a test that mutates them, or a module or global, is not repeatable) "
                "or randomness not drawn from torch, random or numpy"
            )
        return (
            f"run {self.run} called a different op sequence than run 0 from op "
            f"#{self.op_index} on (run 0: {self.op}, run {self.run}: {self.other_op}){at} "
            "with no op output differing before: control flow depends on something "
            "outside torch ops"
        )


@dataclass
class Comparison:
    """The outcome of :func:`compare_runs`.

    ``blamed`` lists the ops that produced different outputs from identical
    inputs, earliest first, one entry per op position. ``uninitialized``
    lists the ops whose outputs differed because they read uninitialised
    memory. ``unexplained`` is the earliest divergence that is not preceded
    by a blamed op in its run. ``verdicts`` maps ``(op, device, dtype)`` to
    this test's verdict.
    """

    runs: int
    blamed: list[Divergence]
    unexplained: Divergence | None
    verdicts: dict[tuple[str, str | None, str | None], str]
    uninitialized: list[Divergence] = field(default_factory=list)

    @property
    def reproducible(self) -> bool:
        """True when every run matched run 0."""
        return not self.blamed and not self.uninitialized and self.unexplained is None


def _first_difference(a: tuple[Slot, ...], b: tuple[Slot, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _has_uninitialized(slot: Slot) -> bool:
    if type(slot) is tuple and slot:
        if slot[0] == "uninitialized":
            return True
        return any(_has_uninitialized(s) for s in slot)
    return False


def _describe_unproven(slot: Slot) -> str | None:
    if type(slot) is tuple and slot:
        tag = slot[0]
        if tag == "opaque":
            what = slot[3] if len(slot) > 3 else "opaque"
            reason = {
                "unreadable": "a tensor whose storage is too small for it (freed?)",
                "meta": "a meta tensor",
            }.get(str(what), f"a tensor the recorder cannot read ({what})")
            return f"{reason}, {slot[1]} of shape {tuple(slot[2])}"
        if tag == "object":
            return f"a {slot[1]} object, which the recorder cannot compare"
        if tag in ("digest", "uninitialized", "unread", "workspace", "empty", "rebound"):
            return None
        for item in slot:
            found = _describe_unproven(item)
            if found is not None:
                return found
    return None


def unproven_input(inputs: tuple[Slot, ...]) -> str | None:
    """``"input 1 (a ... object)"``: the first input that cannot be proven equal, else None.

    Tensors are proven equal by their contents (digests), generators by their
    state, plain values by value. An opaque tensor (unreadable, or of a layout
    the digest cannot read) and a Python object keyed by its type are not.
    """
    for i, slot in enumerate(inputs):
        if type(slot) is Digest or type(slot) is not tuple:
            continue
        found = _describe_unproven(slot)
        if found is not None:
            keyword = len(slot) == 2 and type(slot[0]) is str and slot[0] not in UNPROVEN_TAGS
            name = f"argument {slot[0]!r}" if keyword else ""
            return f"input {i} ({found})" if not name else f"{name} ({found})"
    return None


def compare_runs(logs: Sequence[RunLog]) -> Comparison:
    """Compare every run with run 0, op by op.

    The proof rule: an op is blamed only when every input it received is proven
    equal between runs (:func:`unproven_input`); where an op's outputs differ
    and one of its equal-looking inputs is not proof, the divergence is
    ``"unproven"`` and the test is not checked.

    One run proves nothing: its ops are ``inconclusive`` (a test that failed
    in its first run is not repeated).
    """
    if len(logs) < 2:
        return _single_run(logs)
    same = _same_fingerprints(logs)
    if same is not None:
        return same
    ref = logs[0].loaded().calls
    for log in logs[1:]:
        log.loaded()
    status: dict[int, str] = {}  # op index in run 0 -> verdict
    blamed: dict[int, Divergence] = {}
    uninitialized: dict[int, Divergence] = {}
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
            origin = a.tainted or b.tainted
            if origin is not None and (
                _has_uninitialized(a.inputs) if same_inputs else not first_diff_seen
            ):
                # The op read memory that no op wrote: its outputs (or inputs) differ
                # because of that memory, not because of the kernel.
                status[i] = "reads_uninitialized"
                if i not in uninitialized:
                    uninitialized[i] = Divergence(
                        "uninitialized", r, i, a.name, a.device, a.dtype, out_diff, origin=origin
                    )
                if not first_diff_seen:
                    first_blamed = True
            elif same_inputs and (weak := unproven_input(a.inputs)) is not None:
                # Equal keys, but not proof: the op is not blamed (the proof rule).
                if not first_diff_seen:
                    d = Divergence(
                        "unproven", r, i, a.name, a.device, a.dtype, out_diff, origin=weak
                    )
                    if unexplained is None or (i, r) < (unexplained.op_index, unexplained.run):
                        unexplained = d
            elif same_inputs:
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
                merge_verdict(verdicts, call.key, "raises_under_deterministic_mode")
    for i, call in enumerate(ref):
        merge_verdict(verdicts, call.key, status.get(i, "inconclusive"))
    return Comparison(
        len(logs),
        [blamed[i] for i in sorted(blamed)],
        unexplained,
        verdicts,
        [uninitialized[i] for i in sorted(uninitialized)],
    )


def _single_run(logs: Sequence[RunLog]) -> Comparison:
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    for log in logs:
        if log.keys is not None:
            keys = list(log.keys)
        else:
            keys = [(*call.key, call.alerted) for call in log.calls]
        for name, device, dtype, alerted in keys:
            if alerted:
                merge_verdict(verdicts, (name, device, dtype), "raises_under_deterministic_mode")
            merge_verdict(verdicts, (name, device, dtype), "inconclusive")
    return Comparison(len(logs), [], None, verdicts)


def _same_fingerprints(logs: Sequence[RunLog]) -> Comparison | None:
    """The comparison of summarised runs that are all alike, without loading their calls."""
    keys = logs[0].keys
    if keys is None or logs[0].fingerprint is None:
        return None
    if any(log.fingerprint != logs[0].fingerprint or log.keys is None for log in logs):
        return None
    verdicts: dict[tuple[str, str | None, str | None], str] = {}
    for name, device, dtype, alerted in keys:
        if alerted:
            merge_verdict(verdicts, (name, device, dtype), "raises_under_deterministic_mode")
        merge_verdict(verdicts, (name, device, dtype), "deterministic")
    return Comparison(len(logs), [], None, verdicts)


def merge_verdict(
    verdicts: dict[tuple[str, str | None, str | None], str],
    key: tuple[str, str | None, str | None],
    verdict: str,
    order: Sequence[str] = VERDICTS,
) -> None:
    """Keep the graver of ``verdict`` and the one ``key`` has (``order``: gravest first)."""
    old = verdicts.get(key)
    if old is None or order.index(verdict) < order.index(old):
        verdicts[key] = verdict
