"""The demo's one planted bug: a custom op whose result changes from call to call.

``demo::jitter`` stands for a real nondeterministic kernel (an atomic-add
reduction on a GPU, a racy parallel scatter on a CPU): it adds an amount that
grows with every call, so two runs of the same computation differ.
"""

from __future__ import annotations

import itertools

import torch

_calls = itertools.count()


@torch.library.custom_op("demo::jitter", mutates_args=())
def jitter(x: torch.Tensor) -> torch.Tensor:
    """``x`` plus a tiny amount that changes on every call."""
    return x + next(_calls) * 1e-6


@jitter.register_fake
def _jitter_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


jitter.register_autograd(lambda ctx, grad: grad)
