"""Random draws are the function's design, never a baselined batch-variant kernel.

The truth is a hand check: the op, run twice on the same inputs one after the
other, gives other values (it draws from a generator), and a row's draws
depend on where the row sits in the batch.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pytest_backends import BatchInvarianceError, assert_batch_invariant
from pytest_backends.batch.dependence import draws
from pytest_backends.batch.locate import RowRecorder

DRAWS: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("dropout in train mode", lambda t: F.dropout(t * 2, 0.3, training=True)),
    ("noise added", lambda t: t.tanh() + torch.randn_like(t)),
    ("a mask drawn per row", lambda t: t * torch.rand(t.shape[0], 1)),
    ("bernoulli of a probability", lambda t: t * torch.bernoulli(torch.full_like(t, 0.5))),
]


def _op_draws_by_hand(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, op: str) -> bool:
    """Whether ``op``'s outputs differ between two runs of ``fn`` (the generator moving on)."""
    runs = []
    for _ in range(2):
        recorder = RowRecorder()
        with torch.no_grad(), recorder:
            fn(x.clone())
        runs.append([o for o in recorder.ops if o.name == op])
    first, second = runs
    assert first and len(first) == len(second)
    return any(
        not torch.equal(a, b)  # type: ignore[arg-type]
        for p, q in zip(first, second)
        for a, b in zip(p.outputs, q.outputs)
    )


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize(("name", "fn"), DRAWS, ids=[n for n, _ in DRAWS])
def test_a_random_draw_is_named_as_one_not_blamed_as_a_kernel(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor], backward: bool
) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(fn, x.requires_grad_(backward), backward=backward)
    finding = info.value.finding
    assert finding is not None
    assert finding.kind == "random", (name, str(info.value))
    assert finding.key() is None  # nothing a baseline could accept
    assert finding.op is not None and _op_draws_by_hand(fn, x.detach(), finding.op)
    assert "draws random numbers" in str(info.value)
    assert "no kernel is blamed" in str(info.value)


@pytest.mark.parametrize("backward", [False, True])
def test_an_op_that_changes_from_call_to_call_is_named_nondeterministic(backward: bool) -> None:
    """Not "draws random numbers" (it draws nothing), nor a batch-variant kernel."""
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(0), requires_grad=backward)
    with pytest.raises(BatchInvarianceError) as info:
        assert_batch_invariant(lambda t: counter(t.tanh()), x, backward=backward)
    finding = info.value.finding
    assert finding is not None and finding.kind == "nondeterministic", str(info.value)
    assert finding.op == "pbbatchtest::counter" and finding.key() is None
    text = str(info.value)
    assert "draws random numbers" not in text and "eval mode" not in text, text
    assert "gives different values from identical inputs" in text, text


def test_the_same_function_in_eval_mode_passes() -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert_batch_invariant(lambda t: F.dropout(t * 2, 0.3, training=False), x)


_CALLS = itertools.count()


@torch.library.custom_op("pbbatchtest::counter", mutates_args=())
def counter(x: torch.Tensor) -> torch.Tensor:
    """``x`` plus an amount that changes on every call: nondeterministic, drawing nothing."""
    return x + next(_CALLS) * 1e-3


@counter.register_fake
def _counter_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


counter.register_autograd(lambda ctx, grad: grad)


def test_draws_tells_a_kernel_from_a_draw_from_a_nondeterministic_op() -> None:
    x = torch.randn(8, 16)
    cases = ((torch.randn_like, "random"), (torch.tanh, None), (counter, "nondeterministic"))
    for fn, expected in cases:
        recorder = RowRecorder()
        with torch.no_grad(), recorder:
            fn(x)
        (op,) = recorder.ops
        assert draws(op.call, [(t, ("batched", 0, 1)) for t in op.inputs]) == expected, fn  # type: ignore[misc]
    # The generator is left where it was.
    state = torch.get_rng_state()
    draws(op.call, [(t, ("batched", 0, 1)) for t in op.inputs])  # type: ignore[misc]
    assert torch.equal(state, torch.get_rng_state())


MARKED = """
import torch
import pytest
from pytest_backends import assert_batch_invariant


@pytest.mark.batch_invariant(permute=False)
def test_noise():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    assert_batch_invariant(lambda t: t.tanh() + torch.randn_like(t), x)
"""


def test_a_baseline_update_never_accepts_a_random_draw(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_noise=MARKED)
    baseline = pytester.path / "baseline.json"
    update = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        f"--backends-batch-baseline={baseline}",
        "--backends-batch-baseline-update",
    )
    assert update.ret != pytest.ExitCode.INTERNAL_ERROR
    written = json.loads(baseline.read_text())["accepted"] if baseline.exists() else []
    assert not any("randn" in json.dumps(row) for row in written), written
    again = pytester.runpytest_subprocess(
        "-p", "no:randomly", f"--backends-batch-baseline={baseline}"
    )
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*aten::randn_like*draws random numbers*"])
    assert "BATCH-VARIANT" not in again.stdout.str()
