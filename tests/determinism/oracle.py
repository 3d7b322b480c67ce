"""The slow oracle of the determinism verdict, as a pytest plugin (``-p oracle``).

Loaded into a plain pytest session (no determinism check), it runs every op the
tests call on the main thread twice more *alone*: on clones of the op's
inputs, with the generators the op can draw from put back to their state at
call time before each try. An op whose two tries give different bits is
nondeterministic by the obviously-right definition; the op then runs for real
from the same state, so the test sees what it would without the oracle. The
set of such op names is written to the JSON file named by ``ORACLE_OUT``.

A verdict of "nondeterministic" from the harness is right only for ops in that
set.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

FOUND: set[str] = set()


def _clone(a: Any) -> Any:
    if isinstance(a, torch.Tensor) and not a.is_meta:
        try:
            return a.detach().clone()
        except Exception:
            return a
    return a


def _bits(out: Any) -> list[bytes]:
    found: list[bytes] = []

    def visit(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.layout == torch.strided and not x.is_meta:
            flat = x.detach().cpu().contiguous().reshape(-1)
            found.append(bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b"")
        return x

    tree_map(visit, out)
    return found


class Oracle(TorchDispatchMode):  # type: ignore[misc]
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        gens = [g for g in [*args, *kwargs.values()] if isinstance(g, torch.Generator)]
        gens.append(torch.default_generator)
        states = [g.get_state() for g in gens]

        def reset() -> None:
            for g, s in zip(gens, states):
                g.set_state(s)

        tries = []
        for _ in range(2):
            reset()
            try:
                tries.append(_bits(func(*tree_map(_clone, args), **tree_map(_clone, kwargs))))
            except Exception:
                tries = []
                break
        if len(tries) == 2 and tries[0] != tries[1]:
            FOUND.add(func.name().split(".", 1)[0])
        reset()
        return func(*args, **kwargs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    with Oracle():
        return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("ORACLE_OUT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(sorted(FOUND), f)
