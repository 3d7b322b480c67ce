"""The batch check's verdicts where a plain hand check disagreed with it.

Each case is a function users write; the truth is the brute-force oracle's
(``batch_oracle.py``: every slice in the input's own layout, bitwise).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from batch_oracle import oracle
from torch import nn

from pytest_backends import BatchInvarianceError, assert_batch_invariant

# --- layouts: a slice keeps the input's strides and memory format -----------------------------


@pytest.mark.parametrize(
    ("name", "fn", "make"),
    [
        (
            "pool",
            lambda t: F.adaptive_avg_pool2d(t, 1).flatten(1),
            lambda: torch.randn(8, 64, 14, 14).to(memory_format=torch.channels_last),
        ),
        (
            "groupnorm",
            nn.GroupNorm(8, 64),
            lambda: torch.randn(8, 64, 14, 14).to(memory_format=torch.channels_last),
        ),
        (
            "sum",
            lambda t: t.sum((1, 2, 3)),
            lambda: torch.randn(8, 64, 14, 14).to(memory_format=torch.channels_last),
        ),
        ("transposed", lambda t: t.sum(-1), lambda: torch.randn(64, 8).t()),
    ],
)
def test_rows_alone_are_sliced_in_the_inputs_own_layout(name: str, fn: Any, make: Any) -> None:
    torch.manual_seed(0)
    x = make()
    # Each row alone, sliced as x[i:i + 1] keeps it, gives the full batch's bits.
    truth, _ = oracle(fn, [x], [0], 0, [1])
    assert truth, f"{name}: a row alone differs here in the input's own layout"
    result = assert_batch_invariant(fn, x, sizes=(1,), backward=False)
    assert result.invariant
    # With the default sizes the verdict is the oracle's over the same slices.
    truth, _ = oracle(fn, [x], [0], 0, [1, 2, 4])
    try:
        assert_batch_invariant(fn, x, backward=False, permute=False)
        verdict = True
    except BatchInvarianceError:
        verdict = False
    assert verdict == truth


def test_a_slice_is_a_view_with_the_inputs_strides() -> None:
    x = torch.randn(8, 4, 3, 3).to(memory_format=torch.channels_last)
    seen: list[tuple[tuple[int, ...], bool]] = []

    def fn(t: torch.Tensor) -> torch.Tensor:
        seen.append((t.stride(), t.is_contiguous(memory_format=torch.channels_last)))
        return t * 2

    assert_batch_invariant(fn, x, backward=False)
    assert all(stride == x.stride() and cl for stride, cl in seen)


def test_an_input_written_in_place_is_restored_for_the_next_run() -> None:
    x = torch.randn(8, 4)
    before = x.clone()

    def fn(t: torch.Tensor) -> torch.Tensor:
        return t.mul_(2)

    assert assert_batch_invariant(fn, x, backward=False).invariant
    assert torch.equal(x, before)


def test_an_unbatched_input_written_in_place_is_restored_and_left_as_found() -> None:
    x, scale = torch.randn(5, 4), torch.ones(4)
    truth, _ = oracle(lambda t, m: t * m.clone().add_(1), [x, scale], [0, None], 0, [1, 2])
    result = assert_batch_invariant(lambda t, m: t * m.add_(1), x, scale, dim=(0, None))
    assert truth and result.invariant
    assert torch.equal(scale, torch.ones(4))
    # A weight that requires grad: copied as a leaf that still does, the input grads compared.
    weight = torch.randn(4, requires_grad=True)
    h = torch.randn(6, 4, requires_grad=True)
    seen: list[bool] = []

    def scaled(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        seen.append(w.requires_grad and w is not weight)
        return t * w

    both = assert_batch_invariant(scaled, h, weight, dim=(0, None))
    assert both.invariant and "input gradients compared" in both.backward
    assert seen and all(seen)
    assert weight.grad is None


# --- integer and bool outputs ------------------------------------------------------------------


def test_integer_and_bool_outputs_are_compared_bitwise_outside_backward() -> None:
    torch.manual_seed(0)
    head = nn.Linear(16, 10)
    h = torch.randn(8, 16, requires_grad=True)
    truth, _ = oracle(lambda t: head(t).argmax(-1), [h.detach()], [0], 0, [1, 2, 4])
    try:
        result = assert_batch_invariant(lambda t: head(t).argmax(-1), h)
        assert truth and result.invariant
    except BatchInvarianceError:
        assert not truth
    both = assert_batch_invariant(lambda t: (t * 2, t > 0, t.sum(-1).long()), h)
    assert both.invariant
    assert "input gradients compared" in both.backward
    ints = assert_batch_invariant(lambda t: t * 3, torch.randint(0, 9, (8, 4)))
    assert ints.invariant and ints.backward.startswith("input gradients not checked")


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = torch.tanh(self.head(x))
        return {"logits": logits, "pred": logits.argmax(-1)}


def test_per_sample_grads_skip_integer_outputs() -> None:
    torch.manual_seed(0)
    result = assert_batch_invariant(
        _Classifier(), torch.randn(6, 6), per_sample_grads=True, tolerance="report"
    )
    assert any(c.part.startswith("per-sample") for c in result.cases)
    assert any(c.part == "output['pred']" for c in result.cases)


# --- nothing compared, and outputs whose structure changes with the batch ------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sizes": [16], "permute": False},
        {"sizes": [16]},
        {"sizes": []},
        {"sizes": [1, 2], "offsets": [20, -1]},
    ],
)
def test_a_check_that_compares_no_sub_batch_is_an_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="no sub-batch fits a batch of 8"):
        assert_batch_invariant(nn.Linear(4, 4), torch.randn(8, 4), **kwargs)


def test_outputs_whose_structure_differs_between_batch_sizes_fail() -> None:
    def keys(t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": t * 2} if t.shape[0] == 8 else {"out": t * 2}

    def dtype(t: torch.Tensor) -> torch.Tensor:
        return t * 2 if t.shape[0] == 8 else (t * 2).double()

    def width(t: torch.Tensor) -> torch.Tensor:
        return t if t.shape[0] == 8 else t[:, :2]

    def absent(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return (t, t * 2 if t.shape[0] == 8 else None)

    x = torch.randn(8, 4)
    for fn, text in [
        (keys, "output['logits'] is float32 [batch, 4] in the full batch but absent"),
        (dtype, "output is float32 [batch, 4] in the full batch but float64 [batch, 4]"),
        (width, "output is float32 [batch, 4] in the full batch but float32 [batch, 2]"),
        (absent, "output[1] is float32 [batch, 4] in the full batch but None"),
    ]:
        for mode in ({}, {"tolerance": "report"}, {"rtol": 1.0, "atol": 1.0}):
            with pytest.raises(BatchInvarianceError, match="differ in structure") as info:
                assert_batch_invariant(fn, x, backward=False, **mode)  # type: ignore[arg-type]
            assert text in str(info.value)
    truth, _ = oracle(keys, [x], [0], 0, [1])
    assert not truth


@pytest.mark.parametrize(
    ("fn", "what"),
    [
        (lambda t: t.to_sparse(), "sparse output `output`"),
        (lambda t: {"x": t.to_sparse_csr()}, "sparse output `output['x']`"),
    ],
)
def test_sparse_outputs_are_refused_clearly(fn: Any, what: str) -> None:
    with pytest.raises(
        TypeError, match=f"not supported: {what.replace('[', '.').replace(']', '.')}"
    ):
        assert_batch_invariant(fn, torch.randn(8, 4), backward=False)


def test_nested_outputs_are_refused_clearly() -> None:
    def nested(t: torch.Tensor) -> torch.Tensor:
        return torch.nested.as_nested_tensor(list(t))

    with pytest.raises(TypeError, match="not supported: nested output `output`"):
        assert_batch_invariant(nested, torch.randn(8, 4), backward=False)


# --- module state, and rows mixed by design --------------------------------------------------


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """torchvision's ResNet-18 layout (module names included), without torchvision."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        for i, (cin, cout, stride) in enumerate(widths, 1):
            layer = nn.Sequential(_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1))
            setattr(self, f"layer{i}", layer)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def test_train_mode_batchnorm_leaves_buffers_as_found_and_names_the_mixing() -> None:
    torch.manual_seed(0)
    model = ResNet18().train()
    x = torch.randn(4, 3, 64, 64, requires_grad=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(model, x, sizes=(2,))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), f"{key} changed"
    assert int(model.bn1.num_batches_tracked) == 0
    assert model.training and model.bn1.training
    finding = info.value.finding
    assert finding is not None and finding.kind == "mixed"
    assert finding.location is not None and finding.location.module == "bn1"
    text = str(info.value)
    assert "rows are mixed by a reduction over the batch in module `bn1` (BatchNorm2d)" in text
    assert "aten::mm" not in text and info.value.case.part == "output"


