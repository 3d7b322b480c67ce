"""flag_effect: does a flag change an op's output on this machine?"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pytest_backends import FlagEffect, flag_effect, override_flags, snapshot_flags


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _precision() -> object:
    return snapshot_flags()["mkldnn.matmul.fp32_precision"]


def _inputs(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=gen) for shape in shapes]


def test_cuda_flag_has_no_effect_on_a_cpu_matmul() -> None:
    a, b = _inputs((128, 512), (512, 128))
    result = flag_effect(lambda: a @ b, "cuda.matmul.allow_tf32", [False, True])
    assert isinstance(result, FlagEffect)
    assert result.verdict == "no effect"
    assert not result and not result.has_effect
    assert result.groups == ((False, True),)
    assert result.max_abs_diff == (0.0, 0.0)
    assert "no effect" in str(result) and "cuda.matmul.allow_tf32" in str(result)


@pytest.mark.parametrize(
    ("flag", "op", "shapes"),
    [
        ("mkldnn.matmul.fp32_precision", torch.matmul, ((256, 1024), (1024, 256))),
        ("mkldnn.conv.fp32_precision", F.conv2d, ((8, 16, 32, 32), (32, 16, 3, 3))),
    ],
)
def test_onednn_precision_verdict_agrees_with_a_direct_comparison(
    flag: str, op: Callable[..., torch.Tensor], shapes: tuple[tuple[int, ...], ...]
) -> None:
    inputs = _inputs(*shapes)

    def fn() -> torch.Tensor:
        return op(*inputs)

    with override_flags({flag: "ieee"}):
        ieee = fn()
    with override_flags({flag: "bf16"}):
        bf16 = fn()
    differs = not _bitwise_equal(ieee, bf16)
    result = flag_effect(fn, flag, ["ieee", "bf16"])
    assert result.reproducible
    assert result.has_effect == differs, str(result)
    assert result.verdict == ("effect" if differs else "no effect")
    if differs:
        assert result.groups == (("ieee",), ("bf16",))
        expected_diff = float((ieee - bf16).abs().max())
        assert result.max_abs_diff[1] == pytest.approx(expected_diff)
        assert "effect: outputs differ" in str(result)


def test_effect_when_the_flag_selects_another_kernel() -> None:
    # disabling oneDNN changes the convolution kernel for this shape
    x, w = _inputs((8, 16, 32, 32), (32, 16, 3, 3))

    def fn() -> torch.Tensor:
        return F.conv2d(x, w)

    with override_flags({"mkldnn.enabled": True}):
        on = fn()
    with override_flags({"mkldnn.enabled": False}):
        off = fn()
    result = flag_effect(fn, "mkldnn.enabled", [True, False])
    assert result.has_effect == (not _bitwise_equal(on, off))


def test_groups_values_with_identical_outputs() -> None:
    a, b = _inputs((64, 256), (256, 64))
    result = flag_effect(lambda: (a @ b, torch.get_num_threads()), "num_threads", [1, 2, 1])
    # the thread count is part of the output here, so 1 and 2 always differ
    assert result.has_effect
    assert result.groups == ((1, 1), (2,))
    assert result.max_abs_diff[2] == 0.0


def test_not_reproducible_output_is_reported() -> None:
    def noisy() -> torch.Tensor:
        return torch.randn(16)

    result = flag_effect(noisy, "cuda.matmul.allow_tf32", [False, True])
    assert not result.reproducible
    assert result.verdict == "not reproducible"
    assert not result.has_effect
    assert "not reproducible" in str(result)


def test_nan_and_negative_zero_compare_by_bits() -> None:
    same = torch.tensor([float("nan"), -0.0, 1.0])
    assert not flag_effect(lambda: same.clone(), "mkldnn.matmul.fp32_precision", ["ieee", "bf16"])

    def sign_of_zero() -> torch.Tensor:
        ieee = _precision() in ("ieee", "none")
        return torch.tensor([0.0 if ieee else -0.0])

    assert flag_effect(sign_of_zero, "mkldnn.matmul.fp32_precision", ["ieee", "bf16"])


def test_flags_are_restored_and_bad_input_runs_nothing() -> None:
    calls = []

    def fn() -> torch.Tensor:
        calls.append(_precision())
        return torch.zeros(1)

    before = snapshot_flags()
    flag_effect(fn, "mkldnn.matmul.fp32_precision", ["bf16", "ieee"])
    assert calls == ["bf16", "ieee", "bf16"]  # the last call re-checks reproducibility
    assert snapshot_flags() == before
    calls.clear()
    with pytest.raises(ValueError, match="unknown backend flag"):
        flag_effect(fn, "mkldnn.matmul.precision", ["ieee", "bf16"])
    with pytest.raises(ValueError, match="invalid value"):
        flag_effect(fn, "mkldnn.matmul.fp32_precision", ["ieee", "fp8"])
    with pytest.raises(ValueError, match="two distinct values"):
        flag_effect(fn, "mkldnn.matmul.fp32_precision", ["ieee"])
    with pytest.raises(ValueError, match="two distinct values"):
        flag_effect(fn, "cuda.matmul.allow_fp16_reduced_precision_reduction", [True, (True, True)])
    # A string is one value, not a list of one-letter values; a tensor is not ``fn``.
    with pytest.raises(TypeError, match="values must be a list of the values to compare"):
        flag_effect(fn, "mkldnn.matmul.fp32_precision", "ieee")
    with pytest.raises(TypeError, match="fn must be a callable taking no arguments, got Tensor"):
        flag_effect(torch.zeros(3), "mkldnn.matmul.fp32_precision", ["ieee", "bf16"])  # type: ignore[arg-type]
    assert calls == []
