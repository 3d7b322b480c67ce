"""Planted nondeterminism on CPU: custom ops whose results depend on a call counter.

``pbtest::noisy(x)`` returns ``x`` plus an amount that changes on every call.
``pbtest::spread(x, m)`` copies ``x`` into ``m`` columns; its backward,
``pbtest::spread_backward``, sums the upstream gradient over the columns in
an order that rotates on every call. Float32 rounding makes that sum differ
bitwise between calls for a random upstream gradient, but not for a constant
one (all-ones from ``.sum()``), whose partial sums are the same in any order.

The tests load this file as a module, and as a ``conftest.py`` in pytester runs.
"""

from __future__ import annotations

import itertools

import torch

_noisy_calls = itertools.count()
_backward_calls = itertools.count()


@torch.library.custom_op("pbtest::noisy", mutates_args=())
def noisy(x: torch.Tensor) -> torch.Tensor:
    """``x`` plus ``1e-3`` times the number of earlier calls."""
    return x + next(_noisy_calls) * 1e-3


@noisy.register_fake
def _noisy_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _noisy_grad(ctx: object, grad: torch.Tensor) -> torch.Tensor:
    return grad


noisy.register_autograd(_noisy_grad)


@torch.library.custom_op("pbtest::spread_backward", mutates_args=())
def spread_backward(grad: torch.Tensor) -> torch.Tensor:
    """Sum ``grad`` over its last dim, one column at a time, starting at a rotating column."""
    m = grad.shape[-1]
    start = next(_backward_calls) % m
    acc = torch.zeros(grad.shape[:-1], dtype=grad.dtype, device=grad.device)
    for j in range(m):
        acc = acc + grad[..., (start + j) % m]
    return acc


@spread_backward.register_fake
def _spread_backward_fake(grad: torch.Tensor) -> torch.Tensor:
    return grad.new_empty(grad.shape[:-1])


@torch.library.custom_op("pbtest::spread", mutates_args=())
def spread(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x`` repeated into a new last dim of size ``m``."""
    return x.unsqueeze(-1).expand(*x.shape, m).clone()


@spread.register_fake
def _spread_fake(x: torch.Tensor, m: int) -> torch.Tensor:
    return x.new_empty((*x.shape, m))


def _spread_grad(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    return torch.ops.pbtest.spread_backward(grad), None


spread.register_autograd(_spread_grad)