def test_a_module_reached_through_a_closure_is_restored_too() -> None:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3).train()
    x = torch.randn(8, 3, 4, 4)
    with pytest.raises(BatchInvarianceError, match="mixed by a reduction over the batch"):
        assert_batch_invariant(lambda t: torch.relu(bn(t)), x, backward=False)
    assert int(bn.num_batches_tracked) == 0
    assert torch.equal(bn.running_mean, torch.zeros(3))
    assert torch.equal(bn.running_var, torch.ones(3))


def test_eval_mode_batchnorm_is_checked_row_by_row() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    x = torch.randn(8, 3, 6, 6)
    truth, _ = oracle(model, [x], [0], 0, [1, 2, 4])
    try:
        assert_batch_invariant(model, x, backward=False, permute=False)
        verdict = True
    except BatchInvarianceError as error:
        verdict = False
        assert error.finding is not None and error.finding.kind == "op"
    assert verdict == truth


# --- ops without batch rows, and values computed from the batch size ------------------------


def test_ops_without_batch_rows_are_never_blamed() -> None:
    x, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    assert assert_batch_invariant(
        lambda t, lab: t[torch.arange(t.shape[0]), lab], x, labels
    ).invariant
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(lambda t: t / t.shape[0], x)
    finding = info.value.finding
    assert finding is not None and finding.kind == "scalar" and finding.key() is None
    assert "its argument `other` is 8 in the full batch and 1 in the sub-batch" in str(info.value)


