"""assert_batch_invariant against a brute-force oracle on a generated corpus of functions.

The oracle (``batch_oracle.py``) runs slices of each checked size, in the
input's own layout, and compares every output leaf bitwise. The check samples
three offsets per size: its verdict must equal the oracle's over those
slices on every generated case, and an op it blames must give different
output rows for the sub-batch's rows when replayed. The oracle also runs every
slice at every offset: a case variant only at offsets the check does not
take is counted ("variant only at other offsets"), the sampling's measured
miss rate, which the docs give. The same corpus runs through a marked test's
census: no op without batch-row inputs gets a verdict.

CI runs a bounded, derandomized number of examples; ``PYTEST_BACKENDS_BATCH_CORPUS=N``
(``make bench``) runs N.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from batch_oracle import (
    Case,
    _Calls,
    batch_size,
    cases,
    fresh,
    op_draws,
    op_reads_other_rows,
    op_rows_differ,
    ops_with_batch_rows,
    oracle,
    reads_other_rows,
    replay_args,
    same_bits,
)
from hypothesis import HealthCheck, given, settings

from pytest_backends import BatchInvarianceError, assert_batch_invariant
from pytest_backends.batch import api as batch_api
from pytest_backends.batch.plugin import TestCheck
from pytest_backends.batch.runs import sub_batches
from pytest_backends.determinism.census import Baseline

EXAMPLES = int(os.environ.get("PYTEST_BACKENDS_BATCH_CORPUS", "40"))
# ``PYTEST_BACKENDS_CORPUS_SEEDED=1`` (with ``--hypothesis-seed``): other examples than CI's.
DERANDOMIZE = os.environ.get("PYTEST_BACKENDS_CORPUS_SEEDED") != "1"
TALLY: Counter[str] = Counter()
DISAGREEMENTS: list[str] = []


def _sizes(case: Case) -> list[int]:
    n = batch_size(case.inputs, case.dims)
    return sorted({1, n // 2})


def _sampled(n: int, size: int) -> list[int]:
    """The offsets the check takes for ``size`` in a batch of ``n`` (its own sub-batch plan)."""
    return [c.rows[0] for c in sub_batches(n, [size], None, False, 0)]


def _check(case: Case) -> tuple[bool, BatchInvarianceError | None]:
    try:
        with torch.no_grad():
            assert_batch_invariant(
                case.fn, *case.inputs, dim=case.dims, out_dim=case.out_dim, permute=False
            )
    except BatchInvarianceError as error:
        return False, error
    return True, None


@settings(
    max_examples=EXAMPLES,
    derandomize=DERANDOMIZE,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(cases())
def test_the_check_agrees_with_the_oracle(case: Case) -> None:
    truth, size = oracle(
        case.fn, case.inputs, case.dims, case.out_dim, _sizes(case), starts=_sampled
    )
    before = fresh(case.inputs)
    verdict, error = _check(case)
    # The check leaves the caller's inputs as they were, whatever fn writes in place.
    assert all(same_bits(a, b) for a, b in zip(before, case.inputs)), case.label
    TALLY["cases"] += 1
    TALLY["inputs in a container"] += case.label.endswith(("from a dict", "from a tuple"))
    TALLY["variant (oracle)"] += not truth
    if truth:
        everywhere, _ = oracle(case.fn, case.inputs, case.dims, case.out_dim, _sizes(case))
        TALLY["variant only at other offsets"] += not everywhere
    if verdict != truth:
        DISAGREEMENTS.append(f"{case.label}: oracle {truth} (size {size}), check {verdict}")
    assert verdict == truth, DISAGREEMENTS[-1]
    finding = error.finding if error is not None else None
    if finding is not None and finding.kind == "op":
        TALLY["ops blamed"] += 1
        assert finding.op is not None
        assert error is not None and list(error.case.rows) == list(
            range(error.case.rows[0], error.case.rows[0] + error.case.size)
        )
        replay = op_rows_differ(
            case.fn, case.inputs, case.dims, finding.op, error.case.rows[0], error.case.size
        )
        assert replay is not False, f"{case.label}: {finding.op} blamed, its rows replay equal"
        TALLY["blamed ops confirmed by replay" if replay else "blamed ops not replayable"] += 1
        # A blamed kernel computes each row from that row alone: changing the others moves
        # nothing (an op that reads them is the function's design, "mixed").
        assert not op_reads_other_rows(
            case.fn, case.inputs, case.dims, finding.op, error.case.rows[0], error.case.size
        ), f"{case.label}: {finding.op} blamed, but it reads the other rows"
    if finding is not None and finding.kind == "random":
        TALLY["random draws named"] += 1
        assert finding.op is not None and op_draws(case.fn, case.inputs, finding.op), (
            f"{case.label}: {finding.op} called a random draw, but two runs give equal values"
        )
    # The corpus's ops give one result per input and generator state on CPU: none is
    # nondeterministic, so that finding is always a wrong one here.
    assert finding is None or finding.kind != "nondeterministic", (
        f"{case.label}: {finding.op} called nondeterministic"
    )
    if finding is not None and finding.kind == "mixed":
        TALLY["mixed rows named"] += 1
        assert error is not None
        assert reads_other_rows(case.fn, case.inputs, case.dims, case.out_dim, error.case.rows), (
            f"{case.label}: rows called mixed, but changing the others moves none of them"
        )


@settings(
    max_examples=max(EXAMPLES // 2, 10),
    derandomize=DERANDOMIZE,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(cases())
def test_no_op_without_batch_rows_lands_in_the_census(case: Case) -> None:
    spec = {"sizes": None, "rtol": None, "atol": None, "tolerance": None, "permute": False}
    check = TestCheck(spec, Baseline(), update=False)
    token = batch_api.ACTIVE_CHECK.set(check)
    try:
        with torch.no_grad():
            assert_batch_invariant(
                case.fn, *case.inputs, dim=case.dims, out_dim=case.out_dim, permute=False
            )
    except BatchInvarianceError:
        pass
    finally:
        batch_api.ACTIVE_CHECK.reset(token)
    batched, _ = ops_with_batch_rows(case.fn, case.inputs, case.dims)
    listed = {row["op"] for row in check.rows()}
    TALLY["census cases"] += 1
    assert "aten::arange" not in listed
    assert listed <= batched, f"{case.label}: {sorted(listed - batched)} have no batch rows"


def test_report_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints the corpus counts (run after the two properties in file order)."""
    with capsys.disabled():
        print(f"\nbatch oracle corpus: {dict(TALLY)}; disagreements: {len(DISAGREEMENTS)}")
    assert not DISAGREEMENTS


