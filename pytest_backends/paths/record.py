"""Record every op of a run with its inputs, outputs, call site and module path.

Each op gets an identity ``(op name, module path, call site, occurrence)``
where the occurrence counts calls of that op at that call site within that
module.  The call site is the innermost line of the user's code that ran the
op and, where that line is in a function the user's code called, the lines
that called it (``helpers.py:5 (called from test_x.py:10)``), up to this
package's or pytest's call of the user's code: a helper called once more on
one path is that call, not whichever call of it comes last.  Two runs are
aligned by identity, never by position, so an op that runs on one path only
(a fused kernel, a cast) does not shift the others.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (_TORCH_DIR + os.sep, _OWN_DIR + os.sep)
_SKIP_FILES = ("contextlib.py", "functools.py", "<frozen")


def _package_dirs(*names: str) -> tuple[str, ...]:
    """The directories of those of the packages ``names`` that are imported."""
    paths = (getattr(sys.modules.get(name), "__file__", None) for name in names)
    return tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in paths if p)


#: Where the user's code was called from: the chain of callers stops there.
_CALLER_STOPS = (_OWN_DIR + os.sep, *_package_dirs("_pytest", "pluggy"))
#: Python's own library (unittest's runner, threading): left out of the chain, so a
#: trace keeps its identities across Python versions; installed packages are kept.
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

#: (op name, module path, call site "file:line", occurrence)
Identity = tuple[str, str, str, int]


@dataclass
class OpRecord:
    """One op call: what ran, where, and copies of its tensor inputs and outputs."""

    index: int
    identity: Identity
    func: Any
    args: Any
    kwargs: Any
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    backward: bool
    made: tuple[bool, ...] = ()
    """Per tensor input: whether an earlier op of the run made its memory (a Python-made
    tensor, a NumPy buffer, a parameter: not); empty where that was not recorded."""

    @property
    def name(self) -> str:
        """The op's name, ``aten::mm``."""
        return self.identity[0]

    @property
    def module(self) -> str:
        """The module path (``Net.encoder.0``), ``""`` outside any module."""
        return self.identity[1]

    @property
    def site(self) -> str:
        """The user code's ``file:line`` that called the op."""
        return self.identity[2]


def op_name(func: Any) -> str:
    """``aten.mm.default`` -> ``aten::mm``; a custom op keeps its namespace."""
    schema = getattr(func, "_schema", None)
    name = getattr(schema, "name", None)
    if isinstance(name, str):
        return name
    return str(func)


def call_site() -> str:
    """Where the user's code ran the op: ``file:line`` and the user's calls that led there.

    The innermost frame outside torch, this package and contextlib, then, in
    ``(called from a, from b)``, each frame further out that is neither torch's
    nor Python's own library, up to the first frame of this package, pytest or
    pluggy (the call of the user's code).
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if (
            not filename.startswith(_SKIP_DIRS)
            and not filename.endswith(_SKIP_FILES)
            and "<frozen" not in filename
        ):
            site = f"{filename}:{frame.f_lineno}"
            callers = _callers(frame.f_back)
            return f"{site} (called from {', from '.join(callers)})" if callers else site
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


def _callers(frame: Any) -> list[str]:
    """``file:line`` of the user's frames from ``frame`` outward, to the call of its code."""
    found: list[str] = []
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_CALLER_STOPS):
            break
        if not (
            filename.startswith(_TORCH_DIR + os.sep)
            or filename.endswith(_SKIP_FILES)
            or "<frozen" in filename
            or (filename.startswith(_STDLIB) and not any(d in filename for d in _INSTALLED))
        ):
            found.append(f"{filename}:{frame.f_lineno}")
        frame = frame.f_back
    return found


def _memory_of(t: torch.Tensor) -> int:
    """The address of ``t``'s storage (0 for a tensor without one)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # sparse, nested, or a tensor subclass without storage
        return 0


def _copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


def tensors_of(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def _written(func: Any) -> tuple[list[int], list[str]]:
    """Positions and names of the arguments ``func``'s schema says it writes (cached)."""
    found = _WRITTEN.get(id(func))
    if found is None or found[0] is not func:
        arguments = getattr(getattr(func, "_schema", None), "arguments", ())
        written = [
            (i, arg.name)
            for i, arg in enumerate(arguments)
            if arg.alias_info is not None and arg.alias_info.is_write
        ]
        found = _WRITTEN[id(func)] = (func, [i for i, _ in written], [n for _, n in written])
    return found[1], found[2]


#: id(op) -> (the op, written positions, written names); the op is held, so its id stays its own
_WRITTEN: dict[int, tuple[Any, list[int], list[str]]] = {}


