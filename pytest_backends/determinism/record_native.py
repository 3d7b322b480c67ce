"""Stage 1, the native way: the per-op path of ``--backends-determinism`` in C++.

``native/recorder.cpp`` registers a boxed dispatcher fallback on a dispatch key
no torch op uses, puts that key in the recording thread's included set (torch
carries the set into autograd's worker threads) and records, per op, what
:class:`~pytest_backends.determinism.record_python.PythonRecorder` records: the op, a
key per input, a key per output, alerts and reads of uninitialised memory.
It looks through the same ops a Python dispatch mode looks through
(``CompositeImplicitAutograd`` ops and ops on wrapper tensors), so both give
the same op sequence, and its rows feed the same
:func:`~pytest_backends.determinism.compare.compare_runs`. Per op it costs
no Python at all; the rows are built once, when the run finishes.

The Python recorder stays the fallback where the extension is not built
(``PYTEST_BACKENDS_NATIVE=off``, no compiler).

Importing this module imports torch: load it only when the harness runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_backends.determinism.api import ALERT_TEXT
from pytest_backends.determinism.record import (
    OpCall,
    RunLog,
    caller_suffix,
    dtype_name,
    unseen_reason,
)

__all__ = ["NativeRecorder", "native_module", "recorder_choice"]


def native_module() -> Any:
    """The loaded extension when its native recorder can hook the dispatcher, else None.

    The hook cannot be placed where another library already registered a fallback
    for its dispatch key; the Python recorder records the runs then.
    """
    from pytest_backends import _native

    module = _native.load()
    hook_error = getattr(module, "recorder_hook_error", None)
    if module is None or not hasattr(module, "RunRecorder") or hook_error is None:
        return None  # not built, or built without the recorder
    if hook_error() or not hasattr(module, "set_op_tables"):
        return None
    try:
        _install_op_tables(module)
    except TypeError:  # built from older sources, without the marker table
        return None
    return module


def _install_op_tables(module: Any) -> None:
    """Give the native recorder the op tables of :mod:`.op_tables` (the one source)."""
    from pytest_backends.determinism import op_tables

    module.set_op_tables(
        sorted(op_tables.UNINITIALIZED),
        sorted(op_tables.OVERWRITES),
        sorted(op_tables.REBINDS),
        {name: sorted(positions) for name, positions in op_tables.WORKSPACES.items()},
        sorted(op_tables.MARKER_NAMESPACES),
    )


def recorder_choice() -> tuple[Any, str]:
    """The native module to record with (None: the Python recorder) and why, in words."""
    from pytest_backends import _native

    module = native_module()
    if module is not None:
        return module, "native (a C++ dispatcher hook)"
    hook_error = ""
    loaded = _native.load()
    if loaded is not None:
        check = getattr(loaded, "recorder_hook_error", None)
        hook_error = check() if check is not None else "the extension was built without it"
    why = hook_error or _native.unavailable_reason() or "the native extension is not available"
    return None, f"Python (a TorchDispatchMode; not native: {why})"


class NativeRecorder:
    """One run under the native recorder: a :class:`~.record.RunLogRecorder`, as the Python one.

    ``first_uses`` and ``failure`` are filled in by :meth:`finish`. ``previous``
    (the previous run's recorder) sizes the record and, with ``carry``, lends
    the keys of tensors from outside the run that it proved unchanged.
    """

    def __init__(
        self, module: Any, previous: NativeRecorder | None = None, carry: bool = True
    ) -> None:
        prior = None if previous is None else previous._recorder
        try:
            self._recorder: Any = module.RunRecorder(prior, carry)
        except TypeError:  # an extension built before keys were carried
            self._recorder = module.RunRecorder(prior)
        self._recorder.set_locator(caller_suffix)
        self.first_uses: list[tuple[int, Any]] = []
        self.failure: str | None = None
        #: Why ops of this run ran where the recorder cannot see (None: nowhere).
        self.blind: str | None = None
        #: Indices of the ops that read memory shared outside torch (after :meth:`finish`).
        self.outside: list[int] = []
        #: Op index -> ``"test_x.py:6"``: where each op that read shared memory was called.
        self.outside_places: dict[int, str] = {}
        self._shares = hasattr(self._recorder, "add_shared")

    def __enter__(self) -> NativeRecorder:
        if self._shares:
            from pytest_backends.determinism import outside

            for ptr in outside.live():
                self._recorder.add_shared(ptr)
            outside.listen(self._recorder.add_shared)
        self._recorder.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._recorder.stop()
        if self._shares:
            from pytest_backends.determinism import outside

            outside.unlisten(self._recorder.add_shared)

    def finish(self, raised: BaseException | None = None) -> RunLog:
        """The run's log; ``raised`` is the run's exception (an alert marks the op that raised).

        The log is summarised (a fingerprint and the census keys); its calls
        are built only if a comparison needs them.
        """
        if raised is not None and ALERT_TEXT in str(raised):
            self._recorder.note_alert()
        fingerprint, keys, self.first_uses, self.failure = self._recorder.finish()
        if self._shares:
            self.outside = list(self._recorder.outside())
            if hasattr(self._recorder, "outside_places"):
                # The locator gives " (test_x.py:6)", as for uninitialised memory.
                self.outside_places = {
                    int(index): place.strip()[1:-1]
                    for index, place in self._recorder.outside_places()
                    if place.strip()
                }
        blind = self._recorder.blind() if hasattr(self._recorder, "blind") else None
        if blind:
            self.blind = unseen_reason(str(blind))
        return RunLog(
            fingerprint=fingerprint,
            keys=[
                (name, device, None if dtype is None else dtype_name(dtype), alerted)
                for name, device, dtype, alerted in keys
            ],
            load=self._calls,
        )

    def _calls(self) -> list[OpCall]:
        return [
            OpCall(
                name,
                device,
                None if dtype is None else dtype_name(dtype),
                inputs,
                outputs,
                alerted,
                tainted,
            )
            for name, device, dtype, inputs, outputs, alerted, tainted in self._recorder.rows()
        ]

    def keep(self) -> Any:
        """The object that keeps first-use identities from being reused."""
        return self._recorder


if TYPE_CHECKING:
    from pytest_backends.determinism.record import RunLogRecorder

    _: type[RunLogRecorder] = NativeRecorder
