"""Other ops for another batch size: torch's own choice at one call site, or a branch in user code.

The truth is the hand check: a plain ``nn.GRU`` / ``nn.LSTM`` has no branch
on the batch size in the test's code, yet torch runs ``view`` + ``addmm``
for one row where it runs ``t`` + ``mm`` for eight (its matmul chooses), and
the bits then differ. That is torch's path at one call site, which a batch
baseline can accept; a function that branches on ``x.shape[0]`` on lines of
its own takes another path in user code. Random draws in a sub-batch run
explain the differing rows before any path does.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pytest_backends import BatchInvarianceError, assert_batch_invariant


def _failure(fn: object, *inputs: torch.Tensor, **kw: object) -> BatchInvarianceError:
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(fn, *inputs, **kw)  # type: ignore[arg-type]
    return info.value


def _rnn(kind: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return kind(8, 8, batch_first=True).eval()


@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM], ids=["GRU", "LSTM"])
@pytest.mark.parametrize("sizes", [None, [1]], ids=["default", "1"])
def test_a_plain_rnn_in_eval_mode_is_torch_choosing_other_ops(
    kind: type[nn.Module], sizes: list[int] | None
) -> None:
    rnn = _rnn(kind)
    x = torch.randn(8, 5, 8, generator=torch.Generator().manual_seed(1))
    error = _failure(lambda t: rnn(t)[0], x, sizes=sizes)
    text = str(error)
    finding = error.finding
    assert finding is not None and finding.kind == "path", text
    assert "the code takes another path" not in text, text
    assert "torch chose other ops for another batch size" in text, text
    assert f"module {kind.__name__} (outermost)" in text, text
    # Both sides' ops are named, and the pair is the key a baseline accepts.
    assert finding.op is not None and finding.other_op is not None
    assert f"full batch: {finding.op}, sub-batch: {finding.other_op}" in text
    assert finding.key() == (f"{finding.op} -> {finding.other_op}", "cpu", "float32")


def _branches(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 1:
        return x * 2.0
    return x * 2.0 + 0.0 * x.sum(0)


BRANCHES: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("if on lines of its own", lambda t: _branches(t) + torch.finfo(t.dtype).eps * t.shape[0]),
    # One line, but two calls of the user's code: still a branch in it.
    ("a conditional expression", lambda t: t * 2.0 if t.shape[0] == 1 else t + t.shape[0]),
    ("a loop over the rows", lambda t: torch.stack([r * 2.0 for r in t]) + 1e-3 * t.shape[0]),
]


@pytest.mark.parametrize("fn", [f for _, f in BRANCHES], ids=[n for n, _ in BRANCHES])
def test_a_branch_on_the_batch_size_in_user_code_still_takes_another_path(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2)) + 1e-3
    error = _failure(fn, x)
    text = str(error)
    assert error.finding is not None and error.finding.kind == "sequence", text
    assert error.finding.key() is None
    assert "the code takes another path for another batch size" in text, text


def test_transformer_dropout_in_train_mode_at_default_sizes_names_the_random_draws() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True).train()
    x = torch.randn(8, 10, 32, generator=torch.Generator().manual_seed(3))
    error = _failure(layer, x)
    text = str(error)
    assert error.finding is not None and error.finding.kind == "random", text
    assert "draws random numbers" in text and "no kernel is blamed" in text, text
    assert "takes another path" not in text and "torch chose" not in text, text


GRU_TEST = """
import pytest
import torch
from torch import nn

from pytest_backends import assert_batch_invariant


@pytest.mark.batch_invariant
def test_gru():
    torch.manual_seed(0)
    gru = nn.GRU(8, 8, batch_first=True).eval()
    assert_batch_invariant(lambda x: gru(x)[0], torch.randn(8, 5, 8))
"""

LSTM_TEST = """

@pytest.mark.batch_invariant
def test_lstm():
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 8, batch_first=True).eval()
    assert_batch_invariant(lambda x: lstm(x)[0], torch.randn(8, 5, 8))
"""


@pytest.mark.slow
def test_a_torch_chosen_path_is_accepted_by_the_batch_baseline(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=GRU_TEST)
    plain = pytester.runpytest_subprocess()
    plain.assert_outcomes(failed=1)
    plain.stdout.fnmatch_lines(["*torch chose other ops for another batch size*"])

    baseline = pytester.path / "batch-baseline.json"
    update = pytester.runpytest_subprocess(
        f"--backends-batch-baseline={baseline}", "--backends-batch-baseline-update"
    )
    update.assert_outcomes(passed=1)
    accepted = json.loads(baseline.read_text())["accepted"]
    assert [(e["op"], e["device"]) for e in accepted] == [("aten::t -> aten::view", "cpu")]

    again = pytester.runpytest_subprocess(f"--backends-batch-baseline={baseline}")
    again.assert_outcomes(passed=1)
    assert again.ret == pytest.ExitCode.OK

    # Another path torch chooses (the LSTM's) is new: it still fails.
    pytester.makepyfile(test_suite=GRU_TEST + LSTM_TEST)
    new = pytester.runpytest_subprocess(f"--backends-batch-baseline={baseline}")
    new.assert_outcomes(passed=1, failed=1)
    new.stdout.fnmatch_lines(["*torch chose other ops for another batch size*"])
    assert "FAILED test_suite.py::test_gru" not in new.stdout.str()
