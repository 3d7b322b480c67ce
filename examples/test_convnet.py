"""A conv net across the CPU convolution paths (oneDNN, NNPACK, native) and cuDNN."""

from __future__ import annotations

import pytest
import torch
from example_models import ConvNet, reference


def _inputs(device: torch.device) -> torch.Tensor:
    # batch 16 so that NNPACK is eligible when oneDNN is off
    return torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(0)).to(device)


@pytest.mark.backends("mkldnn", "nnpack")
def test_convnet_matches_float64(backend_config, backend_device):
    torch.manual_seed(0)
    model = ConvNet().to(backend_device).eval()
    x = _inputs(backend_device)
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out.cpu().double(), reference(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.backends("mkldnn", "deterministic")
def test_convnet_backward_is_reproducible(backend_device):
    torch.manual_seed(0)
    model = ConvNet().to(backend_device)
    x = _inputs(backend_device)
    grads = []
    for _ in range(2):
        model.zero_grad()
        out = model(x)
        # a random upstream gradient: an all-ones one can hide reduction order
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
        out.backward(g)
        grads.append(model.conv1.weight.grad.clone())
    assert torch.equal(grads[0], grads[1])


@pytest.mark.backends("cudnn", "tf32", device="cuda")
def test_convnet_on_gpu(backend_config, backend_device):
    torch.manual_seed(0)
    model = ConvNet().to(backend_device).eval()
    x = _inputs(backend_device)
    with torch.no_grad():
        out = model(x)
    tf32 = backend_config.axes.get("tf32") == "on"
    tol = {"rtol": 5e-3, "atol": 5e-3} if tf32 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(out.cpu().double(), reference(model, x), **tol)