def results_of_call(func: Any, args: Any, kwargs: Any, out: Any) -> list[torch.Tensor]:
    """The tensors an op call produced: its outputs, then the arguments it wrote in place.

    An in-place op that returns nothing (a custom op with ``mutates_args``) still
    produces its written arguments: comparing only what it returns would pass it by.
    """
    outputs = tensors_of(out)
    positions, names = _written(func)
    written = [args[i] for i in positions if i < len(args)]
    written += [kwargs[n] for n in names if n in kwargs]
    for t in tensors_of(written):
        if not any(t is o for o in outputs):
            outputs.append(t)
    return outputs


def copy_tree(tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    copies = [_copy(x) if isinstance(x, torch.Tensor) else x for x in leaves]
    return spec.unflatten(copies)


@dataclass
class _ModuleStack:
    names: dict[int, str] = field(default_factory=dict)
    stack: list[str] = field(default_factory=list)

    def enter(self, module: torch.nn.Module) -> None:
        if id(module) not in self.names:
            root = type(module).__name__
            for qual, sub in module.named_modules():
                self.names.setdefault(id(sub), f"{root}.{qual}" if qual else root)
        self.stack.append(self.names[id(module)])

    def leave(self) -> None:
        if self.stack:
            self.stack.pop()

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""


class PathRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records one kernel path: a dispatch mode that keeps an :class:`OpRecord` per op call.

    ``keep`` decides whether tensors are copied; ``retain=False`` hands the
    copies to ``on_op`` only (a trace keeps a sketch) and keeps no tensors.
    """

    def __init__(
        self,
        modules: _ModuleStack,
        *,
        keep: bool = True,
        on_op: Callable[[OpRecord], None] | None = None,
        retain: bool = True,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.records: list[OpRecord] = []
        self._modules = modules
        self._counts: dict[tuple[str, str, str], int] = {}
        self._keep = keep
        self._on_op = on_op
        self._retain = retain
        self.in_backward = False
        # The memory the run's ops wrote: per storage address, the (weakly held) outputs
        # there. An address counts only while one of them lives, since the allocator hands
        # freed memory to the next tensor, torch.tensor(flag)'s included.
        self._made: dict[int, list[weakref.ref[torch.Tensor]]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = op_name(func)
        module = self._modules.current
        site = "<backward>" if self.in_backward else call_site()
        key = (name, module, site)
        occurrence = self._counts.get(key, 0)
        self._counts[key] = occurrence + 1
        from_ops = tuple(self._made_by_ops(t) for t in tensors_of((args, kwargs)))
        if self._keep:
            args_copy, kwargs_copy = copy_tree(args), copy_tree(kwargs)
        else:
            args_copy, kwargs_copy = args, kwargs
        out = func(*args, **kwargs)
        outputs = results_of_call(func, args, kwargs, out)
        for t in outputs:
            self._note_made(t)
        record = OpRecord(
            index=len(self.records),
            identity=(name, module, site, occurrence),
            func=func,
            args=args_copy,
            kwargs=kwargs_copy,
            inputs=tensors_of((args_copy, kwargs_copy)),
            outputs=[_copy(t) for t in outputs] if self._keep else outputs,
            backward=self.in_backward,
            made=from_ops,
        )
        if self._on_op is not None:
            self._on_op(record)
        if self._keep and self._retain:
            self.records.append(record)
        else:
            self.records.append(
                OpRecord(record.index, record.identity, func, None, None, [], [], record.backward)
            )
        return out

    def _made_by_ops(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s memory is an earlier op's output (an input without storage: yes)."""
        address = _memory_of(t)
        refs = self._made.get(address, ())
        return address == 0 or any(r() is not None for r in refs)

    def _note_made(self, t: torch.Tensor) -> None:
        address = _memory_of(t)
        if address == 0:
            return
        refs = [r for r in self._made.get(address, ()) if r() is not None]
        if not any(r() is t for r in refs):
            refs.append(weakref.ref(t))
        self._made[address] = refs


@contextmanager
def module_tracking() -> Iterator[_ModuleStack]:
    """Track the module path of every forward call for the ``with`` block."""
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    modules = _ModuleStack()

    def pre(module: torch.nn.Module, _args: Any) -> None:
        modules.enter(module)

    def post(_module: torch.nn.Module, _args: Any, _out: Any) -> None:
        modules.leave()

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield modules
    finally:
        for handle in handles:
            handle.remove()


if TYPE_CHECKING:
    from pytest_backends.recorder import Recorder

    _: type[Recorder] = PathRecorder
