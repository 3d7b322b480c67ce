"""Where the op recorder cannot see, and what the harness does there.

The recorder is a Python ``TorchDispatchMode``. Three things lie outside it:

* **Compiled code.** Dynamo refuses to compile under an ordinary dispatch
  mode (``fullgraph=True`` fails, otherwise it silently runs eagerly). A mode
  whose ``ignore_compile_internals()`` is true is switched off while Dynamo,
  AOTAutograd and Inductor compile, and on again while the compiled code runs
  (measured with torch 2.13). Ops the compiled code calls through the
  dispatcher (custom ops, library kernels such as ``addmm.out``) are then
  recorded as usual; fused kernels are not, so their results are checked at
  the boundary: where a recorded op first uses them.
* **Other threads** and **Python data** (``torch.from_numpy``, state kept in
  Python objects). Dispatch modes are per thread, so a tensor made on another
  thread, like a tensor made from Python data, enters the record when a
  recorded op first uses it, and is keyed there.
* **The harness itself.** An exception raised by the recorder's own
  machinery is never the test's failure: the recorder steps aside for the
  rest of the run, the test keeps the outcome it would have had without the
  check, and its verdict is "not checked" with the reason.

A run in which Dynamo compiled is a warm-up for the comparison: compiling
runs code once (first-call analysis, lazy backward compilation) that later
calls skip, so its op sequence legitimately differs. It keeps its outcome
(it is the test's real run), but the runs compared are the later ones.

When runs differ only because their inputs differ (a Python value passed to
an op, a tensor kept between runs, data made outside the recorded ops), no
op is to blame: the test is not repeatable, not nondeterministic. Its
verdict is "not checked" with the reason; an opt-in turns this into a
failure.

Importing this module imports torch: load it only when the harness runs.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_backends.determinism.recorder import (
    Comparison,
    Digest,
    OpCall,
    OpRecorder,
    RunLog,
    _OpInfo,
)

__all__ = [
    "INPUTS_DIFFER",
    "BoundaryRecorder",
    "CompileWatch",
    "RunRecord",
    "boundary_notes",
    "explain_unchecked",
]

#: The verdict's reason when runs differ only because their inputs did.
INPUTS_DIFFER = "its inputs differ between runs (Python state outside torch ops)"

# TorchScript's graph printer hands wrapped-number tensors to the dispatcher, and the
# Python binding gives them to the mode as plain numbers (measured with torch 2.13:
# ``aten::_local_scalar_dense`` and ``aten::view`` arrive with a float ``self``).
_CAST_ERROR = "Expected a value of type 'Tensor'"
_NUMBER_DTYPES: tuple[tuple[type, torch.dtype], ...] = (
    (bool, torch.bool),
    (int, torch.int64),
    (float, torch.float64),
    (complex, torch.complex128),
)
_TENSOR_TAGS = frozenset(
    {"digest", "opaque", "uninitialized", "workspace", "view", "empty", "unread", "rebound"}
)


def _rewrap_numbers(op: Any, args: Sequence[Any]) -> tuple[Any, ...] | None:
    """``args`` with plain numbers in Tensor positions turned back into 0-dim tensors."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    changed = False
    out = list(args)
    for i, (arg, value) in enumerate(zip(schema.arguments, args)):
        if not isinstance(arg.type, torch.TensorType):
            continue
        for kind, dtype in _NUMBER_DTYPES:
            if type(value) is kind:
                out[i] = torch.tensor(value, dtype=dtype)
                changed = True
                break
    return tuple(out) if changed else None


