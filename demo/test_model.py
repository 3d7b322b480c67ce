"""A small model's tests, written with pytest-backends' API."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_backends import assert_close, assert_reproducible, reference


class Block(nn.Module):
    """Conv, norm and a linear head: the ops whose kernels the backend flags pick."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(4, 16)
        self.head = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm(self.conv(x)))
        return self.head(y.flatten(1))


@pytest.mark.backends("mkldnn", "deterministic")
def test_block_matches_float64(backend_config):
    """The bound follows the flags of each config (and the kernel that ran)."""
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        assert_close(block(x), reference(block, x), op="matmul", k=16 * 8 * 8)


def test_training_step_is_reproducible():
    """Forward and backward, bit for bit, five times."""
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(4, 3, 8, 8, requires_grad=True)
    assert_reproducible(block, x, runs=5)


def test_uses_the_jittery_op():
    """Passes on its own: its assertion holds whatever the op adds."""
    x = torch.randn(32)
    y = torch.ops.demo.jitter(x * 2)
    assert torch.allclose(y, x * 2, atol=1e-3)


def test_leaves_onednn_off():
    """Turns oneDNN off and forgets to turn it back on: every later test would run without it."""
    torch.backends.mkldnn.enabled = False
    assert torch.randn(2, 2).sum() is not None


def test_runs_after_the_leak():
    """Sees torch's defaults again: the plugin restored what the last test left."""
    assert torch.backends.mkldnn.enabled
