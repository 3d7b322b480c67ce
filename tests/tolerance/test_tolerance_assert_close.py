"""assert_close with model tolerances, the fp64 reference helper, and the failure message."""

from __future__ import annotations

import pytest
import torch

import pytest_backends
from pytest_backends import assert_close, override_flags, reference


def _bf16_rounded_matmul() -> tuple[torch.Tensor, torch.Tensor]:
    """A 256x1024 @ 1024x256 fp32 result from bf16-rounded inputs, and its fp64 reference.

    An honest stand-in for a oneDNN bf16 path, whichever path this CPU takes.
    """
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 1024, generator=gen)
    b = torch.randn(1024, 256, generator=gen)
    with override_flags({"mkldnn.matmul.fp32_precision": "ieee"}):
        actual = a.bfloat16().float() @ b.bfloat16().float()
    return actual, reference(torch.matmul, a, b)


def test_bf16_rounded_result_needs_the_bf16_bound() -> None:
    actual, expected = _bf16_rounded_matmul()
    rel = float((actual.double() - expected).norm() / expected.norm())
    assert 1e-3 < rel < 5e-3  # the size of a bf16 path's error
    with pytest.raises(AssertionError):
        torch.testing.assert_close(actual, expected.float())
    # kernel=False: the flag's worst case, whether or not this CPU computes in bf16
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        assert_close(actual, expected, k=1024, op="matmul", kernel=False)
    with override_flags({"mkldnn.matmul.fp32_precision": "ieee"}), pytest.raises(AssertionError):
        assert_close(actual, expected, k=1024, op="matmul", kernel=False)


def test_real_matmul_passes_under_every_onednn_precision() -> None:
    # whether this CPU takes the bf16 path or not, the bound covers what ran
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(128, 512, generator=gen), torch.randn(512, 96, generator=gen)
    expected = reference(torch.matmul, a, b)
    for value in ("ieee", "tf32", "bf16"):
        with override_flags({"mkldnn.matmul.fp32_precision": value}):
            assert_close(a @ b, expected, k=512, op="matmul")


def test_k_matters_for_an_ieee_matmul() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(64, 4096, generator=gen), torch.randn(4096, 64, generator=gen)
    expected = reference(torch.matmul, a, b)
    with override_flags({"mkldnn.matmul.fp32_precision": "ieee"}):
        actual = a @ b
        assert_close(actual, expected, k=4096, op="matmul")
        with pytest.raises(AssertionError, match="k=1 assumed"):
            assert_close(actual, expected, op="matmul")


def test_failure_message_states_the_model_inputs() -> None:
    actual, expected = _bf16_rounded_matmul()
    with override_flags({"mkldnn.matmul.fp32_precision": "ieee"}):
        with pytest.raises(AssertionError) as info:
            assert_close(actual, expected, k=1024, op="matmul")
        rtol, atol = pytest_backends.tolerance_for(torch.float32, op="matmul", k=1024)
    text = str(info.value)
    assert "Tensor-likes are not close" in text  # torch's own report is kept
    for part in (
        "float32 on cpu",
        "op='matmul'",
        "k=1024",
        "mkldnn.matmul.fp32_precision='ieee'",
        f"rtol={rtol:.3g}",
        f"atol={atol:.3g}",
    ):
        assert part in text, part


def test_explicit_rtol_or_atol_wins() -> None:
    actual, expected = _bf16_rounded_matmul()
    with override_flags({"mkldnn.matmul.fp32_precision": "ieee"}):
        assert_close(actual, expected, k=1024, op="matmul", rtol=0.0, atol=2.0)
        with pytest.raises(AssertionError, match="explicit atol=1e-09 replaced"):
            assert_close(actual, expected, k=1024, op="matmul", atol=1e-9)
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}), pytest.raises(AssertionError):
        assert_close(actual, expected, k=1024, op="matmul", rtol=0.0, atol=1e-6)


def test_user_message_is_kept() -> None:
    with pytest.raises(AssertionError, match=r"^custom$"):
        assert_close(torch.ones(3), torch.zeros(3), msg="custom")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be a positive int"),
        ({"k": -1}, "k must be a positive int"),
        ({"op": "convolution"}, "unknown op 'convolution'"),
        ({"rtol": -1.0}, "rtol must be a non-negative number"),
        ({"scale": -2.0}, "scale must be"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        assert_close(torch.ones(2), torch.ones(2), **kwargs)  # type: ignore[arg-type]


def test_nested_results_use_each_leafs_dtype() -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(32, 256, generator=gen), torch.randn(256, 32, generator=gen)
    exact = reference(torch.matmul, a, b)
    half = a.half() @ b.half()
    actual = {"fp32": a @ b, "pair": [half, 7]}
    expected = {"fp32": exact, "pair": [reference(torch.matmul, a.half(), b.half()), 7]}
    assert_close(actual, expected, k=256, op="matmul")
    # the fp16 leaf's error would fail an fp32 bound
    with pytest.raises(AssertionError, match=r"compared element: \['pair'\]\[0\]"):
        assert_close({"pair": [half.float(), 7]}, {"pair": [exact, 7]}, k=256, op="matmul")
    with pytest.raises(AssertionError, match="keys differ"):
        assert_close({"a": a}, {"b": a})


def test_reference_widens_tensors_modules_and_default_dtype() -> None:
    gen = torch.Generator().manual_seed(4)
    layer = torch.nn.Linear(64, 8)
    x = torch.randn(5, 64, generator=gen)
    expected = reference(layer, x)
    assert expected.dtype == torch.float64
    assert layer.weight.dtype == torch.float32  # the module itself is untouched
    assert_close(layer(x), expected, k=64, op="matmul")

    def make_and_scale(t: torch.Tensor, *, factor: float) -> torch.Tensor:
        return t * factor + torch.ones(t.shape)

    widened = reference(make_and_scale, x, factor=3.0)
    assert widened.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32
    ints = reference(lambda t, n: t + n[0], torch.arange(3), n=[torch.ones(1)])
    assert ints.dtype == torch.float64


@pytest.mark.parametrize("n", [10_000, 1_000_000])
def test_a_mean_gets_the_bound_of_a_mean_not_of_its_sum(n: int) -> None:
    """op="mean": the terms are x_i / k, so the bound shrinks with k where a sum's grows."""
    from pytest_backends import reference, tolerance_for

    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    m = x.mean()
    exact = reference(torch.mean, x)
    assert_close(m, exact, k=n, op="mean")
    for wrong in (-m, 2 * m, m * 1.01):
        with pytest.raises(AssertionError):
            assert_close(wrong, exact, k=n, op="mean")
    mean = tolerance_for(torch.float32, op="mean", k=n)
    assert mean.atol == tolerance_for(torch.float32, op="reduction", k=n, scale=1 / n).atol
    assert mean.atol < abs(float(exact)) / 100
