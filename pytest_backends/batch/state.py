"""The state every run of a batch-invariance check starts from: RNGs, module buffers, inputs.

Importing this module does not import torch; :class:`State` does.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from pytest_backends.batch.runs import Inputs

__all__ = ["State"]


def _modules(fn: object) -> list[Any]:
    """The ``nn.Module`` objects ``fn`` can reach directly: itself, its closure, its globals."""
    import torch

    found: dict[int, Any] = {}
    seen: set[int] = set()

    def visit(obj: object, depth: int) -> None:
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            found[id(obj)] = obj
            return
        inner = getattr(obj, "__self__", None)
        if inner is not None:
            visit(inner, depth + 1)
        func = getattr(obj, "func", None)  # functools.partial
        if func is not None:
            visit(func, depth + 1)
            for a in (*getattr(obj, "args", ()), *getattr(obj, "keywords", {}).values()):
                visit(a, depth + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                visit(cell.cell_contents, depth + 1)
        code = getattr(obj, "__code__", None)
        glob = getattr(obj, "__globals__", None)
        if code is not None and isinstance(glob, dict):
            for name in code.co_names:
                value = glob.get(name)
                if isinstance(value, torch.nn.Module):
                    found[id(value)] = value
        for default in getattr(obj, "__defaults__", None) or ():
            visit(default, depth + 1)

    visit(fn, 0)
    return list(found.values())


def _numpy_bytes(np: Any) -> bytes | None:
    """The bytes of NumPy's global MT19937 state (key and position), or None if not readable.

    Any draw from the global generator changes them; a Gaussian cached from
    an earlier draw is excluded by the caller (it does not show here).
    """
    import ctypes

    try:
        generator = np.random.mtrand._rand._bit_generator
        if type(generator).__name__ != "MT19937":
            return None
        return ctypes.string_at(generator.ctypes.state_address, 624 * 4 + 4)
    except Exception:  # another NumPy layout: always set the state
        return None


class State:
    """What every run starts from: the global RNGs, the modules' buffers and modes, the inputs.

    :meth:`restore` puts back what the previous run changed: the RNGs, the
    buffers (BatchNorm's running statistics and ``num_batches_tracked``), a
    module's ``training`` flag when it was switched, an input copy that a
    run wrote in place.
    """

    def __init__(self, fn: object, inputs: Inputs | None = None) -> None:
        import random
        import sys

        import torch

        self.inputs = inputs
        self._torch = torch.default_generator.get_state()
        self._cuda = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
            else None
        )
        self._python = random.getstate()
        np = sys.modules.get("numpy")
        self._numpy = np.random.get_state() if np is not None else None
        self._numpy_bytes = _numpy_bytes(np) if self._numpy is not None else None
        if self._numpy is not None and self._numpy[3]:  # a cached Gaussian: no cheap probe
            self._numpy_bytes = None
        self._buffers: list[tuple[Any, str, torch.Tensor, int, torch.Tensor]] = []
        self._modes: list[tuple[Any, bool]] = []
        for module in _modules(fn):
            for sub in module.modules():
                self._modes.append((sub, sub.training))
                for name, buf in sub._buffers.items():
                    if buf is not None:
                        self._buffers.append((sub, name, buf, buf._version, buf.detach().clone()))

    def restore(self) -> None:
        """Put the RNGs, the modules' buffers and modes and the inputs back."""
        import random
        import sys

        import torch

        torch.default_generator.set_state(self._torch)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)
        random.setstate(self._python)
        if self._numpy is not None:
            np = sys.modules["numpy"]
            # Setting NumPy's state costs ~40 us; reading its generator's bytes ~1 us.
            if self._numpy_bytes is None or _numpy_bytes(np) != self._numpy_bytes:
                np.random.set_state(self._numpy)
        if self._buffers:
            # Always copied back: kernels such as native_batch_norm update running
            # statistics in place without moving the tensor's version.
            with torch.no_grad():
                for module, name, buf, _, saved in self._buffers:
                    if module._buffers.get(name) is not buf:
                        module._buffers[name] = buf
                    buf.copy_(saved)
        for module, training in self._modes:
            if module.training != training:
                module.train(training)
        if self.inputs is not None:
            self.inputs.refresh()
