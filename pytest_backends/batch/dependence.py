"""Whether an op's result for some rows depends on the values of the other rows.

A batch-variant kernel computes each row from that row alone, only in
another way for another batch size; an op that mixes rows (a softmax or a
cumulative sum over the batch, a roll or flip along it, a mean over it)
reads the other rows by design. The two look the same from the two recorded
runs: equal input rows, different output rows. They are told apart here by
running the op once more on the full batch's recorded inputs, with every row
outside the sub-batch changed: where the sub-batch's output rows (or an
output without a batch dimension) change too, the op reads the other rows.

Only floating-point batched inputs are changed (an index or a length changed
at random would be out of range). Where the op cannot be run again, or its
second run does not give the recorded output, nothing is concluded. An op
whose two runs on the same inputs give different values (one after the
other, the generators moving on between them) :func:`draws` random numbers:
a row's values depend on where it sits among the batch's draws.

Importing this module imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pytest_backends import _tree
from pytest_backends.batch.rows import same_bits

__all__ = ["Slot", "draws", "reads_other_rows", "row_indices", "template"]


class Slot:
    """Where the ``index``-th recorded tensor input goes in an op's arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def template(value: object, count: list[int]) -> object:
    """``value`` (an op's positional arguments) with each tensor replaced by its :class:`Slot`.

    Tensors are numbered in the order ``_tree.iter_leaves`` finds them, which
    is the order the recorder keeps their copies in.
    """
    if type(value) is list or isinstance(value, tuple):
        items = [template(v, count) for v in value]
        return items if type(value) is list else tuple(items)
    if isinstance(value, torch.Tensor):
        count[0] += 1
        return Slot(count[0] - 1)
    return value


def row_indices(rows: Sequence[int], n: int, k: int, device: torch.device) -> list[torch.Tensor]:
    """Where the sub-batch's elements sit along a batched dimension of the full run.

    With ``k > 1`` the batch was flattened with another dimension of size
    ``k``, either batch-major (``[N, k] -> N * k``) or batch-minor
    (``[k, N] -> k * N``); the shapes do not tell which, so both are tried.
    """
    base = torch.tensor(list(rows), dtype=torch.long, device=device)
    if k == 1:
        return [base]
    inner = torch.arange(k, device=device)
    return [
        (base[:, None] * k + inner).reshape(-1),
        (inner[:, None] * n + base).reshape(-1),
    ]


def _fill(value: object, tensors: Sequence[torch.Tensor]) -> object:
    if type(value) is list or type(value) is tuple:
        items = [_fill(v, tensors) for v in value]
        return items if type(value) is list else tuple(items)
    if isinstance(value, Slot):
        return tensors[value.index]
    return value


def _arguments(args: object, tensors: Sequence[torch.Tensor]) -> list[Any]:
    filled = _fill(args, tensors)
    return list(filled) if isinstance(filled, (list, tuple)) else [filled]


# (kind, dim, k) of a recorded tensor, as ``locate._batch_dim`` gives it.
How = tuple[str, int, int]


def _outputs(value: object) -> list[torch.Tensor]:
    return [t for t in _tree.iter_leaves(value) if isinstance(t, torch.Tensor)]


def _changed(x: torch.Tensor, keep: torch.Tensor, d: int) -> torch.Tensor:
    """A copy of ``x`` whose rows along ``d`` outside ``keep`` hold other values."""
    out = x.clone()
    others = torch.ones(x.shape[d], dtype=torch.bool, device=x.device)
    others[keep] = False
    at = others.nonzero().reshape(-1)
    if at.numel():
        rows = x.index_select(d, at)
        out.index_copy_(d, at, rows * -1.5 + 0.75)
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and same_bits(a, b)


