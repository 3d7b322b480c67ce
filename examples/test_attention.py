"""An attention block across the SDPA kernels, on every device this machine has."""

from __future__ import annotations

import pytest
import torch
from example_models import AttentionBlock, reference


@pytest.mark.backends("sdpa", device=["cpu", "cuda"])
def test_attention_block_matches_float64(backend_device):
    torch.manual_seed(0)
    dtype = torch.float16 if backend_device.type == "cuda" else torch.float32
    block = AttentionBlock().to(backend_device, dtype).eval()
    x = torch.randn(4, 32, 64, device=backend_device, dtype=dtype)
    with torch.no_grad():
        out = block(x)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out.cpu().double(), reference(block, x), rtol=tol, atol=tol)


@pytest.mark.backends(sdpa=["math", "flash"])
def test_attention_block_input_gradient(backend_config):
    torch.manual_seed(0)
    block = AttentionBlock()
    x = torch.randn(2, 16, 64, requires_grad=True)
    # a random upstream gradient: an all-ones one can hide reduction order
    g = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    block(x).backward(g)
    # float64 twin under the same config: accurate whichever kernel runs
    twin = AttentionBlock().double()
    twin.load_state_dict(block.state_dict())
    x64 = x.detach().double().requires_grad_()
    twin(x64).backward(g.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)
