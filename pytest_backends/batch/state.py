"""The state every run of a batch-invariance check starts from: RNGs, module buffers, inputs.

Importing this module does not import torch; :class:`State` does.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_backends.reach import reached

if TYPE_CHECKING:
    import torch

    from pytest_backends.batch.runs import Inputs

__all__ = ["State"]


def _modules(fn: object) -> list[Any]:
    """The ``nn.Module`` objects ``fn`` can reach directly: itself, its closure, its globals."""
    import torch

    return reached(fn, (torch.nn.Module,))


def _submodules(roots: list[Any]) -> list[Any]:
    """Every module under ``roots`` (themselves included), each once."""
    seen: dict[int, Any] = {}
    stack = list(roots)
    pop, push = stack.pop, stack.extend
    while stack:
        module = pop()
        if module is None or id(module) in seen:  # None: an empty slot of a container
            continue
        seen[id(module)] = module
        children = module._modules
        if children:
            push(children.values())
    return list(seen.values())


# Probes of the global generators' state: reading a few KiB of their memory (well under a
# microsecond) tells whether a run drew from them, where reading their state through their
# Python API costs 8 us (random) and 30 us (NumPy) and setting it 2.5 us and 33 us. Each
# layout is confirmed once per process against the public API; where it is not as
# expected, the state is read and set through the API.
_MT_BYTES = 624 * 4 + 4  # a Mersenne Twister's key and position


def _python_layout(inst: Any) -> int | None:
    """Where CPython's ``random.Random`` keeps its index and key in ``inst``, or None."""
    import sys

    offset = object.__basicsize__  # the object header; index and key follow
    try:
        if sys.implementation.name != "cpython" or type(inst).__basicsize__ < offset + _MT_BYTES:
            return None
        version, internal, _ = inst.getstate()
        raw = ctypes.string_at(id(inst) + offset, _MT_BYTES)
        index, key = struct.unpack_from("=i", raw)[0], struct.unpack_from("=624I", raw, 4)
        if version != 3 or tuple(internal) != (*key, index):
            return None
    except Exception:
        return None
    return offset


def _numpy_layout(np: Any) -> tuple[int, int] | None:
    """Where NumPy's legacy ``RandomState`` keeps its cached Gaussian (flag, value), or None.

    Found on a private generator of the same type: the one offset whose bytes
    follow ``get_state()``'s flag and value through three draws.
    """
    try:
        kind = type(np.random.mtrand._rand)
        gen = kind(12345)
        size = kind.__basicsize__

        def state() -> tuple[int, float]:
            s = gen.get_state()
            return int(s[3]), float(s[4])

        gen.standard_normal()
        flag, value = state()
        if flag != 1:
            return None
        raw = ctypes.string_at(id(gen), size)
        packed = struct.pack("=d", value)
        spots = [o for o in range(8, size - 7, 8) if raw[o : o + 8] == packed]
        if len(spots) != 1:
            return None
        at = spots[0]
        flag_at = at - 8
        for _ in range(3):
            gen.standard_normal()
            flag, value = state()
            raw = ctypes.string_at(id(gen), size)
            if struct.unpack_from("=i", raw, flag_at)[0] != flag or (
                flag and struct.unpack_from("=d", raw, at)[0] != value
            ):
                return None
        return flag_at, at
    except Exception:
        return None


_ARRAYS: dict[tuple[int, int], Any] = {}


def _memory(address: int, size: int) -> Any:
    """An array over ``size`` bytes at ``address``: its ``raw`` reads them (one copy).

    The arrays are kept per address: one is only a window on the memory there,
    and the callers take the address from the live generator each time.
    """
    key = (address, size)
    array = _ARRAYS.get(key)
    if array is None:
        if len(_ARRAYS) > 64:
            _ARRAYS.clear()
        array = _ARRAYS[key] = (ctypes.c_char * size).from_address(address)
    return array


_LAYOUTS: dict[str, Any] = {}  # per generator kind, found once per process