def _run_op(call: Any, op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``call(*args, **kwargs)``, again with numbers rewrapped where the binding unwrapped them."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as exc:
        rewrapped = _rewrap_numbers(op, args) if _CAST_ERROR in str(exc) else None
        if rewrapped is None:
            raise
        return call(*rewrapped, **kwargs)


class BoundaryRecorder(OpRecorder):  # type: ignore[no-untyped-call]
    """An :class:`OpRecorder` that steps aside where it cannot see, and when it breaks.

    ``failure`` is None, or the recorder's own exception (one line) after which
    it stopped recording. ``first_uses`` lists, per op index, the tensors that
    entered the record there (made before the run or outside the recorded ops),
    except tensors whose keys were carried over unchanged from the previous run.
    """

    def __init__(self, previous: OpRecorder | None = None) -> None:
        super().__init__(previous)
        self.failure: str | None = None
        self.first_uses: list[tuple[int, weakref.ref[torch.Tensor]]] = []
        self._index = 0
        # The current op: whether it ran, its result and its own exception.
        self._op_ran = False
        self._op_result: Any = None
        self._op_error: BaseException | None = None

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
        if kwargs is None:
            kwargs = {}
        if self.failure is not None:
            return _run_op(func, func, args, kwargs)
        self._op_ran = False
        self._op_error = None
        try:
            return self._record(func, args, kwargs)
        except Exception as exc:
            error = self._op_error
            if error is not None:
                # The op's own exception (or the recorder failed while noting it).
                raise error from None
            self._fail(exc)
            return self._op_result if self._op_ran else _run_op(func, func, args, kwargs)
        finally:
            self._op_result = None  # the mode must not keep the op's outputs alive
            self._index += 1

    def _call(self, info: _OpInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Run the op, noting whether it ran, what it returned and what it raised."""
        self._op_error = None
        try:
            try:
                result = info.call(*args, **kwargs)
            except RuntimeError as exc:
                rewrapped = _rewrap_numbers(info.op, args) if _CAST_ERROR in str(exc) else None
                if rewrapped is None:
                    raise
                result = info.call(*rewrapped, **kwargs)
        except BaseException as exc:
            self._op_error = exc
            raise
        self._op_ran = True
        self._op_result = result
        return result

    def _first_use(self, t: torch.Tensor) -> None:
        # A plain try: ``contextlib.suppress`` costs a microsecond per first use.
        try:  # noqa: SIM105
            self.first_uses.append((self._index, weakref.ref(t)))
        except TypeError:
            pass

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            text = str(exc).strip().splitlines()
            self.failure = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")

    def keep(self) -> None:
        """Nothing to keep alive: ``first_uses`` holds weak references."""

    def finish(self, raised: BaseException | None = None) -> RunLog:
        """The run's log; empty (and ``failure`` set) when the recorder's own machinery broke.

        ``raised`` (the run's exception) is not needed here: this recorder sees
        each op's own exception.
        """
        try:
            return super().finish()
        except Exception as exc:
            self._fail(exc)
            return RunLog([])


class CompileWatch:
    """Counts Dynamo compilations: its compile-start callbacks and its graph counter.

    The callback (which also sees backward graphs compiled lazily) is
    (re)installed before every run, since ``torch._dynamo.reset()`` clears
    them; the graph counter covers a run that loads Dynamo and compiles before
    the callback is in. Nothing is imported here.
    """

    def __init__(self) -> None:
        self.count = 0

    def _on_start(self, *args: Any) -> None:
        self.count += 1

    def arm(self) -> None:
        """Install the callback if Dynamo is loaded and it is not installed."""
        module = sys.modules.get("torch._dynamo.callback")
        handler = getattr(module, "callback_handler", None)
        starts = getattr(handler, "start_callbacks", None)
        if handler is None or not isinstance(starts, list) or self._on_start in starts:
            return
        with contextlib.suppress(Exception):
            handler.register_start_callback(self._on_start)

    def total(self) -> int:
        """Compilations so far: callbacks seen plus graphs Dynamo counted (0 before it loads)."""
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        graphs = 0
        with contextlib.suppress(Exception):
            graphs = int(counters["stats"]["unique_graphs"]) if counters is not None else 0
        return self.count + graphs


@dataclass
class RunRecord:
    """One run: its log, the tensors that entered it, and whether it compiled.

    ``first_uses`` holds ``(op index, tensor)`` pairs, the tensor as a weak
    reference (Python recorder) or as an identity that the native recorder
    keeps from being reused (``keep`` holds that recorder).
    """

    log: RunLog
    first_uses: list[tuple[int, Any]] = field(default_factory=list)
    compiled: bool = False
    keep: Any = None
    #: Why some of the run's ops ran where the recorder cannot see, or None.
    blind: str | None = None

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


def _leaves(a: Any, b: Any) -> Iterator[tuple[Any, Any]]:
    """Pairs of differing leaf keys in two input keys (lists and keyword pairs are opened)."""
    if (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b)
        and not _is_tensor_key(a)
        and not _is_tensor_key(b)
        and not _is_generator_key(a)
    ):
        for x, y in zip(a, b):
            yield from _leaves(x, y)
    elif a != b:
        yield a, b


def _is_generator_key(key: Any) -> bool:
    return isinstance(key, tuple) and len(key) == 3 and key[0] == "generator"


def _is_tensor_key(key: Any) -> bool:
    if isinstance(key, Digest):
        return True
    return isinstance(key, tuple) and bool(key) and key[0] in _TENSOR_TAGS


def _show(key: Any) -> str:
    if isinstance(key, str):
        try:
            return repr(float.fromhex(key))  # floats are keyed by their exact hex form
        except ValueError:
            return repr(key)
    if isinstance(key, (int, bool)) or key is None:
        return repr(key)
    return "?"


def explain_unchecked(comparison: Comparison, runs: Sequence[RunRecord]) -> str | None:
    """Why the runs differ when no op is to blame, or None when they agree or an op is blamed.

    ``runs`` are the compared runs, in the order given to ``compare_runs``.
    """
    d = comparison.unexplained
    if d is None or comparison.blamed or comparison.uninitialized:
        return None
    if d.kind == "sequence":
        return (
            f"{INPUTS_DIFFER}: run {d.run} called {d.other_op} where run 0 called {d.op} "
            f"(op #{d.op_index}) with every earlier op's result identical, so the control "
            "flow depends on something outside torch ops"
        )
    at = f" at {d.location.describe()}" if d.location is not None else ""
    if d.kind == "unproven":
        return (
            f"{d.op}{at} (op #{d.op_index}) gave a different output {d.output_index} in run "
            f"{d.run}, but its {d.origin} cannot be proven equal between runs, so no op is "
            "blamed (an op is blamed only when every input it received is proven equal)"
        )
    ref, other = runs[0], runs[d.run]
    a: OpCall = ref.log.calls[d.op_index]
    b: OpCall = other.log.calls[d.op_index]
    pairs = [p for x, y in zip(a.inputs, b.inputs) for p in _leaves(x, y)]
    generators = [(x, y) for x, y in pairs if _is_generator_key(x) or _is_generator_key(y)]
    if generators:
        return (
            f"{INPUTS_DIFFER}: a torch.Generator passed to {d.op}{at} is in a different state "
            f"in run {d.run} than in run 0 (the harness restores the global RNGs and the "
            "generators it finds in fixture values, module globals and the test's class "
            "before each run; this one it did not reach)"
        )
    values = [(x, y) for x, y in pairs if not (_is_tensor_key(x) or _is_tensor_key(y))]
    if values or not pairs:
        shown = (
            f": {_show(values[0][0])} in run 0, {_show(values[0][1])} in run {d.run}"
            if values
            else ""
        )
        return f"{INPUTS_DIFFER}: a Python value passed to {d.op} differs{shown}"
    before = ref.entered_at(d.op_index)
    now = other.entered_at(d.op_index)
    if now and now <= before:
        return (
            f"{INPUTS_DIFFER}: a tensor kept between runs (module-level, class-level or "
            f"fixture state) was changed by an earlier run; first used here by {d.op}"
        )
    return (
        f"{INPUTS_DIFFER}: a tensor made outside the recorded ops (Python data, another "
        f"thread or a compiled kernel) differs between runs; first used by {d.op}"
    )


def boundary_notes(runs: Sequence[RunRecord]) -> list[str]:
    """Which parts of the test were checked only at their boundary, and why."""
    notes: list[str] = []
    if any(r.compiled for r in runs):
        notes.append(
            "torch.compile: fused kernels of compiled code run outside the dispatcher and "
            "are checked through their outputs where recorded ops use them; the ops compiled "
            "code calls through the dispatcher (custom ops, library kernels) are recorded"
        )
    return notes
