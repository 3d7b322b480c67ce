"""Ops that read the other rows are the function's design, never a baselined kernel.

The truth is a hand check: change every row but one and see whether that
row's result moves. An op whose output keeps the batch dimension (a softmax
or cumulative sum over the batch, a roll or flip along it) mixes rows as
much as a mean over the batch does.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from pytest_backends import BatchInvarianceError, assert_batch_invariant
from pytest_backends.batch.dependence import reads_other_rows
from pytest_backends.batch.locate import RowRecorder, _batch_dim

MIXERS: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("softmax over the batch", lambda t: torch.softmax(t, dim=0)),
    ("cumsum over the batch", lambda t: t.cumsum(0)),
    ("roll along the batch", lambda t: t + t.roll(1, 0)),
    ("flip along the batch", lambda t: t * t.flip(0)),
    ("sort over the batch", lambda t: t.sort(0).values),
    ("mean over the batch", lambda t: t - t.mean(0)),
]


def _reads_other_rows_by_hand(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
    """Whether row 3's result changes when every other row changes (the hand check)."""
    other = x.clone()
    other[torch.arange(x.shape[0]) != 3] *= -1.5
    return not torch.equal(fn(x)[3], fn(other)[3])


@pytest.mark.parametrize(("name", "fn"), MIXERS, ids=[n for n, _ in MIXERS])
def test_an_op_that_reads_the_other_rows_is_mixing_not_a_kernel(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert _reads_other_rows_by_hand(fn, x)
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(fn, x)
    finding = info.value.finding
    assert finding is not None
    assert finding.kind == "mixed", (name, finding)
    assert finding.key() is None  # nothing a baseline could accept
    assert "no kernel is blamed" in str(info.value)


def _recorded(fn: Callable[..., object], *args: torch.Tensor) -> list[object]:
    recorder = RowRecorder()
    with torch.no_grad(), recorder:
        fn(*args)
    return recorder.ops  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("fn", "reads"),
    [
        (lambda x, w: x @ w, False),
        (lambda x, w: torch.softmax(x @ w, dim=1), False),
        (lambda x, w: torch.softmax(x @ w, dim=0), True),
        (lambda x, w: (x @ w).cumsum(1), False),
        (lambda x, w: (x @ w).cumsum(0), True),
    ],
)
def test_the_replay_tells_a_row_wise_op_from_one_that_reads_other_rows(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], reads: bool
) -> None:
    """The last op of each function, run again with rows 0, 5 and 6 kept and the rest changed."""
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 5, generator=gen), torch.randn(5, 4, generator=gen)
    rows = (0, 5, 6)
    full = _recorded(fn, x, w)[-1]
    sub = _recorded(fn, x[list(rows)], w)[-1]
    ins = [
        (a, _batch_dim(a, b, 8, 3))
        for a, b in zip(full.inputs, sub.inputs)  # type: ignore[attr-defined]
    ]
    outs = [
        (a, _batch_dim(a, b, 8, 3))
        for a, b in zip(full.outputs, sub.outputs)  # type: ignore[attr-defined]
    ]
    assert reads_other_rows(full.call, ins, outs, rows, 8) is reads  # type: ignore[attr-defined]


def test_a_packed_sequence_is_not_called_mixing() -> None:
    """Packing reorders rows by length; another row's values never reach a row's result."""
    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 8).eval()
    x = torch.randn(7, 5, 4)
    lengths = torch.tensor([7, 3, 5, 1, 6])

    def packed(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out, _ = gru(pack_padded_sequence(x, lengths, enforce_sorted=False))
        return pad_packed_sequence(out, total_length=7)[0]

    other = x.clone()
    other[:, 1:] = torch.randn(7, 4, 4)
    with torch.no_grad():
        assert torch.equal(packed(x, lengths)[:, 0], packed(other, lengths)[:, 0])
    try:
        assert_batch_invariant(packed, x, lengths, dim=(1, 0), out_dim=1)
    except BatchInvarianceError as exc:
        assert exc.finding is None or exc.finding.kind != "mixed", str(exc)


MARKED = """
import pytest, torch
from pytest_backends import assert_batch_invariant

@pytest.mark.batch_invariant(permute=False)
def test_softmax_over_batch():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert_batch_invariant(lambda t: torch.softmax(t, dim=0), x)

@pytest.mark.batch_invariant(permute=False)
def test_cumsum_over_batch():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert_batch_invariant(lambda t: t.cumsum(0), x)
"""


def test_a_baseline_update_never_accepts_an_op_that_mixes_rows(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mix=MARKED)
    baseline = pytester.path / "baseline.json"
    update = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        f"--backends-batch-baseline={baseline}",
        "--backends-batch-baseline-update",
    )
    assert update.ret != pytest.ExitCode.INTERNAL_ERROR
    written = json.loads(baseline.read_text())["accepted"] if baseline.exists() else []
    assert not written, written
    again = pytester.runpytest_subprocess(
        "-p", "no:randomly", f"--backends-batch-baseline={baseline}"
    )
    again.assert_outcomes(failed=2)
    again.stdout.fnmatch_lines(["*rows are mixed across the batch*aten::_softmax*"])
    assert "accepted by the baseline" not in again.stdout.str()


def test_only_a_batch_norm_op_is_said_to_mix_by_batchnorm_statistics() -> None:
    """A mean over the batch in a lambda is named a reduction, without BatchNorm in the text."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(BatchInvarianceError) as centred:
        assert_batch_invariant(lambda t: t - t.mean(0), x, backward=False)
    with pytest.raises(BatchInvarianceError) as normed:
        assert_batch_invariant(torch.nn.BatchNorm1d(4).train(), x, sizes=[4], backward=False)
    for info, says in ((centred, False), (normed, True)):
        finding = info.value.finding
        assert finding is not None and finding.kind == "mixed", str(info.value)
        assert ("batch statistics of BatchNorm" in str(info.value)) is says, str(info.value)
