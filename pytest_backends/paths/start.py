"""The state every configuration's run of ``assert_paths_agree`` starts from.

A function compared across configurations may change state that it also
reads: a training step steps its optimizer, so the second configuration
would start from other weights and its results would differ with no kernel
to blame. Before each run the state ``fn`` reaches is put back as it was
when the comparison began, and after the last run too:

* the parameters, buffers, gradients and ``training`` flags of every module
  ``fn`` reaches (and their submodules), copied back in place, so an
  optimizer's references stay valid;
* the state of every optimizer, learning-rate scheduler and gradient scaler
  it reaches (momentum buffers, step counts, learning rates, a schedule's
  epoch), loaded from a copy through their own ``load_state_dict``;
* Python's and NumPy's global random generators (torch's are forked and
  seeded per run).

What ``fn`` reaches is found by :func:`~pytest_backends.reach.reached`:
itself, its closure, its defaults and globals, the helpers it calls and the
attributes of the user's objects there (a trainer holding a model and its
optimizer). Importing this module imports torch.
"""

from __future__ import annotations

import copy
import random
import sys
from typing import Any

import torch

from pytest_backends.reach import reached

__all__ = ["StartState"]


class StartState:
    """The state ``fn`` may change, taken when made; :meth:`restore` puts it back."""

    def __init__(self, fn: object) -> None:
        stateful = _stateful_kinds()
        found = reached(fn, (torch.nn.Module, *stateful), through_calls=True)
        modules: dict[int, torch.nn.Module] = {}
        for root in (m for m in found if isinstance(m, torch.nn.Module)):
            for module in root.modules():
                modules.setdefault(id(module), module)
        self._modes = [(m, m.training) for m in modules.values()]
        tensors: dict[int, torch.Tensor] = {}
        for module in modules.values():
            for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
                tensors.setdefault(id(t), t)
        self._values = [(t, t.detach().clone()) for t in tensors.values()]
        self._grads = [
            (t, None if t.grad is None else t.grad.detach().clone())
            for t in tensors.values()
            if isinstance(t, torch.nn.Parameter)
        ]
        # optimizers first: a scheduler's state is loaded after its optimizer's
        owners: list[Any] = [o for o in found if isinstance(o, stateful)]
        self._stateful: list[tuple[Any, Any]] = sorted(
            ((o, copy.deepcopy(o.state_dict())) for o in owners),
            key=lambda pair: not isinstance(pair[0], torch.optim.Optimizer),
        )
        self._python = random.getstate()
        np = sys.modules.get("numpy")
        self._numpy = (np, np.random.get_state()) if np is not None else None

    def restore(self) -> None:
        """Put the state back as it was when this object was made."""
        with torch.no_grad():
            for t, value in self._values:
                if t.shape == value.shape and t.dtype == value.dtype:
                    t.copy_(value)
                else:  # fn replaced the tensor's data (``p.data = ...``)
                    t.data = value.clone()
        for p, grad in self._grads:
            p.grad = None if grad is None else grad.clone()
        for module, training in self._modes:
            if module.training is not training:
                module.train(training)
        for owner, state in self._stateful:
            # A copy each time: loading may keep the tensors it is given.
            owner.load_state_dict(copy.deepcopy(state))
        random.setstate(self._python)
        if self._numpy is not None:
            np, state = self._numpy
            np.random.set_state(state)


def _stateful_kinds() -> tuple[type, ...]:
    """Optimizers, learning-rate schedulers and gradient scalers, as this torch names them."""
    places = (
        (torch.optim, "Optimizer"),
        (torch.optim.lr_scheduler, "LRScheduler"),
        (torch.optim.lr_scheduler, "_LRScheduler"),
        (torch.optim.lr_scheduler, "ReduceLROnPlateau"),  # no LRScheduler before torch 2.2
        (getattr(torch, "amp", None), "GradScaler"),
        (torch.cuda.amp, "GradScaler"),
    )
    kinds = (getattr(module, name, None) for module, name in places)
    return tuple(dict.fromkeys(k for k in kinds if isinstance(k, type)))
