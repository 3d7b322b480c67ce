"""A float tensor and a copy with chosen elements changed: a row-comparison corpus (tests only)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st

#: What the third kind of change does to an element: flip its sign, or scale it a little.
CHANGES = {"sign": lambda v: -v, "scale": lambda v: v * 1.0001}


def perturbed(
    draw: st.DrawFn,
    *,
    rows: tuple[int, int],
    widths: tuple[int, int],
    specials: Sequence[float],
    marked: int,
    third: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ref, got)``: float16/32/64, ``rows`` rows; ``ref`` holds up to ``marked`` specials.

    ``got`` is ``ref`` with up to six elements changed: set to a special, nudged,
    or changed by ``CHANGES[third]``.
    """
    dtype = draw(st.sampled_from([torch.float16, torch.float32, torch.float64]))
    n = draw(st.integers(*rows))
    shape = (n, *draw(st.lists(st.integers(*widths), max_size=2)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    ref = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    flat = ref.view(-1)
    for i in draw(st.lists(st.integers(0, flat.numel() - 1), max_size=marked)):
        flat[i] = draw(st.sampled_from(specials))
    got = ref.clone()
    flat_got = got.view(-1)
    for i in draw(st.lists(st.integers(0, flat_got.numel() - 1), max_size=6)):
        change = draw(st.sampled_from(["special", "nudge", third]))
        if change == "special":
            flat_got[i] = draw(st.sampled_from(specials))
        elif change == "nudge":
            flat_got[i] = flat_got[i] + draw(st.sampled_from([1e-7, -1e-3, 2.0]))
        else:
            flat_got[i] = CHANGES[third](flat_got[i])
    return ref, got
