"""Tolerances that follow the kernel that ran, and defaults that accept torch's own kernels.

Every check here holds on a CPU with AMX (where ``fp32_precision="bf16"``
computes in bf16) and on one without (where it runs an f32 kernel): each
test asks the machine which happened and checks the bound against it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pytest_backends import assert_close, flag_effect, override_flags, reference, tolerance_for
from pytest_backends.kernels import observe
from pytest_backends.tolerance import kernel as tolerance_kernel

BF16_FLAG = {"mkldnn.matmul.fp32_precision": "bf16"}


def _matmul_k1024() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 1024, generator=gen)
    b = torch.randn(1024, 256, generator=gen)
    return a, b, a @ b, reference(torch.matmul, a, b)


def _scaled_error(actual: torch.Tensor, expected: torch.Tensor, factor: float) -> torch.Tensor:
    """``expected + factor * (actual - expected)``: the same result, its error multiplied."""
    return expected + factor * (actual.double() - expected)


def _reduced(tol: object) -> bool:
    return any(line.startswith("inputs rounded") for line in tol.path)  # type: ignore[attr-defined]


@pytest.mark.parametrize("source", ["primitive log", "probe"])
def test_k1024_matmul_under_bf16_flag_passes_and_30x_its_error_fails(source: str) -> None:
    with override_flags(BF16_FLAG):
        if source == "primitive log":
            with observe() as log:
                _, _, actual, expected = _matmul_k1024()
                tol = tolerance_for(torch.float32, op="matmul", k=1024)
                assert_close(actual, expected, op="matmul", k=1024)
                with pytest.raises(AssertionError, match="tolerance model"):
                    assert_close(_scaled_error(actual, expected, 30), expected, op="matmul", k=1024)
            if log.error is not None or tol.precision_source != "primitive log":
                pytest.skip(f"oneDNN did not log this matmul here: {log.error}")
        else:
            _, _, actual, expected = _matmul_k1024()
            tol = tolerance_for(torch.float32, op="matmul", k=1024)
            assert tol.precision_source == "probe"
            assert_close(actual, expected, op="matmul", k=1024)
            with pytest.raises(AssertionError, match="tolerance model"):
                assert_close(_scaled_error(actual, expected, 30), expected, op="matmul", k=1024)
    # the bound matches what the kernel did: a bf16-sized error needs the bf16 bound
    rel = float((actual.double() - expected).norm() / expected.norm())
    assert _reduced(tol) == (rel > 1e-4), (rel, tol.describe())
    if not _reduced(tol):
        # an f32 kernel: the bound is the ieee one, about 6,000x tighter than the flag's worst
        with override_flags(BF16_FLAG):
            worst = tolerance_for(torch.float32, op="matmul", k=1024, kernel=False)
        ieee = tolerance_for(torch.float32, op="matmul", k=1024)
        assert (tol.rtol, tol.atol) == (ieee.rtol, ieee.atol)
        assert worst.atol > 1000 * tol.atol
        assert any("computed in f32" in line or "not bf16-sized" in line for line in tol.path)


def test_the_flags_worst_case_is_documented_and_available() -> None:
    with override_flags(BF16_FLAG):
        worst = tolerance_for(torch.float32, op="matmul", k=1024, kernel=False)
    assert worst.precision_source == "worst case"
    assert worst.atol == pytest.approx(0.75, rel=0.01)  # 6 u sqrt(k) with u = 2^-8
    assert "the flag's worst case" in worst.describe()
    # without a GPU no CUDA probe can run: the worst case, said so
    if not torch.cuda.is_available():
        cuda = tolerance_for(
            torch.float32,
            device="cuda",
            op="matmul",
            k=1024,
            flags={"cuda.matmul.fp32_precision": "tf32"},
        )
        assert cuda.precision_source == "worst case"
        assert any("no cuda probe could run" in line for line in cuda.path)
        assert (
            cuda.atol > 100 * tolerance_for(torch.float32, device="cuda", op="matmul", k=1024).atol
        )


def test_the_probe_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str, str]] = []
    real = tolerance_kernel._run_probe

    def counting(
        device: str, row: str, mode: str, settings: dict[str, object], shape: object = None
    ) -> object:
        calls.append((device, row, mode))
        return real(device, row, mode, settings, shape)  # type: ignore[arg-type]

    monkeypatch.setattr(tolerance_kernel, "_PROBES", {})
    monkeypatch.setattr(tolerance_kernel, "_run_probe", counting)
    with override_flags(BF16_FLAG):
        first = tolerance_for(torch.float32, op="matmul", k=64)
        for k in (8, 256, 4096):
            tolerance_for(torch.float32, op="matmul", k=k)
    assert calls == [("cpu", "mkldnn.matmul.fp32_precision", "bf16")]
    assert first.precision_source == "probe"
    # the probe's verdict is flag_effect's size of effect, on this machine
    gen = torch.Generator().manual_seed(20240611)
    a, b = torch.randn(64, 256, generator=gen), torch.randn(256, 64, generator=gen)
    effect = flag_effect(lambda: a @ b, "mkldnn.matmul.fp32_precision", ["ieee", "bf16"])
    assert _reduced(first) == (effect.size > 2.0**-8 / 16)


def test_probe_stays_out_of_an_active_primitive_log() -> None:
    with override_flags(BF16_FLAG), observe() as log:
        tolerance_kernel._PROBES.clear()
        tolerance_for(torch.float32, op="matmul", k=64)
        assert log.primitives() == []


def test_conv_and_rnn_families_probe_their_own_flag() -> None:
    flags = {"mkldnn.conv.fp32_precision": "bf16", "mkldnn.rnn.fp32_precision": "bf16"}
    with override_flags(flags):
        conv = tolerance_for(torch.float32, op="conv", k=576)
        rnn = tolerance_for(torch.float32, op="rnn", k=64)
    for tol, row in ((conv, "mkldnn.conv.fp32_precision"), (rnn, "mkldnn.rnn.fp32_precision")):
        assert tol.precision_source in ("probe", "worst case")
        assert dict(tol.flags)[row] == "bf16"
        assert any(row in line for line in tol.path)


def test_gelu_passes_with_the_default_bound() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32768, generator=gen)
    torch.testing.assert_close(F.gelu(x), reference(F.gelu, x).float())
    assert_close(F.gelu(x), reference(F.gelu, x))
    assert_close(torch.exp(x), reference(torch.exp, x), op="elementwise")
    # still a real bound: 30 ulps-and-more off fails
    with pytest.raises(AssertionError):
        assert_close(F.gelu(x) * (1 + 2e-5) + 2e-5, reference(F.gelu, x))


@pytest.mark.parametrize(
    ("dtype", "rtol", "atol"),
    [
        (torch.float32, 1.3e-6, 1e-5),
        (torch.float64, 1e-7, 1e-7),
        (torch.float16, 1e-3, 1e-5),
        (torch.bfloat16, 1.6e-2, 1e-5),
        (torch.complex64, 1.3e-6, 1e-5),
    ],
)
def test_elementwise_and_unnamed_bounds_are_no_tighter_than_torchs(
    dtype: torch.dtype, rtol: float, atol: float
) -> None:
    for op in (None, "elementwise"):
        tol = tolerance_for(dtype, op=op)
        assert tol.rtol >= rtol and tol.atol >= atol
    assert (
        any("torch.testing.assert_close's defaults" in line for line in tolerance_for(dtype).path)
        or dtype == torch.float64
    )


def test_named_reductions_keep_the_k_scaled_model() -> None:
    small = tolerance_for(torch.float32, op="matmul", k=8)
    assert small.atol < 1e-5  # tighter than torch's default: the model, not the floor
    assert not any("defaults" in line for line in small.path)
    reduction = [tolerance_for(torch.float32, op="reduction", k=k).atol for k in (16, 256, 4096)]
    assert reduction[0] < reduction[1] < reduction[2]
    # an unnamed op with a long reduction keeps its k-scaled bound above the floor
    assert tolerance_for(torch.float32, k=4096).atol > 1e-5


def test_flag_effect_reports_the_size() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=gen)

    def fn() -> torch.Tensor:  # a stand-in path: bf16-rounded under deterministic mode
        return x.bfloat16().float() if torch.are_deterministic_algorithms_enabled() else x

    effect = flag_effect(fn, "deterministic_algorithms", [False, True])
    assert effect.has_effect
    assert effect.max_rel_diff[0] == 0.0
    assert 2.0**-10 < effect.size < 2.0**-8  # bf16 rounding: about 2^-9 relative
    assert "(relative " in str(effect)
    same = flag_effect(lambda: x * 2, "deterministic_algorithms", [False, True])
    assert not same.has_effect and same.size == 0.0


def test_flag_effect_size_edge_cases() -> None:
    from pytest_backends.effect import _leaves
    from pytest_backends.effect import _rel_diff as rel

    def _rel_diff(a: object, b: object) -> float | None:
        return rel(_leaves(a), _leaves(b))  # as flag_effect flattens its outputs

    a = torch.tensor([3.0, 4.0])
    assert _rel_diff([a], [a.clone()]) == 0.0
    assert _rel_diff([a], [torch.tensor([3.0, 4.5])]) == pytest.approx(0.1)
    assert _rel_diff([a], [a[:1]]) is None  # shapes differ
    assert _rel_diff([a], [a, a]) is None  # structures differ
    assert _rel_diff([torch.zeros(2)], [torch.zeros(2)]) == 0.0
    assert _rel_diff([torch.zeros(2)], [torch.ones(2)]) is None  # nothing to be relative to
    assert _rel_diff([torch.arange(3)], [torch.arange(3) + 1]) == 0.0  # integers: not sized
    inf = torch.tensor([float("inf"), 4.0])
    assert _rel_diff([inf], [torch.tensor([float("inf"), 5.0])]) == pytest.approx(0.25)
    z = torch.tensor([3 + 4j])
    assert _rel_diff([z], [z * (1 + 1e-3)]) == pytest.approx(1e-3, rel=1e-3)  # complex64
