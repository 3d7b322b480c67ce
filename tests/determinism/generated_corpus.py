"""A generated corpus of ordinary test bodies, and the verdict each must get.

A body is a list of steps drawn from a vocabulary of ordinary user code, each
rewriting ``x`` (a (4, 8) float32 tensor from the seeded global generator):
layers and ops (linear, conv1d, a channels_last conv2d, an embedding lookup,
index_add, softmax, cumsum, sort), layouts (a transposed copy), dtypes (a
bfloat16 round trip, integer ``argmax`` outputs), training
(an optimizer step on a parameter), data (a shuffling ``DataLoader``),
randomness (``torch.randn``, dropout, :mod:`random`, NumPy seeded), and the
inputs the proof rule is about: NumPy's unseeded generator writing a buffer or
a tensor's own memory, and a thread drawing from torch's global generator
while the test does. A step may be the planted nondeterministic op
``pbtest::noisy`` (``planted_ops.py``). A quarter of the bodies are rendered as
``unittest.TestCase`` methods.

What each body's verdict must be follows from its steps (:func:`expected`):
with the planted op and no outside input, the test fails, the planted op
blamed; with no planted op, no op is blamed, and with no outside input either,
the test passes. Where an outside input is present the harness may say "not
checked"; it never passes a body with the planted op or with values that
differ between runs, and never blames a body without the planted op.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

#: Step name -> source lines (indented by the renderer); each reads and rewrites ``x``.
STEPS: dict[str, str] = {
    "linear": "x = torch.nn.functional.linear(x, torch.full((8, 8), 0.125) + torch.eye(8))",
    "conv1d": (
        "x = torch.nn.functional.conv1d(x.unsqueeze(1), torch.tensor([[[0.25, 0.5, 0.25]]]),"
        " padding=1).squeeze(1)"
    ),
    "conv2d_channels_last": (
        "x = torch.nn.functional.conv2d(x.reshape(4, 2, 2, 2).contiguous("
        "memory_format=torch.channels_last), torch.full((2, 2, 1, 1), 0.5)).reshape(4, 8)"
    ),
    "embedding": "x = x + torch.nn.functional.embedding(x.argmax(-1), torch.eye(8) * 0.1)",
    "index_add": "x = x.index_add(0, torch.tensor([0, 1, 1, 3]), x)",
    "softmax": "x = x.softmax(-1)",
    "cumsum": "x = x.cumsum(-1)",
    "sort": "x = x.sort(-1).values",
    "transposed": "x = x.t().contiguous().t()",
    "bfloat16": "x = x.to(torch.bfloat16).float()",
    "argmax": "x = x + x.argmax(-1, keepdim=True).float()",
    "inplace": "x = x.clone()\nx.mul_(0.5).add_(1.0)",
    "optimizer": (
        "p = torch.nn.Parameter(torch.ones(8))\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "(x * p).sum().backward()\n"
        "opt.step()\n"
        "x = x * p.detach()"
    ),
    "dataloader": (
        "loader = DataLoader(TensorDataset(x), batch_size=2, shuffle=True)\n"
        "x = torch.cat([b for (b,) in loader])"
    ),
    "randn": "x = x + torch.randn(4, 8)",
    "dropout": "x = torch.nn.functional.dropout(x, 0.5, training=True)",
    "python_random": "x = x + random.random()",
    "numpy_seeded": (
        "np.random.seed(1)\nx = x + torch.from_numpy(np.random.rand(4, 8).astype(np.float32))"
    ),
    "numpy_unseeded": (
        "x = x + torch.from_numpy(np.random.default_rng().random((4, 8), dtype=np.float32))"
    ),
    "numpy_writes_tensor": (
        "x = x.contiguous().clone()\n"
        "x.numpy()[:] += np.random.default_rng().random((4, 8), dtype=np.float32)\n"
        "x = x * 2"
    ),
    "thread": (
        "worker = threading.Thread(target=_draws, name='augmenter')\n"
        "worker.start()\n"
        "for _ in range(20):\n"
        "    x = x + torch.randn(4, 8) * 1e-3\n"
        "worker.join()"
    ),
    "noisy": "x = torch.ops.pbtest.noisy(x)",
}

#: Steps whose input comes from outside torch's reproducible state: values that differ
#: between runs (NumPy's unseeded generator), or may (another thread's draws).
DIFFERS = frozenset({"numpy_unseeded", "numpy_writes_tensor"})
MAY_DIFFER = frozenset({"thread"})

HEADER = """\
import random
import threading
import unittest

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


def _draws():
    for _ in range(200):
        torch.randn(16)
"""


@dataclass(frozen=True)
class Body:
    """One generated test: its steps, in order; a ``unittest.TestCase`` method or a function."""

    steps: tuple[str, ...]
    testcase: bool = False

    @property
    def planted(self) -> bool:
        """Whether the planted nondeterministic op runs."""
        return "noisy" in self.steps

    @property
    def outside(self) -> bool:
        """Whether an input comes from outside torch's reproducible state."""
        return any(s in DIFFERS or s in MAY_DIFFER for s in self.steps)


def bodies() -> st.SearchStrategy[Body]:
    """Bodies of 1 to 5 steps, a quarter of them ``unittest.TestCase`` methods."""
    steps = st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5).map(tuple)
    return st.builds(Body, steps, st.sampled_from([False, False, False, True]))


def nodeid(i: int, body: Body) -> str:
    """The node id of body ``i`` in the module :func:`render` writes (``test_generated.py``)."""
    if body.testcase:
        return f"test_generated.py::TestCase{i}::test_body"
    return f"test_generated.py::test_case_{i}"


def render(cases: list[Body]) -> str:
    """The source of a test module with one test per body (see :func:`nodeid`)."""
    parts = [HEADER]
    for i, body in enumerate(cases):
        lines = ["x = torch.randn(4, 8)"]
        for step in body.steps:
            lines += STEPS[step].splitlines()
        lines.append("assert x.shape == (4, 8)")
        if body.testcase:
            head = [f"class TestCase{i}(unittest.TestCase):", "    def test_body(self):"]
            indent = "        "
        else:
            head, indent = [f"def test_case_{i}():"], "    "
        head.append(indent + "# steps: " + ", ".join(body.steps))
        parts.append("\n\n" + "\n".join(head + [indent + line for line in lines]) + "\n")
    return "".join(parts)


def expected(body: Body) -> frozenset[str]:
    """The verdicts the harness may give ``body``: a subset of PASSED, FAILED, not checked."""
    if body.planted and not body.outside:
        return frozenset({"FAILED"})
    if body.planted:
        return frozenset({"FAILED", "not checked"})
    if not body.outside:
        return frozenset({"PASSED"})
    if any(s in DIFFERS for s in body.steps):
        return frozenset({"not checked"})  # the runs' values differ: a pass would be green
    return frozenset({"PASSED", "not checked"})