def _layout(name: str, find: Any, arg: Any) -> Any:
    if name not in _LAYOUTS:
        _LAYOUTS[name] = find(arg)
    return _LAYOUTS[name]


class _PythonRandom:
    """The global ``random`` generator: probed each run, set only when a run drew from it."""

    def __init__(self) -> None:
        import random

        self.inst = random.getstate.__self__  # type: ignore[attr-defined]
        offset = _layout("random", _python_layout, self.inst)
        self.memory = None if offset is None else _memory(id(self.inst) + offset, _MT_BYTES)
        self.gauss = self.inst.gauss_next
        self.raw = b"" if self.memory is None else self.memory.raw
        self.state: Any = self.inst.getstate() if self.memory is None else None

    def changed(self) -> bool:
        """Whether the state may differ from the one at the start (True when not probed)."""
        return (
            self.memory is None
            or self.memory.raw != self.raw
            or self.inst.gauss_next is not self.gauss
        )

    def reset(self) -> None:
        """Set the state of the start."""
        if self.state is None:
            index, key = (
                struct.unpack_from("=i", self.raw)[0],
                struct.unpack_from("=624I", self.raw, 4),
            )
            self.state = (3, (*key, index), self.gauss)
        self.inst.setstate(self.state)


class _NumpyRandom:
    """NumPy's global legacy generator: probed each run, set only when a run drew from it."""

    def __init__(self, np: Any) -> None:
        self.np = np
        self.rand = np.random.mtrand._rand
        self.state: Any = None
        self.bit_generator = _bits_of(self.rand)
        # The generator's key and position; the cached Gaussian's flag, then its value.
        self.memory: tuple[Any, Any] | None = None
        try:
            generator = self.rand._bit_generator
            if type(generator).__name__ == "MT19937":
                self.generator = generator  # keeps the probed memory alive
                layout = _layout("numpy", _numpy_layout, np)
                if layout is not None and layout[1] == layout[0] + 8:
                    self.memory = (
                        _memory(int(generator.ctypes.state_address), _MT_BYTES),
                        _memory(id(self.rand) + layout[0], 16),
                    )
        except Exception:  # another NumPy layout: read and set through the API
            self.memory = None
        if self.memory is None:
            self.state = np.random.get_state()
            self.raw: tuple[bytes, bytes] = (b"", b"")
        else:
            self.raw = (self.memory[0].raw, self.memory[1].raw)

    def fresh(self) -> _NumpyRandom:
        """A probe of the same generator holding its state now (the layout found once)."""
        new = _NumpyRandom.__new__(_NumpyRandom)
        new.__dict__.update(self.__dict__)
        if self.memory is None:
            new.state = self.np.random.get_state()
        else:
            new.state = None
            new.raw = (self.memory[0].raw, self.memory[1].raw)
        return new

    def changed(self) -> bool:
        """Whether the state may differ from the one at the start (True when not probed)."""
        memory = self.memory
        return memory is None or memory[0].raw != self.raw[0] or memory[1].raw != self.raw[1]

    def reset(self) -> None:
        """Set the state of the start."""
        if self.state is None:  # the probe's bytes are the whole state
            (raw, gauss), np = self.raw, self.np
            key = np.frombuffer(raw[: 624 * 4], dtype=np.uint32).copy()
            pos = struct.unpack_from("=i", raw, 624 * 4)[0]
            flag = struct.unpack_from("=i", gauss)[0]
            value = struct.unpack_from("=d", gauss, 8)[0]
            self.state = ("MT19937", key, pos, flag, value)
        self.np.random.set_state(self.state)


