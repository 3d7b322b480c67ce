"""Stage 3 of the determinism pipeline: where in the source the blamed ops were called.

Locations cost nothing while a test passes: the runs are recorded without
them, and :func:`locate` re-runs a failing test once, following the same op
sequence (through the native recorder's observer, or a small Python dispatch
mode), and notes for the ops the comparison singled out the innermost frame
outside torch and this plugin (file, line, function), the ``nn.Module`` path,
and for a backward op the forward op it differentiates (the frame rule is
:func:`~pytest_backends.determinism.record.user_frame`, whose cheap forms the
recorders use while recording, for the origin of uninitialised memory).

Importing this module imports torch: load it only when the harness runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends.determinism.keys import op_info
from pytest_backends.determinism.location import Location
from pytest_backends.determinism.record import user_frame

if TYPE_CHECKING:
    from pytest_backends.determinism.compare import Comparison, Divergence

__all__ = ["Location", "locate", "run_uncounted"]


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
        user = user_frame(frame)
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
    """Feeds a :class:`_Locator` from a Python dispatch mode.

    It counts the ops the Python recorder records, by the same rules (its
    :func:`~pytest_backends.determinism.keys.op_info`): range markers are not
    ops, and a ``CompositeImplicitAutograd`` op (which reaches a mode under
    ``torch.inference_mode``) is looked through to the ops it calls. Counted
    otherwise, every op after one of them would be found at the wrong index.
    """

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
        kwargs = kwargs or {}
        info = op_info(func)
        skipped, out = run_uncounted(self, info, args, kwargs)
        if skipped:
            return out
        out = func(*args, **kwargs)
        self.locator.observe(info.name, sys._getframe(1))
        return out


def run_uncounted(
    mode: Any, info: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[bool, Any]:
    """Run an op the recorders do not count, in a Python dispatch ``mode``: ``(True, result)``.

    A range marker runs as it is; a ``CompositeImplicitAutograd`` op (it reaches a mode
    under ``torch.inference_mode``) runs its own kernel under ``mode``, whose ops come
    back to it. ``(False, None)`` for an op that is counted. (The Python recorder's hot
    path does the same inline.)
    """
    if info.marker:
        return True, info.call(*args, **kwargs)
    if info.composite:
        composite = torch._C.DispatchKey.CompositeImplicitAutograd
        with mode:
            return True, info.op._op_dk(composite, *args, **kwargs)
    return False, None


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
    Exceptions from ``run`` (but ``KeyboardInterrupt`` and ``SystemExit``) are
    ignored: the locations found before it raised are kept.
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
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # pytest.fail and pytest.skip too: a later run may have raised them
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