def test_the_replay_keeps_aliased_arguments_aliased() -> None:
    """An op called with one tensor twice is replayed with one tensor twice (its rows' view).

    Multi-head attention's native kernel projects query, key and value in one
    GEMM when they are the same tensor: a replay with separate clones takes
    the other path, and an op's blame would look unconfirmed.
    """
    x = torch.randn(4, 3)
    mode = _Calls({"aten::add"})
    with torch.no_grad(), mode:
        torch.add(x, x)
    ((_, args, _, _),) = mode.calls
    assert args[0] is args[1] and args[0] is not x
    sub = replay_args(args, 4, 1, 2)
    assert sub[0] is sub[1] and sub[0].shape == (2, 3)
    assert torch.equal(sub[0], x[1:3])


def test_the_replay_keeps_an_expanded_argument_expanded() -> None:
    """A GEMM over stride-0 rows may round otherwise than over their dense copy.

    Found by the corpus (seed 4): a Linear layer on an expanded input was
    rightly blamed, but the replay's clone made the input dense and the rows
    replayed equal.
    """
    x = torch.randn(4, 5).narrow(-1, 1, 1).expand(4, 5)
    mode = _Calls({"aten::mul"})
    with torch.no_grad(), mode:
        torch.mul(x, 2.0)
    ((_, args, _, _),) = mode.calls
    kept = args[0]
    assert kept.stride() == x.stride() and kept.storage_offset() == x.storage_offset()
    assert kept.data_ptr() != x.data_ptr() and torch.equal(kept, x)
