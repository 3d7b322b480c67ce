"""The check where users run it: under ``torch.inference_mode``, with generators as arguments.

The truth is the hand check: each row alone, sliced in its layout, run from
the same generator state as the full batch, compared bitwise.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pytest_backends import BatchInvarianceError, assert_batch_invariant


def _hand_check(fn: Callable[..., torch.Tensor], x: torch.Tensor, *rest: object) -> bool:
    """Row by row, every call from the state the generators had at the start."""
    gens = [g for g in rest if isinstance(g, torch.Generator)]
    states = [g.get_state() for g in gens]
    rng = torch.get_rng_state()

    def fresh() -> None:
        torch.set_rng_state(rng)
        for g, s in zip(gens, states):
            g.set_state(s)

    fresh()
    full = fn(x, *rest)
    same = True
    for i in range(x.shape[0]):
        fresh()
        same &= torch.equal(fn(x[i : i + 1], *rest), full[i : i + 1])
    fresh()
    return same


def _verdict(fn: Callable[..., torch.Tensor], *inputs: object) -> tuple[bool, object]:
    try:
        assert_batch_invariant(fn, *inputs, offsets=range(8), sizes=[1])
    except BatchInvarianceError as error:
        return False, error.finding
    return True, None


def test_a_generator_argument_starts_every_run_where_it_was() -> None:
    # A per-feature vector drawn from the caller's generator: the same for every row.
    def fn(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return t + torch.rand(t.shape[1], generator=g)

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(7)
    truth = _hand_check(fn, x, g)
    before = g.get_state()
    verdict, _ = _verdict(fn, x, g)
    assert verdict == truth is True
    assert torch.equal(g.get_state(), before)  # left where it was


def test_draws_per_row_from_a_generator_argument_are_named() -> None:
    def fn(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return t + torch.randn(t.shape, generator=g)

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(7)
    truth = _hand_check(fn, x, g)
    verdict, finding = _verdict(fn, x, g)
    assert verdict == truth
    if not verdict:
        assert finding is not None and finding.kind == "random"  # type: ignore[attr-defined]


INFERENCE: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("rowwise", lambda t: torch.nn.functional.layer_norm(t, (16,)).tanh()),
    ("in place", lambda t: t.mul_(2)),
    ("mixing", lambda t: t - t.mean(0)),
    ("linear", torch.nn.Linear(16, 4).eval()),
]


@pytest.mark.parametrize(("name", "fn"), INFERENCE, ids=[n for n, _ in INFERENCE])
def test_under_inference_mode_the_verdict_is_the_hand_checks(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    with torch.inference_mode():
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
        truth = _hand_check(fn, x.clone())
        before = x.clone()
        verdict, finding = _verdict(fn, x)
        assert torch.equal(x, before)  # the caller's tensor is left as it was
    assert verdict == truth, (name, finding)
    if name == "mixing":
        assert finding is not None and finding.kind == "mixed"  # type: ignore[attr-defined]


def test_under_inference_mode_ops_are_named_and_placed_as_outside_it() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16).eval()

    def fn(t: torch.Tensor) -> torch.Tensor:
        h = lin(t)  # composite ops (linear) reach a mode under inference_mode
        return h - h.mean(0)

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    seen = []
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            _, finding = _verdict(fn, x)
        assert finding is not None
        location = finding.location  # type: ignore[attr-defined]
        seen.append(
            (finding.kind, finding.op, finding.op_index, location and location.describe())  # type: ignore[attr-defined]
        )
    assert seen[0] == seen[1]
    assert seen[0][0] == "mixed" and seen[0][3] is not None