def test_a_tensor_made_from_the_batch_size_is_named_without_a_verdict() -> None:
    """A row-position feature: ``arange``'s end is 8 in the full batch and 1 alone.

    The truth by hand: row 3's output is ``x[3] + 3`` in the batch and ``x[3] + 0``
    alone. The op has no batch rows in, so it gets no census verdict, but the
    message names it and its argument, not a reduction the function does not have.
    """
    x = torch.randn(8, 4)
    fn = lambda t: t + torch.arange(t.shape[0])[:, None]  # noqa: E731
    assert not torch.equal(fn(x)[3], fn(x[3:4])[0])
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(fn, x)
    finding = info.value.finding
    assert finding is not None and finding.kind == "scalar", str(info.value)
    assert finding.op == "aten::arange" and finding.key() is None
    assert "its argument `end` is 8 in the full batch and 1 in the sub-batch" in str(info.value)
    assert "reduction" not in str(info.value)


def test_the_op_recording_is_bounded_and_shares_copies() -> None:
    from pytest_backends.batch.locate import RowRecorder, compare_ops, record
    from pytest_backends.batch.runs import Plan

    x = torch.randn(8, 256)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.tanh(torch.tanh(t)))

    recorder = RowRecorder()
    y = x.clone()
    with recorder:
        fn(y)
    # Each intermediate is copied once: as one op's output and the next op's input.
    assert recorder.kept == 4 * x.numel() * x.element_size()
    small = RowRecorder(limit=x.numel() * x.element_size())
    with small:
        fn(y)
    assert small.dropped_after is not None and small.ops[-1].dropped
    plan = Plan(fn, (x,), [0], 8, 0, False, 0)
    full, sub = record(plan, None, None), record(plan, (0,), None)
    verdicts, _ = compare_ops(full, sub, 8, (0,), "row 0 alone")
    assert verdicts[("aten::tanh", "cpu", "float32")] == "no_difference"


# --- bad arguments and the figures of values that are not plain numbers -----------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "shown"),
    [
        ({"dim": 5}, ValueError, "dim 5 is out of range for input 0"),
        ({"dim": -3}, ValueError, "dim -3 is out of range"),
        ({"dim": 0.0}, TypeError, "dim must be an int, None or one entry per input"),
        ({"dim": True}, TypeError, "dim must be an int"),
        ({"sizes": 3}, TypeError, "sizes must be a list of ints"),
        ({"offsets": 2}, TypeError, "offsets must be a list of ints"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict[str, Any], error: type, shown: str) -> None:
    with pytest.raises(error, match=shown):
        assert_batch_invariant(torch.exp, torch.randn(6, 5), **kwargs)


def test_an_infinity_of_the_other_sign_is_an_infinite_difference() -> None:
    x = torch.full((4, 3), float("inf"))
    fn = lambda t: t if t.shape[0] == 4 else -t  # noqa: E731
    result = assert_batch_invariant(fn, x, sizes=[1], offsets=[1], tolerance="report")
    assert result.max_abs == float("inf")


def test_equal_values_with_other_bits_say_so() -> None:
    x = torch.zeros(4, 3)
    fn = lambda t: t if t.shape[0] == 4 else -t  # noqa: E731  (-0.0 for 0.0)
    with pytest.raises(BatchInvarianceError, match="only their bits differ"):
        assert_batch_invariant(fn, x, sizes=[1], offsets=[1], backward=False)