class State:
    """What every run starts from: the global RNGs, the modules' buffers and modes, the inputs.

    :attr:`restore` puts back what the previous run changed: the RNGs, the
    buffers (BatchNorm's running statistics and ``num_batches_tracked``), a
    module's ``training`` flag when it was switched, an input copy that a
    run wrote in place. The Python and NumPy generators are set only when
    their state changed (probed in their memory); torch's costs less to set
    than to read.
    """

    #: Put back the RNGs (global, passed as arguments), modules' buffers and modes, inputs.
    #: A function made once per state, with everything it reads bound in it: it runs
    #: before every run of a check, where each attribute lookup costs.
    restore: Callable[[], None]

    def __init__(self, fn: object, inputs: Inputs | None = None) -> None:
        import sys

        import torch

        self.inputs = inputs
        generator = torch.default_generator
        saved = generator.get_state()
        cuda = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
            else None
        )
        # Generators passed as arguments start every run where they were, as the global ones do.
        given = [
            (g, g.get_state())
            for g in (inputs.inputs if inputs is not None else ())
            if isinstance(g, torch.Generator)
        ]
        np = sys.modules.get("numpy")
        buffers: list[tuple[Any, str, torch.Tensor, torch.Tensor]] = []
        # (module, its attributes, its training flag): the flag read without the class lookup
        modes: list[tuple[Any, dict[str, Any], bool]] = []
        for sub in _submodules(_modules(fn)):
            modes.append((sub, sub.__dict__, sub.training))
            if sub._buffers:
                for name, buf in sub._buffers.items():
                    if buf is not None:
                        buffers.append((sub, name, buf, buf.detach().clone()))
        self.restore = _restorer(
            generator.set_state,
            saved,
            cuda,
            given,
            _PythonRandom(),
            _numpy_random(np) if np is not None else None,
            buffers,
            modes,
            inputs,
        )


def _numpy_random(np: Any) -> _NumpyRandom:
    """A probe of NumPy's global generator: made once per generator, its state read each time."""
    rand = np.random.mtrand._rand
    cached = _NUMPY.get(id(rand))
    if cached is None or cached.rand is not rand or cached.bit_generator is not _bits_of(rand):
        _NUMPY.clear()  # holds the generator: its id is not reused while it is here
        cached = _NUMPY[id(rand)] = _NumpyRandom(np)
    return cached.fresh()


def _bits_of(rand: Any) -> Any:
    return getattr(rand, "_bit_generator", None)


_NUMPY: dict[int, _NumpyRandom] = {}


def _restorer(
    set_state: Callable[[Any], Any],
    saved: Any,
    cuda: Any,
    given: list[tuple[Any, Any]],
    python: _PythonRandom,
    numpy: _NumpyRandom | None,
    buffers: list[tuple[Any, str, torch.Tensor, torch.Tensor]],
    modes: list[tuple[Any, dict[str, Any], bool]],
    inputs: Inputs | None,
) -> Callable[[], None]:
    """:attr:`State.restore`, with what it reads bound as locals."""
    py_memory, py_raw, py_inst, py_gauss = python.memory, python.raw, python.inst, python.gauss
    np_key: Any = None
    np_gauss: Any = None
    if numpy is not None and numpy.memory is not None:
        np_key, np_gauss = numpy.memory
    np_raw_key, np_raw_gauss = numpy.raw if numpy is not None else (b"", b"")
    np_probed = np_key is not None
    # Input copies and the versions they were made (or last rewritten) at.
    copied = inputs.copied() if inputs is not None else []
    versions = inputs.versions if inputs is not None else []

    def restore() -> None:
        set_state(saved)
        if cuda is not None:
            import torch

            torch.cuda.set_rng_state_all(cuda)
        for generator, state in given:
            generator.set_state(state)
        if py_memory is None or py_memory.raw != py_raw or py_inst.gauss_next is not py_gauss:
            python.reset()
        if numpy is not None and (
            not np_probed or np_key.raw != np_raw_key or np_gauss.raw != np_raw_gauss
        ):
            numpy.reset()
        if buffers:
            import torch

            # Always copied back: kernels such as native_batch_norm update running
            # statistics in place without moving the tensor's version.
            with torch.no_grad():
                for module, name, buf, value in buffers:
                    if module._buffers.get(name) is not buf:
                        module._buffers[name] = buf
                    buf.copy_(value)
        for module, attributes, training in modes:
            if attributes.get("training") is not training:
                module.train(training)
        for i, copy in copied:
            if copy._version != versions[i]:
                inputs.refresh()  # type: ignore[union-attr]
                break

    return restore