def reads_other_rows(
    call: tuple[Any, object, dict[str, Any]] | None,
    inputs: Sequence[tuple[torch.Tensor, How]],
    outputs: Sequence[tuple[torch.Tensor, How]],
    rows: Sequence[int],
    n: int,
) -> bool | None:
    """Whether the op's result changes when the rows outside the sub-batch change.

    ``call`` is the op and its arguments' :func:`template` (None: not kept);
    ``inputs`` and ``outputs`` the full run's recorded tensors and how each
    holds the batch of ``n`` rows; ``rows`` the sub-batch's. True where a
    batched output's sub-batch rows (under every layout the shapes allow) or
    an output without a batch dimension change; None where it cannot be told.
    """
    if call is None:
        return None
    func, args, kwargs = call
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return None
    same_args: list[torch.Tensor] = []
    other_args: list[torch.Tensor] = []
    changed = False
    # One copy per distinct tensor: an op may take another path for aliased arguments
    # (multi-head attention's fused projection where query is key is value).
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for x, (kind, d, k) in inputs:
        pair = copies.get(id(x))
        if pair is None:
            if kind == "batched" and (x.is_floating_point() or x.is_complex()):
                keep = torch.cat(row_indices(rows, n, k, x.device))
                pair = (x.clone(), _changed(x, keep, d))
                changed = True
            else:
                pair = (x.clone(), x.clone())
            copies[id(x)] = pair
        same_args.append(pair[0])
        other_args.append(pair[1])
    if not changed:
        return None
    from torch.utils._python_dispatch import _disable_current_modes

    put_back = _generators([x for x, _ in inputs])
    try:
        with _disable_current_modes(), torch.no_grad():
            again = _outputs(func(*_arguments(args, same_args), **kwargs))
            other = _outputs(func(*_arguments(args, other_args), **kwargs))
    except Exception:  # the op refuses the changed values: nothing is concluded
        return None
    finally:
        put_back()
    if len(again) != len(outputs) or len(other) != len(outputs):
        return None
    told = False
    for (recorded, (kind, d, k)), a, b in zip(outputs, again, other):
        if not _same(recorded, a):
            return None  # a second run does not give the recorded output
        if kind == "whole":
            if not _same(a, b):
                return True
            told = True
        elif kind == "batched":
            if a.shape != b.shape:
                return True
            layouts = row_indices(rows, n, k, a.device)
            if all(not _same(a.index_select(d, i), b.index_select(d, i)) for i in layouts):
                return True
            told = True
    return False if told else None


def _generators(tensors: Sequence[torch.Tensor], arguments: Sequence[object] = ()) -> Any:
    """The states of the generators an op on ``tensors`` may draw from, and how to put them back.

    The global ones, and every ``torch.Generator`` among ``arguments``.
    """
    states: list[Any] = [torch.get_rng_state()]
    cuda = any(t.device.type == "cuda" for t in tensors) and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    if cuda:
        states.append(torch.cuda.get_rng_state_all())
    given = [(g, g.get_state()) for g in arguments if isinstance(g, torch.Generator)]

    def put_back() -> None:
        torch.set_rng_state(states[0])
        if cuda:
            torch.cuda.set_rng_state_all(states[1])
        for generator, state in given:
            generator.set_state(state)

    return put_back


def draws(
    call: tuple[Any, object, dict[str, Any]] | None,
    inputs: Sequence[tuple[torch.Tensor, How]],
) -> str | None:
    """How runs of the op on copies of the same recorded inputs differ, or None if they do not.

    Run one after the other, the generators moving on between them, then once
    more from the first run's generator states (and put back after): an op
    that draws random numbers (dropout, ``randn_like``, ``bernoulli``) gives
    other values, but the first run's again from its generator states:
    ``"random"``. An op that gives other values from the same states too is
    ``"nondeterministic"``: its kernel, or state outside the generators (a
    clock, a counter), changes its result from call to call. A kernel that
    computes each output from its inputs gives the same: None. None too where
    the op cannot be run again.
    """
    if call is None:
        return None
    func, args, kwargs = call
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return None
    from torch.utils._python_dispatch import _disable_current_modes

    flat = [*(args if isinstance(args, (list, tuple)) else ()), *kwargs.values()]
    put_back = _generators([x for x, _ in inputs], flat)
    outs: list[list[torch.Tensor]] = []
    try:
        with _disable_current_modes(), torch.no_grad():
            for k in range(3):
                if k == 2:
                    put_back()  # the first run's generator states
                # One copy per distinct tensor, fresh for each run (an in-place op writes it).
                copies: dict[int, torch.Tensor] = {}
                tensors = [copies.setdefault(id(x), x.clone()) for x, _ in inputs]
                outs.append(_outputs(func(*_arguments(args, tensors), **kwargs)))
    except Exception:  # the op cannot be run again: nothing is concluded
        return None
    finally:
        put_back()
    first, second, again = outs
    if len(first) != len(second) or all(_same(a, b) for a, b in zip(first, second)):
        return None
    if len(first) == len(again) and all(_same(a, b) for a, b in zip(first, again)):
        return "random"
    return "nondeterministic"
