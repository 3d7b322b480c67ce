"""Per-sample parameter gradients: one batched pass against each row alone.

Parameter gradients of a batch sum over its rows, so they cannot be compared
row by row. Per-sample gradients can: ``torch.func.vmap`` computes every
row's gradient in one batched pass (as DP-SGD and influence-function code
does), and a row run alone gives the same gradient from a batch of one. Both
back-propagate the row's slice of the same seeded upstream gradients.

Importing this module imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pytest_backends.batch.layout import same_layout
from pytest_backends.batch.runs import Plan, Run, differentiable, outputs_of, prepare

__all__ = ["per_sample_runs"]


def _parameters(fn: object) -> dict[str, torch.Tensor]:
    if not isinstance(fn, torch.nn.Module):
        raise TypeError(
            "assert_batch_invariant: per_sample_grads needs fn to be an nn.Module (its "
            f"parameters are differentiated), got {type(fn).__name__}"
        )
    params: dict[str, torch.Tensor] = {
        name: p for name, p in fn.named_parameters() if p.requires_grad
    }
    if not params:
        raise ValueError(
            "assert_batch_invariant: per_sample_grads: the module has no parameter that "
            "requires grad"
        )
    return params


def per_sample_runs(
    plan: Plan, rows: Sequence[int], upstream: list[torch.Tensor | None], start: Any
) -> tuple[Run, dict[int, Run]]:
    """The per-sample gradients of every row (one vmapped pass) and of each of ``rows`` alone.

    ``upstream`` are the full batch's upstream gradients, one per output.
    Returns runs whose parts are ``"per-sample grad of parameter 'name'"``
    batched along dim 0.
    """
    from torch.func import functional_call, grad, vmap

    params = _parameters(plan.fn)
    names = list(params)

    def up(i: int) -> torch.Tensor:
        g = upstream[i]
        assert g is not None  # drawn for every differentiable output
        return g

    module: Any = plan.fn
    alone: dict[int, Run] = {}
    used: list[int] | None = None
    for r in rows:
        start.restore()
        args = prepare(plan.inputs, plan.dims, (r,))
        outs = outputs_of(module(*args), plan.out_dim, 1)
        if used is None:
            used = [i for i, (_, t) in enumerate(outs) if differentiable(t)]
        index = torch.tensor([r], dtype=torch.long)
        got = torch.autograd.grad(
            [outs[i][1] for i in used],
            [params[n] for n in names],
            [up(i).index_select(plan.out_dim, index.to(up(i).device)) for i in used],
            allow_unused=True,
        )
        alone[r] = Run(
            [
                (f"per-sample grad of parameter {n!r}", g.unsqueeze(0), 0)
                for n, g in zip(names, got)
                if g is not None
            ]
        )
    if used is None or not used:
        return Run([]), alone
    chosen = used

    def loss(p: dict[str, torch.Tensor], *row: Any) -> torch.Tensor:
        args = [
            a.unsqueeze(d) if d is not None else a
            for a, d in zip(row[: len(plan.inputs)], plan.dims)
        ]
        grads = row[len(plan.inputs) :]
        outs = outputs_of(functional_call(module, p, tuple(args)), plan.out_dim, 1)
        total = sum((outs[i][1] * g.unsqueeze(plan.out_dim)).sum() for i, g in zip(chosen, grads))
        assert isinstance(total, torch.Tensor)
        return total

    detached = {n: p.detach() for n, p in params.items()}
    inputs = [  # an unbatched tensor as a copy, as in every other run
        (x.detach() if d is not None else same_layout(x)) if isinstance(x, torch.Tensor) else x
        for x, d in zip(plan.inputs, plan.dims)
    ]
    in_dims = (None, *plan.dims, *[plan.out_dim for _ in chosen])
    start.restore()
    try:
        batched = vmap(grad(loss), in_dims=in_dims)(detached, *inputs, *[up(i) for i in chosen])
    except Exception as exc:
        raise ValueError(
            "assert_batch_invariant: per_sample_grads: torch.func.vmap could not compute "
            f"per-sample gradients of the module ({type(exc).__name__}: {exc})"
        ) from exc
    full = Run(
        [(f"per-sample grad of parameter {n!r}", batched[n], 0) for n in names if n in batched]
    )
    return full, alone
