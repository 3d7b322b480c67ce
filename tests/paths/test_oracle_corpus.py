"""The blamed op must equal a brute-force oracle's on a hypothesis corpus of op chains.

The oracle replays *every* op of the reference run under both configurations
on identical (the reference's) inputs and takes the first whose two results
differ beyond the op's bound.  The fast verdict replays only the ops whose
recorded results differ.  ``PATHS_CORPUS_EXAMPLES`` raises the example count
(``make bench``), and ``PYTEST_BACKENDS_CORPUS_SEEDED=1`` with ``--hypothesis-seed``
draws other examples than CI's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from paths_corpus import check_counts, corpus

from pytest_backends.paths.api import (
    ConfigRun,
    _compare_outputs,
    _replay,
    _run,
    _with_outputs,
    first_divergence,
)
from pytest_backends.paths.record import Identity

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)

ON = ("mkldnn-on", {"mkldnn.enabled": True})
OFF = ("mkldnn-off", {"mkldnn.enabled": False})
COUNTS = {"cases": 0, "blamed": 0, "disagreements": 0}


@torch.library.custom_op("paths_oracle::plant", mutates_args=())
def plant(x: torch.Tensor, amount: float) -> torch.Tensor:
    """Adds ``amount`` only while oneDNN is enabled."""
    return x + (amount if torch.backends.mkldnn.enabled else 0.0)


plant.register_autograd(lambda ctx, grad: (grad, None))


@torch.library.custom_op("paths_oracle::plant_first", mutates_args=())
def plant_first(x: torch.Tensor) -> torch.Tensor:
    """Adds 10 to the first element of the last dimension only while oneDNN is enabled."""
    y = x.clone()
    if torch.backends.mkldnn.enabled:
        y[..., 0] += 10.0
    return y


plant_first.register_autograd(lambda ctx, grad: grad)

_W = torch.Generator().manual_seed(7)
CONV_W = torch.randn(4, 4, 3, 3, generator=_W) * 0.3
LIN_W = torch.randn(4 * 6 * 6, 4 * 6 * 6, generator=_W) * 0.05

STEPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "conv": lambda x: F.conv2d(x, CONV_W, padding=1),
    "linear": lambda x: F.linear(x.flatten(1), LIN_W).view_as(x),
    "relu": torch.relu,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "softmax": lambda x: x.softmax(-1),
    "scale": lambda x: x * 3.0 + 1.0,
    "plant_big": lambda x: plant(x, 1e-2),
    "plant_tiny": lambda x: plant(x, 1e-9),
    "plant_first": plant_first,
}


def _chain(names: list[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        for name in names:
            x = STEPS[name](x)
        return x

    return fn


def oracle(ref: ConfigRun, other: ConfigRun) -> Identity | None:
    """Replay every op of the reference under both configurations; the first that parts."""
    for record in ref.records:
        if record.name.startswith(("aten::empty", "aten::new_empty")):
            continue
        mine, theirs = _replay(record, ref.flags), _replay(record, other.flags)
        if mine is None or theirs is None:
            continue
        baseline = _with_outputs(record, mine)
        if not _compare_outputs(record, theirs, baseline, ref, other)[0]:
            return record.identity
    return None


@corpus
@given(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=6), st.booleans())
def test_blamed_op_equals_the_oracle(names: list[str], backward: bool) -> None:
    x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(len(names)))
    x.requires_grad_(backward)
    fn = _chain(names)
    ref = _run(fn, (x,), ON[0], ON[1], "cpu", backward)
    other = _run(fn, (x,), OFF[0], OFF[1], "cpu", backward)
    fast = first_divergence(ref, other)
    slow = oracle(ref, other)
    COUNTS["cases"] += 1
    COUNTS["blamed"] += slow is not None
    fast_id = None if fast is None else (fast.op, fast.module, fast.site, fast.occurrence)
    if fast_id != slow:
        COUNTS["disagreements"] += 1
    assert fast_id == slow, (names, fast, slow)
    planted = [n for n in names if n in ("plant_big", "plant_first")]
    if planted:  # the first planted step beyond its bound is where the paths part
        op = {"plant_big": "paths_oracle::plant", "plant_first": "paths_oracle::plant_first"}
        assert fast is not None and fast.op == op[planted[0]], (names, fast)


#: Results that are not floats, compared exactly by the oracle.
EXACT: dict[str, Callable[[torch.Tensor], object]] = {
    "argmax": lambda y: y.flatten(1).argmax(1),
    "positive": lambda y: y > 0.5,
    "count": lambda y: int((y > 0.5).sum()),
    "mixed": lambda y: {"top": y.flatten(1).argmax(1), "n": (y > 0.5).sum(1)},
}


def _exact_leaves(out: object) -> list[object]:
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(out)
    return [str(spec), *(x.tolist() if isinstance(x, torch.Tensor) else x for x in leaves)]


@corpus
@given(
    st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5),
    st.sampled_from(sorted(EXACT)),
)
def test_results_that_are_not_floats_agree_only_when_equal(names: list[str], kind: str) -> None:
    """assert_paths_agree's verdict on integer, bool and Python results: the exact oracle's."""
    from pytest_backends import PathsDisagreeError, assert_paths_agree

    x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(len(names)))
    chain = _chain(names)

    def fn(t: torch.Tensor) -> object:
        return EXACT[kind](chain(t))

    from pytest_backends.flags import override_flags

    seen = []
    for flags in (ON[1], OFF[1]):
        with override_flags(flags), torch.no_grad():
            seen.append(_exact_leaves(fn(x.clone())))
    try:
        assert_paths_agree(fn, x, axes={"mkldnn": ["on", "off"]}, backward=False)
        verdict = True
    except PathsDisagreeError:
        verdict = False
    COUNTS["exact cases"] = COUNTS.get("exact cases", 0) + 1
    COUNTS["exact differ"] = COUNTS.get("exact differ", 0) + (seen[0] != seen[1])
    if verdict != (seen[0] == seen[1]):
        COUNTS["disagreements"] += 1
    assert verdict == (seen[0] == seen[1]), (names, kind)


def test_corpus_counts() -> None:
    """Runs after the corpus (file order): report the counts."""
    check_counts("paths oracle", COUNTS, "cases", "blamed")
