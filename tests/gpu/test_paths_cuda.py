"""Kernel paths on a GPU: TF32 on/off matmuls agree within bounds, a planted op is named."""

from __future__ import annotations

import pytest
import torch

from pytest_backends import PathsDisagreeError, assert_paths_agree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tf32_active() -> bool:
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if precision is not None:
        return str(precision) == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


@torch.library.custom_op("paths_gpu_tests::bump", mutates_args=())
def bump(x: torch.Tensor) -> torch.Tensor:
    """Scales by 1.25 only while TF32 matmuls are allowed: a planted path-dependent op.

    A relative change, far beyond any TF32 bound: an absolute 1e-2 lay inside the
    bound of a 512-long TF32 dot product on the H200.
    """
    return x * (1.25 if _tf32_active() else 1.0)


bump.register_autograd(lambda ctx, grad: grad)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b)


def _planted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = torch.relu(a @ b)
    return bump(y)  # PLANTED


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(64, 512, device="cuda", generator=gen, requires_grad=True)
    b = torch.randn(512, 32, device="cuda", generator=gen, requires_grad=True)
    return a, b


def test_tf32_on_and_off_matmuls_agree_within_bounds() -> None:
    assert_paths_agree(_mm, *_inputs(), axes=["tf32"])


def test_a_planted_op_after_a_tf32_matmul_is_named() -> None:
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(_planted, *_inputs(), axes=["tf32"])
    d = info.value.divergence
    assert d is not None and d.op == "paths_gpu_tests::bump"
    assert d.site.endswith(f"{__file__.rsplit('/', 1)[-1]}:{_line()}")


def _line() -> int:
    with open(__file__) as fh:
        return next(i for i, s in enumerate(fh, 1) if s.rstrip().endswith("# PLANTED"))
