"""Setup shared by the batch-check benchmarks: models, the calls the check makes, timing.

``bench_batch_check.py`` (cost against its anchors, memory, oracle corpus)
and ``bench_batch_invariance.py`` (forward, backward, marked and locating
checks on larger models) time the same things against the same bare calls;
they are built here once.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from pytest_backends import assert_batch_invariant
from pytest_backends.batch import api as batch_api
from pytest_backends.batch.plugin import TestCheck
from pytest_backends.batch.runs import sub_batches
from pytest_backends.determinism.census import Baseline

FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
CLOCK = time.process_time

Variant = Callable[[], None]


def mlp(width: int = 512, depth: int = 4) -> torch.nn.Module:
    """``depth`` x (Linear(width, width), ReLU), in eval mode."""
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


def rowwise(width: int) -> torch.nn.Module:
    """A model whose rows never meet: LayerNorm, tanh, LayerNorm, GELU (batch-invariant)."""
    return torch.nn.Sequential(
        torch.nn.LayerNorm(width), torch.nn.Tanh(), torch.nn.LayerNorm(width), torch.nn.GELU()
    ).eval()


def transformer() -> torch.nn.Module:
    """One TransformerEncoderLayer, d_model 256, 4 heads, batch first, in eval mode."""
    return torch.nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True).eval()


def check_rows(n: int) -> list[tuple[int, ...] | None]:
    """The rows of every call the check makes by default (None: the full batch)."""
    return [None, *[c.rows for c in sub_batches(n, sorted({1, n // 2}), None, True, 0)]]


def _forwards(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Variant:
    def run() -> None:
        with torch.no_grad():
            for inp in inputs:
                model(inp)

    return run


def same_calls(model: torch.nn.Module, x: torch.Tensor, backward: bool = False) -> Variant:
    """The calls the check makes, made by hand on sub-batches selected ahead of time."""
    rows = check_rows(x.shape[0])
    inputs = [x if r is None else x[list(r)] for r in rows]
    if not backward:
        return _forwards(model, inputs)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        grad = torch.randn(model(x).shape, generator=gen)
    grads = [grad if r is None else grad[list(r)] for r in rows]

    def run() -> None:
        for inp, g in zip(inputs, grads):
            leaf = inp.detach().requires_grad_(True)
            torch.autograd.grad(model(leaf), leaf, g)

    return run


def by_hand(model: torch.nn.Module, x: torch.Tensor) -> Variant:
    """The calls the check makes, as a user writes them: each sub-batch sliced in the loop.

    Consecutive rows are ``x[i:i + k]`` (a view, as the check takes them), the
    permuted batch ``x[order]``; the slicing is timed with the calls.
    """
    picks: list[object] = []
    for r in check_rows(x.shape[0]):
        if r is None:
            picks.append(slice(None))
        elif r == tuple(range(r[0], r[0] + len(r))):
            picks.append(slice(r[0], r[0] + len(r)))
        else:
            picks.append(list(r))

    def run() -> None:
        with torch.no_grad():
            for pick in picks:
                model(x[pick])  # type: ignore[index]

    return run


def every_row(model: torch.nn.Module, x: torch.Tensor) -> Variant:
    """A full pass plus one pass per row: what a brute-force row-by-row check runs."""
    return _forwards(model, [x] + [x[i : i + 1] for i in range(x.shape[0])])


def check(
    model: torch.nn.Module, x: torch.Tensor, backward: bool = False, **kwargs: object
) -> Variant:
    """``assert_batch_invariant`` on ``model`` (forward only under no_grad, or with backward)."""

    def run() -> None:
        if backward:
            assert_batch_invariant(model, x.detach().requires_grad_(True), **kwargs)  # type: ignore[arg-type]
        else:
            with torch.no_grad():
                assert_batch_invariant(model, x, backward=False, **kwargs)  # type: ignore[arg-type]

    return run


def marked(model: torch.nn.Module, x: torch.Tensor) -> Variant:
    """The check as a marked test runs it: every sub-batch also recorded for the census."""
    spec = {"sizes": None, "rtol": None, "atol": None, "tolerance": "report", "permute": True}

    def run() -> None:
        token = batch_api.ACTIVE_CHECK.set(TestCheck(spec, Baseline(), update=False))
        try:
            with torch.no_grad():
                assert_batch_invariant(model, x, backward=False)
        finally:
            batch_api.ACTIVE_CHECK.reset(token)

    return run


def interleaved(
    variants: dict[str, Variant], rounds: int, inner: int = 1
) -> dict[str, list[float]]:
    """Process CPU seconds per call of each variant, one figure per round, variants interleaved."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in variants.items():
            start = CLOCK()
            for _ in range(inner):
                fn()
            times[name].append((CLOCK() - start) / inner)
    return times


def ratios(times: list[float], anchor: list[float]) -> tuple[float, float]:
    """``(min ratio, median ratio)`` of ``times`` to ``anchor``."""
    return min(times) / min(anchor), statistics.median(times) / statistics.median(anchor)
