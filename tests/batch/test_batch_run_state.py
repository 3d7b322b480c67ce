"""Every run of the check starts from the same global RNG states; the check leaves them as found.

The Python and NumPy generators are probed in their memory and set only when
a run drew from them; these cases draw from each (NumPy with and without a
cached Gaussian, which a draw can use up without moving the generator's key),
and the verdict and the states after the check are those of a check that
sets every state before every run.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
import torch

from pytest_backends import BatchInvarianceError, assert_batch_invariant
from pytest_backends.batch.compare import compare_all
from pytest_backends.batch.runs import Case, Run


def _states() -> tuple[object, ...]:
    st = np.random.get_state()
    return (
        torch.get_rng_state(),
        random.getstate(),
        st[0],
        st[1].tobytes(),
        st[2],
        st[3],
        st[4],
    )


def _same_states(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return bool(torch.equal(a[0], b[0])) and a[1:] == b[1:]  # type: ignore[arg-type]


# Each adds noise that is the same for every row when every run starts from the same state.
DRAWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch": lambda t: t + torch.randn(t.shape[1:]),
    "python random": lambda t: t + random.random(),
    "python gauss": lambda t: t + random.gauss(0.0, 1.0),
    "numpy uniform": lambda t: t + float(np.random.rand()),
    "numpy gaussian": lambda t: t + float(np.random.randn()),
    "nothing": lambda t: t * 2,
}


@pytest.mark.parametrize("cached_gaussian", [False, True])
@pytest.mark.parametrize("name", sorted(DRAWS))
def test_every_run_starts_from_the_same_rng_states(name: str, cached_gaussian: bool) -> None:
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    random.gauss(0.0, 1.0)  # Python's generator keeps the second Gaussian of a pair
    if cached_gaussian:
        np.random.randn()  # NumPy's legacy generator keeps the second Gaussian of a pair
    assert (np.random.get_state()[3] == 1) is cached_gaussian
    x = torch.randn(8, 5)
    before = _states()
    with torch.no_grad():
        result = assert_batch_invariant(DRAWS[name], x, backward=False)
    assert result.invariant
    assert _same_states(before, _states())


def test_rows_drawn_per_row_are_batch_variant_and_the_states_restored() -> None:
    np.random.seed(5)
    np.random.randn()
    x = torch.randn(8, 5)
    before = _states()
    with pytest.raises(BatchInvarianceError):
        assert_batch_invariant(
            lambda t: t + torch.from_numpy(np.random.randn(*t.shape)).float(),
            x,
            backward=False,
            locate=False,
        )
    assert _same_states(before, _states())


def test_single_output_runs_compare_as_general_runs() -> None:
    """The one-tensor fast path gives the results of the general path, mismatches included."""
    full = torch.arange(48.0).reshape(8, 6)
    cases = [Case("row 3 alone", (3,)), Case("rows 2..5", (2, 3, 4, 5)), Case("row 7 alone", (7,))]
    subs = [
        full[3:4].clone(),
        torch.cat([full[2:4], full[4:6] + 1]),
        full[7:8].to(torch.float64),  # another dtype: a structure difference
    ]
    for tol in (None, (1e-3, 0.0), "report"):
        fast = compare_all(
            Run([("output", full, 0)], single=True),
            [(Run([("output", s, 0)], single=True), c) for s, c in zip(subs, cases)],
            tol,
        )
        general = compare_all(
            Run([("output", full, 0)], {"output": (torch.float32, (-1, 6))}),
            [
                (Run([("output", s, 0)], {"output": (s.dtype, (-1, 6))}), c)
                for s, c in zip(subs, cases)
            ],
            tol,
        )
        assert fast == general
        assert [r.first_row for r in fast] == [None, 4, 7]
        assert fast[2].part.startswith("output structure (output is float32 [batch, 6]")


@pytest.mark.parametrize(
    ("fn", "what"),
    [
        (lambda t: t.to_sparse() if t.shape[0] == 1 else t * 2, "sparse output `output`"),
        (
            lambda t: torch.nested.as_nested_tensor(list(t)) if t.shape[0] == 4 else t * 2,
            "nested output `output`",
        ),
    ],
)
def test_a_layout_only_sub_batches_return_is_refused_clearly(
    fn: Callable[[torch.Tensor], torch.Tensor], what: str
) -> None:
    with pytest.raises(TypeError, match=f"not supported: {what}"):
        assert_batch_invariant(fn, torch.randn(8, 4), backward=False)
