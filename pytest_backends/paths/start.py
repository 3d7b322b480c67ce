"""The state every configuration's run of ``assert_paths_agree`` starts from.

A function compared across configurations may change state that it also
reads: a training step steps its optimizer, so the second configuration
would start from other weights and its results would differ with no kernel
to blame. Before each run the state ``fn`` reaches is put back as it was
when the comparison began, and after the last run too:

* the parameters, buffers, gradients and ``training`` flags of every module
  ``fn`` reaches (and their submodules), copied back in place, so an
  optimizer's references stay valid;
* the state of every optimizer it reaches (momentum buffers, step counts,
  learning rates), loaded from a copy;
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

import torch

from pytest_backends.reach import reached

__all__ = ["StartState"]


class StartState:
    """The state ``fn`` may change, taken when made; :meth:`restore` puts it back."""

    def __init__(self, fn: object) -> None:
        found = reached(fn, (torch.nn.Module, torch.optim.Optimizer), through_calls=True)
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
        self._optimizers = [
            (o, copy.deepcopy(o.state_dict()))
            for o in found
            if isinstance(o, torch.optim.Optimizer)
        ]
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
        for optimizer, state in self._optimizers:
            # A copy each time: loading may keep the tensors it is given.
            optimizer.load_state_dict(copy.deepcopy(state))
        random.setstate(self._python)
        if self._numpy is not None:
            np, state = self._numpy
            np.random.set_state(state)
