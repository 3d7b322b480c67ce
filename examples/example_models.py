"""Three small models whose kernels depend on torch backend flags.

* :class:`ConvNet` - 3x3 convolutions: oneDNN, NNPACK or the native
  ``slow_conv2d`` kernels on the CPU; cuDNN or native kernels on CUDA.
* :class:`AttentionBlock` - a transformer block around
  ``scaled_dot_product_attention``: the math, flash, memory-efficient or
  cuDNN SDPA kernel.
* :class:`GatedMLP` - matmul-heavy: TF32 on CUDA, oneDNN bf16/TF32 on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    """Two 3x3 conv layers, batch norm, pooling and a linear head."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class AttentionBlock(nn.Module):
    """Pre-norm self-attention followed by an MLP, both residual."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class GatedMLP(nn.Module):
    """A SwiGLU feed-forward layer: three large matmuls."""

    def __init__(self, dim: int = 256, hidden: int = 1024) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def reference(model: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """The model's output in float64 on the CPU with torch's default flags: the ground truth."""
    twin = type(model)()
    twin.load_state_dict(model.state_dict())
    twin = twin.to(device="cpu", dtype=torch.float64).eval()
    with torch.no_grad():
        return twin(*(t.detach().to("cpu", torch.float64) for t in inputs))
