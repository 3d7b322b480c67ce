"""assert_batch_invariant on real CPU ops, modules and planted batch-dependent custom ops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_backends import BatchInvariance, BatchInvarianceError, assert_batch_invariant

needs_custom_op = pytest.mark.skipif(
    not hasattr(torch.library, "custom_op"), reason="torch.library.custom_op needs torch >= 2.4"
)

if hasattr(torch.library, "custom_op"):

    @torch.library.custom_op("pbbatch::by_batch", mutates_args=())
    def by_batch(x: torch.Tensor) -> torch.Tensor:
        """A planted batch-variant op: every row is scaled by the batch size."""
        return x * (1.0 + 1e-3 * x.shape[0])

    @by_batch.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @torch.library.custom_op("pbbatch::doubled", mutates_args=())
    def doubled(x: torch.Tensor) -> torch.Tensor:
        """Row-wise in the forward; its backward goes through ``by_batch``."""
        return x * 2

    @doubled.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    def _doubled_backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return by_batch(grad) * 2

    doubled.register_autograd(_doubled_backward)


def _row0_difference(fn: object, x: torch.Tensor) -> float:
    """Measured here: row 0 alone against row 0 of the full batch."""
    with torch.no_grad():
        return float((fn(x[:1]) - fn(x)[:1]).abs().max())  # type: ignore[operator]


def _line_of(text: str) -> int:
    """The 1-based line of this file that contains ``text`` (after a call, not this one)."""
    source = Path(__file__).read_text().splitlines()
    lines = enumerate(source, start=1)
    return next(i for i, line in lines if text in line and "_line_of" not in line)


# --- batch-variant kernels at the sizes ---------------------------------------------


@pytest.mark.parametrize(("rows", "features"), [(2048, 4096), (64, 512)])
def test_mm_is_found_batch_variant(rows: int, features: int) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, features, generator=gen)
    b = torch.randn(features, 1024, generator=gen)
    measured = _row0_difference(lambda x: torch.mm(x, b), a)
    if measured == 0.0:
        pytest.skip(f"torch.mm is batch-invariant here at {rows}x{features} (row 0: 0 difference)")
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(torch.mm, a, b, dim=(0, None), sizes=(1, 2), permute=False)
    error = info.value
    assert error.finding is not None and error.finding.op == "aten::mm"
    assert error.case.max_abs > 0
    text = str(error)
    assert f"full batch (size {rows})" in text
    assert "first batch-variant op: aten::mm (cpu, float32)" in text
    assert "test_batch_invariance_api.py" in text


def test_linear_is_found_batch_variant_with_its_module_path() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 256), torch.nn.ReLU())
    x = torch.randn(2048, 4096)
    measured = _row0_difference(model, x)
    if measured == 0.0:
        pytest.skip("nn.Linear(4096, 256) is batch-invariant here at batch 2048 (measured 0)")
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(model, x, sizes=(1, 2), permute=False)
    finding = info.value.finding
    assert finding is not None and finding.op in ("aten::addmm", "aten::linear")
    assert finding.location is not None
    assert finding.location.module == "0" and finding.location.module_type == "Linear"
    assert "module 0 (Linear)" in str(info.value)


def test_conv2d_is_found_batch_variant() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3)
    x = torch.randn(2048, 3, 16, 16)
    measured = _row0_difference(conv, x)
    if measured == 0.0:
        pytest.skip("Conv2d(3, 8, 3) on 16x16 is batch-invariant here at batch 2048 (measured 0)")
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(conv, x, sizes=(1,), offsets=(0,), permute=False)
    finding = info.value.finding
    assert finding is not None and finding.kind == "op"
    assert finding.op is not None and "conv" in finding.op
    assert finding.location is not None and finding.location.module_type == "Conv2d"


# --- invariant ops -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: torch.softmax(x, dim=-1), id="softmax"),
        pytest.param(lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)), id="layer_norm"),
        pytest.param(lambda x: torch.tanh(x) * 3 + x.exp(), id="elementwise"),
    ],
)
def test_row_wise_ops_are_invariant_forward_and_backward(fn: object) -> None:
    x = torch.randn(2048, 4096, generator=torch.Generator().manual_seed(1), requires_grad=True)
    result = assert_batch_invariant(fn, x)  # type: ignore[arg-type]
    assert isinstance(result, BatchInvariance)
    assert result.invariant and result.max_abs == 0.0
    assert result.backward.startswith("input gradients compared")
    assert {c.part for c in result.cases} == {"output", "grad of input 0"}
    # sizes 1 and N // 2 at three offsets, and the permuted batch
    assert result.sizes == (1, 1024, 2048)


def test_rows_alone_are_taken_at_three_offsets_without_a_row_sweep() -> None:
    x = torch.randn(6, 4)
    result = assert_batch_invariant(torch.sin, x, backward=False)
    alone = sorted(c.rows[0] for c in result.cases if c.size == 1)
    assert alone == [0, 2, 5]


# --- planted ops, named with their line ---------------------------------------------------


@needs_custom_op
def test_planted_batch_dependent_op_is_named_with_its_line() -> None:
    x = torch.randn(8, 5)
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(lambda t: torch.relu(by_batch(t)) + 1, x)  # planted-forward
    finding = info.value.finding
    assert finding is not None and finding.op == "pbbatch::by_batch"
    assert finding.location is not None
    assert finding.location.line == _line_of("# planted-forward")
    assert finding.location.file.endswith("test_batch_invariance_api.py")
    assert info.value.case.first_row == 0
    assert "output row 0 differs between the full batch (size 8)" in str(info.value)


@needs_custom_op
def test_backward_is_checked_with_the_forward_op_named() -> None:
    x = torch.randn(8, 5, requires_grad=True)
    # The forward is row-wise: only the backward depends on the batch size.
    forward = assert_batch_invariant(lambda t: doubled(t) + 1, x, backward=False)
    assert forward.invariant
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(lambda t: doubled(t) + 1, x)  # planted-backward
    error = info.value
    assert error.case.part == "grad of input 0"
    assert error.finding is not None and error.finding.op == "pbbatch::by_batch"
    location = error.finding.location
    assert location is not None and location.forward is not None
    assert location.forward_op == "pbbatch::doubled"
    assert location.forward.line == _line_of("# planted-backward")


@needs_custom_op
def test_backward_without_batched_grad_inputs_says_not_checked() -> None:
    x = torch.randn(8, 5)  # does not require grad
    result = assert_batch_invariant(lambda t: doubled(t) + 1, x)
    assert result.invariant
    assert result.backward == "input gradients not checked: no batched input requires grad"


# --- tolerance mode -----------------------------------------------------------------------


def test_tolerance_mode_reports_how_far_from_invariant() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 512, generator=gen)
    b = torch.randn(512, 1024, generator=gen)
    measured = _row0_difference(lambda x: torch.mm(x, b), a)
    if measured == 0.0:
        pytest.skip("torch.mm is batch-invariant here at 64x512 (measured 0)")
    result = assert_batch_invariant(torch.mm, a, b, dim=(0, None), rtol=1e-4, atol=1e-4)
    assert not result.invariant
    assert result.max_abs >= measured > 0
    assert result.max_abs < 1e-2
    assert result.tolerance == (1e-4, 1e-4)
    assert all(c.within for c in result.cases)
    # The same check with a tolerance below the measured difference fails, naming it.
    with pytest.raises(BatchInvarianceError, match="beyond rtol=0, atol=1e-09"):
        assert_batch_invariant(torch.mm, a, b, dim=(0, None), tolerance=(0.0, 1e-9))
    report = assert_batch_invariant(torch.mm, a, b, dim=(0, None), tolerance="report")
    assert report.max_abs == result.max_abs
    assert "size 1:" in report.describe()


# --- inputs that are not batched, outputs, and rows that mix -------------------------------


def test_non_batched_inputs_are_passed_whole() -> None:
    weight = torch.randn(16)
    mask = torch.rand(16) > 0.5
    seen: list[tuple[int, ...]] = []

    def fn(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        seen.append((x.shape[0], w.shape[0], m.shape[0]))
        return torch.where(m, x * w, x)

    x = torch.randn(10, 16)
    result = assert_batch_invariant(fn, x, weight, mask, dim=(0, None, None))
    assert result.invariant
    assert all(w == 16 and m == 16 for _, w, m in seen)
    assert {n for n, _, _ in seen} == {10, 1, 5}


def test_batch_dimension_other_than_zero() -> None:
    x = torch.randn(3, 12, 4)
    result = assert_batch_invariant(lambda t: t.softmax(-1), x, dim=1, out_dim=1)
    assert result.invariant and result.batch == 12


def test_a_function_that_mixes_rows_fails_naming_the_reduction_not_a_kernel() -> None:
    x = torch.randn(8, 4)
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(lambda t: t - t.mean(dim=0), x, backward=False)
    finding = info.value.finding
    # The mean over the batch is a reduction: it mixes rows by design; no kernel is blamed.
    assert finding is not None and finding.kind == "mixed" and finding.op == "aten::mean"
    assert finding.key() is None
    assert "rows are mixed by a reduction over the batch" in str(info.value)


def test_bad_arguments_raise_clear_errors() -> None:
    x, y = torch.randn(4, 3), torch.randn(5, 3)
    with pytest.raises(ValueError, match="disagree on the batch size"):
        assert_batch_invariant(torch.add, x, y)
    with pytest.raises(ValueError, match="gives 1 entries for 2 inputs"):
        assert_batch_invariant(torch.add, x, x, dim=(0,))
    with pytest.raises(ValueError, match="no batch dimension 0 of size 4"):
        assert_batch_invariant(lambda t: t.sum(), x)
    with pytest.raises(ValueError, match="at least 2"):
        assert_batch_invariant(torch.sin, torch.randn(1, 3))
    with pytest.raises(TypeError, match="not both"):
        assert_batch_invariant(torch.sin, x, rtol=1e-3, tolerance=(1e-3, 0))


# --- the op-by-op comparison's proof rule ---------------------------------------------------


def _verdicts(fn: object, x: torch.Tensor, rows: tuple[int, ...]) -> tuple[dict[str, str], object]:
    from pytest_backends.batch.locate import compare_ops, record
    from pytest_backends.batch.runs import Plan

    plan = Plan(fn, (x,), [0], x.shape[0], 0, False, 0)  # type: ignore[arg-type]
    full, sub = record(plan, None, None), record(plan, rows, None)
    verdicts, finding = compare_ops(full, sub, x.shape[0], rows, "case")
    return {op: v for (op, _, _), v in verdicts.items()}, finding


def test_a_batch_flattened_batch_minor_is_not_blamed() -> None:
    # Sequence-first flattening puts the batch inside another dimension ([T, N, C] ->
    # [T * N, C]): its rows are not contiguous blocks, and no op may be blamed for that.
    def seq_first(x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        flat = x.transpose(0, 1).reshape(t * n, c)
        return torch.tanh(flat).reshape(t, n, c).transpose(0, 1)

    x = torch.randn(6, 5, 4)
    verdicts, finding = _verdicts(seq_first, x, (2, 3))
    assert "batch_variant" not in verdicts.values()
    assert verdicts["aten::tanh"] == "no_difference"
    assert finding.kind == "none"  # type: ignore[attr-defined]


def test_a_reduction_over_the_batch_is_inconclusive_not_blamed() -> None:
    verdicts, finding = _verdicts(lambda t: t - t.mean(dim=0), torch.randn(8, 4), (0,))
    assert verdicts["aten::mean"] == "inconclusive"
    assert verdicts["aten::sub"] == "inconclusive"
    assert finding.kind == "mixed"  # type: ignore[attr-defined]


def test_matmul_verdicts_name_the_variant_op_and_the_invariant_ones() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(512, 1024, generator=gen)
    x = torch.randn(64, 512, generator=gen)
    if torch.equal(torch.mm(x[:1], w), torch.mm(x, w)[:1]):
        pytest.skip("torch.mm is batch-invariant here at 64x512 (row 0 measured equal)")
    verdicts, finding = _verdicts(lambda t: torch.softmax(torch.tanh(t) @ w, -1), x, (0,))
    assert verdicts["aten::tanh"] == "no_difference"
    assert verdicts["aten::mm"] == "batch_variant"
    assert verdicts["aten::_softmax"] == "inconclusive"  # its input rows already differ
    assert finding.op == "aten::mm"  # type: ignore[attr-defined]


def test_nested_outputs_are_compared_by_path_and_none_is_skipped() -> None:
    x = torch.randn(6, 3)
    result = assert_batch_invariant(lambda t: {"a": t.sin(), "b": (t * 2, None)}, x, backward=False)
    assert {c.part for c in result.cases} == {"output['a']", "output['b'][0]"}
    with pytest.raises(TypeError, match=r"output\[1\] is a str"):
        assert_batch_invariant(lambda t: (t, "label"), x)


def test_a_parameter_written_during_the_run_proves_nothing() -> None:
    # Parameters are kept by reference, not copied: once one is written in place, the
    # ops that read it before cannot be compared any more, and none of them is blamed.
    layer = torch.nn.Linear(4, 4)

    def writes_its_weight(t: torch.Tensor) -> torch.Tensor:
        out = torch.tanh(t @ layer.weight.t())
        with torch.no_grad():
            layer.weight.mul_(1.0)
        return out

    x = torch.randn(8, 4)
    verdicts, finding = _verdicts(writes_its_weight, x, (0,))
    assert verdicts["aten::mm"] == "inconclusive"
    assert finding.kind != "op" or finding.op != "aten::mm"  # type: ignore[attr-defined]


# --- per-sample parameter gradients ----------------------------------------------------------


class _Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.w)


def test_per_sample_grads_of_a_row_wise_module_are_invariant() -> None:
    result = assert_batch_invariant(_Scale(), torch.randn(6, 8), per_sample_grads=True)
    assert result.invariant
    parts = {c.part for c in result.cases}
    assert "per-sample grad of parameter 'w'" in parts
    alone = {c.rows for c in result.cases if c.part.startswith("per-sample")}
    assert alone == {(0,), (2,), (5,)}  # the rows alone at three offsets
    assert "per-sample parameter gradients compared" in result.backward


def test_per_sample_grads_of_linear_layers_are_compared_with_each_row_alone() -> None:
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x = torch.randn(6, 8)
    result = assert_batch_invariant(model, x, per_sample_grads=True, tolerance="report")
    per_sample = [c for c in result.cases if c.part.startswith("per-sample")]
    assert len(per_sample) == 4 * 3  # four parameters, the rows alone at three offsets
    # Measured here directly: vmap's per-sample gradient of row 0 against row 0 alone.
    g = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xr: torch.Tensor, gr: torch.Tensor) -> torch.Tensor:
        return (functional_call(model, p, (xr.unsqueeze(0),)) * gr.unsqueeze(0)).sum()

    batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, g)
    alone = torch.autograd.grad(model(x[:1]), list(model.parameters()), g[:1])
    differs = any(not torch.equal(batched[k][0], a) for k, a in zip(params, alone))
    row0 = [c for c in per_sample if c.rows == (0,)]
    assert any(not c.identical for c in row0) == differs


def test_per_sample_grads_need_a_module_and_backward() -> None:
    with pytest.raises(TypeError, match=r"needs fn to be an nn\.Module"):
        assert_batch_invariant(torch.sin, torch.randn(4, 2), per_sample_grads=True)
    with pytest.raises(ValueError, match="needs backward=True"):
        assert_batch_invariant(_Scale(), torch.randn(4, 8), per_sample_grads=True, backward=False)
