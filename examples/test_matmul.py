"""A matmul-heavy layer across fp32 precision modes (oneDNN on CPU, TF32 on CUDA)."""

from __future__ import annotations

import pytest
import torch
from example_models import GatedMLP, reference

# fp32 matmul error against float64: IEEE ~1e-6; bf16 inputs ~2e-3; TF32 ~3e-4
_TOLERANCE = {"ieee": 1e-4, "bf16": 3e-2, "tf32": 5e-3}


def _mode(axes) -> str:
    if axes.get("tf32") == "on":
        return "tf32"
    return axes.get("mkldnn_precision", "ieee")


@pytest.mark.backends("mkldnn_precision")
def test_gated_mlp_on_cpu(backend_config, backend_device):
    torch.manual_seed(0)
    layer = GatedMLP().to(backend_device)
    x = torch.randn(64, 256, device=backend_device)
    with torch.no_grad():
        out = layer(x)
    tol = _TOLERANCE[_mode(backend_config.axes)]
    torch.testing.assert_close(out.double().cpu(), reference(layer, x), rtol=tol, atol=tol)


@pytest.mark.backends("tf32", "rpr", device="cuda")
def test_gated_mlp_on_gpu(backend_config, backend_device):
    torch.manual_seed(0)
    layer = GatedMLP().to(backend_device)
    x = torch.randn(64, 256, device=backend_device)
    with torch.no_grad():
        out = layer(x)
    tol = _TOLERANCE[_mode(backend_config.axes)]
    torch.testing.assert_close(out.double().cpu(), reference(layer, x), rtol=tol, atol=tol)
