"""Stage 1, the Python way: :class:`PythonRecorder`, a ``TorchDispatchMode``.

The fallback where the native recorder is not built; both fill the same
:class:`~pytest_backends.determinism.record.RunLog` from the same op tables and give
the same verdicts (the documentation's determinism explanation gives the proof rule:
keys reused while a version counter has not moved, outside tensors carried between
runs only when proven unchanged, generators keyed by their state at call time,
uninitialised memory tracked). Importing this module imports torch.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends.determinism import outside
from pytest_backends.determinism.api import ALERT_TEXT
from pytest_backends.determinism.keys import (
    CAST_ERROR,
    INFOS,
    PLAIN,
    OpInfo,
    covered_memory,
    default_generator,
    digest_function,
    digest_module,
    dispatches_in_python,
    op_info,
    opaque,
    rewrap_numbers,
    run_op,
    storage_ptr,
    tensors_in,
    value_key,
)
from pytest_backends.determinism.op_tables import SlotTag
from pytest_backends.determinism.record import (
    Digest,
    OpCall,
    RunLog,
    Slot,
    caller_place,
    caller_suffix,
    dtype_name,
    failure_text,
    unseen_reason,
)
from pytest_backends.determinism.uninitialized import (
    Taints,
    clear_taint,
    reads_tainted,
    taint,
    taint_of,
)

__all__ = ["PythonRecorder"]

_Tensor, _STRIDED = torch.Tensor, torch.strided
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


class PythonRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every op dispatched while the mode is active; steps aside where it cannot see.

    Use one recorder per run: ``with PythonRecorder() as rec: ...`` then
    ``rec.finish()``. ``previous`` (the previous run's recorder) lends, with
    ``carry``, the keys of outside tensors it proved unchanged. ``failure`` is
    None, or the recorder's own exception (one line) after which it stopped
    recording. ``first_uses`` lists, per op index, the tensors that entered the
    record there (made before the run or outside the recorded ops).
    """

    def __init__(self, previous: PythonRecorder | None = None, carry: bool = True) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # Per call: (info, inputs, outputs, (device type, dtype) or None, alerted, tainted)
        self._calls: list[tuple[Any, ...]] = []
        self._pending: list[torch.Tensor] = []
        self._pending_keys: list[Digest] = []
        # id(tensor) -> (weak reference, version counter, key); the reference guards
        # against a dead tensor's id being reused within the run.
        self._known: dict[int, tuple[Any, int, Slot]] = {}
        # Keys carried from the previous run (see ``_carried``): an outside tensor is
        # otherwise keyed by its contents at its first use in every run, so a storage
        # swapped between runs (``layer.weight.data = other``) or memory written
        # outside torch ops is seen.
        self._carried: dict[int, tuple[Any, ...]] = (
            previous._carry_out if previous is not None and carry else {}
        )
        self._carry_out: dict[int, tuple[Any, ...]] = {}
        # Storages (data pointers) a recorded op of this run wrote, through any alias.
        self._written: set[int] = set()
        #: Why ops of this run ran where the recorder cannot see (None: nowhere).
        self.blind: str | None = None
        # Storages that hold uninitialised memory, and its origin.
        self._tainted: Taints = {}
        self._finished = False
        self._digest_fn = digest_function()
        # Storages shared outside torch ops (NumPy), read at every use; dead ones dropped.
        self._shared = outside.pruned()
        #: Indices of the ops that read memory shared outside torch.
        self.outside: list[int] = []
        #: Op index -> ``"test_x.py:6"``: where each op that read shared memory was called.
        self.outside_places: dict[int, str] = {}
        self._prune_at = 4096
        #: The recorder's own exception (one line), after which it stopped recording.
        self.failure: str | None = None
        #: ``(op index, weak reference)`` of every tensor that entered the record.
        self.first_uses: list[tuple[int, weakref.ref[torch.Tensor]]] = []
        self._index = 0
        # The current op: whether it ran, its result and its own exception.
        self._op_ran = False
        self._op_result: Any = None
        self._op_error: BaseException | None = None

    # --- the per-op path --------------------------------------------------------

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let Dynamo compile under the recorder; compiled code's dispatcher calls are recorded."""
        return True

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = {} if kwargs is None else kwargs
        if self.failure is not None:
            return run_op(func, func, args, kwargs)
        info = INFOS.get(id(func)) or op_info(func)
        if info.marker:
            return info.call(*args, **kwargs)  # a range marker: no op of the record
        if info.composite:  # looked through (its C++ kernel's ops come back here), as natively
            with self:
                return info.op._op_dk(_COMPOSITE, *args, **kwargs)
        self._op_ran = False
        self._op_error = None
        try:
            return self._record(info, args, kwargs)
        except Exception as exc:
            error = self._op_error
            if error is not None:
                # The op's own exception (or the recorder failed while noting it).
                raise error from None
            self._fail(exc)
            return self._op_result if self._op_ran else run_op(func, func, args, kwargs)
        finally:
            self._op_result = None  # the mode must not keep the op's outputs alive
            self._index += 1

    def _call(self, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Run the op, noting whether it ran, what it returned and what it raised."""
        self._op_error = None
        try:
            try:
                result = info.call(*args, **kwargs)
            except RuntimeError as exc:
                rewrapped = rewrap_numbers(info.op, args) if CAST_ERROR in str(exc) else None
                if rewrapped is None:
                    raise
                result = info.call(*rewrapped, **kwargs)
        except BaseException as exc:
            self._op_error = exc
            raise
        self._op_ran = True
        self._op_result = result
        return result

    def _record(self, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        # The recording itself; ``__torch_dispatch__`` around it tells the op's own
        # exceptions from the recorder's and steps aside after the recorder's.
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
            shared = self._shared
            for a in args:
                cls = type(a)
                if cls is _Tensor:
                    hit = known.get(id(a))
                    # A known entry means ``_version`` worked for this very tensor.
                    if (
                        hit is not None
                        and hit[0]() is a
                        and hit[1] == a._version
                        and not (shared and storage_ptr(a) in shared)
                    ):
                        keys.append(hit[2])
                    else:
                        keys.append(self._input(a))
                    continue
                elif cls in PLAIN:
                    keys.append(a)
                    continue
                elif cls is list:  # sizes, strides, padding: ints are their own keys
                    keys.append(tuple([x if type(x) is int else key(x) for x in a]))
                    continue
                keys.append(key(a))
            inputs = tuple(keys)
            if self._tainted:
                tainted = reads_tainted(self._tainted, info, args, kwargs)
        if kwargs:
            inputs += tuple([(k, key(v)) for k, v in sorted(kwargs.items())])
        if info.written:
            self._note_written(info, args, kwargs)
        if info.seeded:
            inputs += self._default_generator(args, kwargs)
        try:
            if torch.are_deterministic_algorithms_enabled() and (
                torch.is_deterministic_algorithms_warn_only_enabled()
            ):
                out, alerted = self._call_watching(info, args, kwargs)
            else:
                out = self._call(info, args, kwargs)
                alerted = False
        except RuntimeError as exc:
            ref = next(tensors_in([*args, *kwargs.values()]), None)
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
                clear_taint(self._tainted, info, args)
            return out
        if isinstance(out, torch.Tensor):
            tensors: list[torch.Tensor] = [out]
        elif isinstance(out, (list, tuple)):
            tensors = list(tensors_in(out))
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
                [
                    self._remember(t, (SlotTag.VIEW, info.name, j, inputs))
                    for j, t in enumerate(tensors)
                ]
            )
        elif info.workspaces:
            outputs = tuple(
                [
                    self._remember(t, (SlotTag.WORKSPACE, dtype_name(t.dtype), tuple(t.shape)))
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
                tensors = list(tensors_in(mutated))
                outputs = tuple([self._output(t) for t in tensors])
            elif out is not None:
                outputs = (value_key(out),)
        if info.overwrites and self._tainted and passes is None:
            clear_taint(self._tainted, info, args)
        # Only the device and dtype: holding the tensor would keep it alive (and make
        # torch wrap the returned tensor anew with an extra ``detach``).
        ref = tensors[0] if tensors else next(tensors_in([*args, *kwargs.values()]), None)
        # ``is_cpu`` is far cheaper than building ``ref.device``.
        where = None if ref is None else ("cpu" if ref.is_cpu else ref.device.type, ref.dtype)
        self._calls.append((info, inputs, outputs, where, alerted, tainted))
        return out

    def _key(self, a: object) -> Slot:
        if isinstance(a, torch.Tensor):
            if type(a) is not _Tensor and self._unseen(a):
                return opaque(a)
            hit = self._known.get(id(a))
            if hit is not None and hit[0]() is a:
                try:
                    if hit[1] == a._version and not (
                        self._shared and storage_ptr(a) in self._shared
                    ):
                        return hit[2]
                except (RuntimeError, TypeError):
                    return self._digest(a, external=True)
            return self._input(a)
        cls = type(a)
        if cls in PLAIN:
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
        return value_key(a)

    def _unread_keys(
        self, info: OpInfo, args: Sequence[Any]
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
                origin = taint_of(self._tainted, a) if self._tainted else None
                if origin is not None:
                    if not written and info.overwrites and passes is None:
                        passes = origin
                    keys.append((SlotTag.UNINITIALIZED, dtype_name(a.dtype), tuple(a.shape)))
                    continue
                if written:
                    keys.append((SlotTag.UNREAD, dtype_name(a.dtype), tuple(a.shape)))
                    continue
            keys.append(self._key(a))
        return tuple(keys), passes

    def _pass_taint(self, t: torch.Tensor, origin: str) -> Slot:
        """Key an overwrite's output that holds bytes copied from uninitialised memory."""
        taint(self._tainted, t, origin, replace=False)
        return self._remember(t, (SlotTag.UNINITIALIZED, dtype_name(t.dtype), tuple(t.shape)))

    def _rebound(self, t: torch.Tensor) -> Slot:
        """Key ``set_``'s output by shape: its new memory is keyed where an op first reads it."""
        self._known.pop(id(t), None)
        return (SlotTag.REBOUND, dtype_name(t.dtype), tuple(t.shape))

    def _unseen(self, t: torch.Tensor) -> bool:
        """Whether ops on ``t`` run inside a ``__torch_dispatch__`` that no recorder sees."""
        python = dispatches_in_python(t)
        if python and self.blind is None:
            self.blind = unseen_reason(type(t).__name__)
        return python

    def _default_generator(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Slot, ...]:
        """A random op's default generator, keyed by its state at call time (or nothing).

        An op passed a generator is keyed by that one; otherwise it draws from the
        default generator of its device, whose state is one more input: another
        thread drawing from it makes the inputs differ, never the op nondeterministic.
        """
        gen = default_generator(args, kwargs)
        if gen is False:
            return ()
        if gen is None:
            return ("default generator",)
        return (self._generator_key(gen),)

    def _generator_key(self, gen: torch.Generator) -> Slot:
        """A generator is keyed by its state at call time: equal states draw equal numbers."""
        try:
            state = gen.get_state()
        except (RuntimeError, TypeError, NotImplementedError):
            return ("object", "Generator")
        return ("generator", gen.device.type, self._digest(state))

    def _note_written(self, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Note the storages the op writes: a key carried for them is no longer proof."""
        written = self._written
        for t in tensors_in([args[i] for i in info.written if i < len(args)]):
            written.add(storage_ptr(t))
        if kwargs:
            for t in tensors_in(list(kwargs.values())):
                written.add(storage_ptr(t))

    def _carried_key(self, t: torch.Tensor) -> Slot | None:
        """The previous run's key of ``t`` where it is proven still true, else None.

        Proof that the bytes did not change: the same tensor, its version counter
        not moved, the same storage (the entry holds the old one, so its address is
        not reused), offset, sizes and strides, no recorded op of this run writing
        that storage through any alias (``.data``), and the storage not shared with
        something outside torch (checked by the caller).
        """
        entry = self._carried.pop(id(t), None)
        if entry is None:
            return None
        ref, version, key, storage, meta = entry
        try:
            ptr = storage.data_ptr()
            if (
                ref() is not t
                or t._version != version
                or storage_ptr(t) != ptr
                or ptr in self._written
                or (t.storage_offset(), t.shape, t.stride()) != meta
            ):
                return None
        except (RuntimeError, TypeError, NotImplementedError):
            return None
        return key

    def carry_unchanged(self) -> None:
        """Keep the keys the next run may reuse: outside tensors alive, unchanged, unwritten."""
        carry: dict[int, tuple[Any, ...]] = {}
        shared = self._shared
        for ident, (ref, version, key) in self._known.items():
            if type(key) is not Digest or not key.external or not key.storage:
                continue
            t = ref()
            if t is None or key.storage in self._written or key.storage in shared:
                continue
            try:
                if t._version != version or storage_ptr(t) != key.storage:
                    continue
                storage = t.untyped_storage()
                if outside.owned_outside(t, storage):
                    continue  # its owner, or another process, may write it
                meta = (t.storage_offset(), t.shape, t.stride())
            except (RuntimeError, TypeError, NotImplementedError):
                continue
            carry[ident] = (ref, version, key, storage, meta)
        self._carry_out = carry

    def _input(self, t: torch.Tensor) -> Slot:
        """The key of a tensor no op of this run produced (or that changed since)."""
        self._first_use(t)
        shared_now = self._shared and storage_ptr(t) in self._shared
        carried = self._carried_key(t) if self._carried and not shared_now else None
        if carried is not None:
            return self._remember(t, carried)
        key = self._remember(t, self._digest(t, external=True))
        if self._shared and storage_ptr(t) in self._shared:
            outside_at = self.outside
            if not outside_at or outside_at[-1] != self._index:
                outside_at.append(self._index)
                self.outside_places[self._index] = caller_place()
        return key

    def _output(self, t: torch.Tensor) -> Slot:
        # ``_remember(t, _digest(t))`` inlined for the common case: this runs for
        # nearly every output of every op.
        if type(t) is not _Tensor or t.layout != _STRIDED or t.is_meta or not t.is_contiguous():
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
            key.value = (SlotTag.EMPTY, dtype_name(t.dtype), tuple(t.shape))
        return self._remember(t, key)

    def _digest(self, t: torch.Tensor, external: bool = False) -> Slot:
        if t.is_meta:
            return (SlotTag.OPAQUE, dtype_name(t.dtype), tuple(t.shape), "meta")
        if type(t) is not _Tensor and self._unseen(t):
            return opaque(t)
        covered = covered_memory(t)
        if covered is None:
            return (SlotTag.OPAQUE, dtype_name(t.dtype), tuple(t.shape), "unreadable")
        view, extra = covered
        try:
            d = self._digest_fn(view)
        except NotImplementedError:  # a device without a native kernel: same values
            try:
                d = digest_module().digest(view, backend="python")
            except (TypeError, RuntimeError, NotImplementedError):
                return opaque(t)
        except (TypeError, RuntimeError):  # sparse, quantized, ...: not digestible
            return opaque(t)
        key = Digest(external, extra)
        if external:
            key.storage = storage_ptr(t)
            try:
                # Memory torch did not allocate (from_numpy, frombuffer, DLPack), or shared
                # with other processes (share_memory_): its owner may write it any time.
                if key.storage and outside.owned_outside(t, t.untyped_storage()):
                    outside.mark(t)
            except (RuntimeError, NotImplementedError, TypeError):
                pass
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
            taint(self._tainted, t, name + caller_suffix())
        return self._remember(t, (SlotTag.UNINITIALIZED, dtype_name(t.dtype), tuple(t.shape)))

    def _call_watching(
        self, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any]
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

    def _log(self) -> RunLog:
        """The run's log, with every digest copied to the host."""
        by_device: dict[torch.device, list[int]] = {}
        for i, d in enumerate(self._pending):
            by_device.setdefault(d.device, []).append(i)
        for indices in by_device.values():
            rows = torch.stack([self._pending[i] for i in indices]).cpu().tolist()
            for i, row in zip(indices, rows):
                key = self._pending_keys[i]
                key.value = tuple(row) + key.extra
        self.carry_unchanged()
        self._carried = {}
        calls = []
        for info, inputs, outputs, where, alerted, tainted in self._calls:
            if where is None:
                device = dtype = None
            else:
                device, dtype = where[0], dtype_name(where[1])
            calls.append(OpCall(info.name, device, dtype, inputs, outputs, alerted, tainted))
        self._calls, self._pending, self._pending_keys = [], [], []
        self._finished = True
        return RunLog(calls)

    def _first_use(self, t: torch.Tensor) -> None:
        # A plain try: ``contextlib.suppress`` costs a microsecond per first use.
        try:  # noqa: SIM105
            self.first_uses.append((self._index, weakref.ref(t)))
        except TypeError:
            pass

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = failure_text(exc)

    def keep(self) -> None:
        """Nothing to keep alive: ``first_uses`` holds weak references."""

    def finish(self, raised: BaseException | None = None) -> RunLog:
        """The run's log; empty (``failure`` set) if the recorder broke. Sees ops' own errors."""
        try:
            return self._log()
        except Exception as exc:
            self._fail(exc)
            return RunLog([])


if TYPE_CHECKING:
    from pytest_backends.determinism.record import RunLogRecorder

    _: type[RunLogRecorder] = PythonRecorder
