"""Ordinary user code for the outcome-equality test (loaded as a test module in pytester runs).

Every case ends with ``plant(result)``: with ``PLANT=1`` in the environment it
passes its result through the planted nondeterministic op ``pbtest::noisy``,
otherwise it returns the result unchanged.
"""

from __future__ import annotations

import copy
import itertools
import os
import unittest
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytest_backends import assert_close, reference


def plant(t: torch.Tensor) -> torch.Tensor:
    """``t``, through the planted nondeterministic op when ``PLANT=1``."""
    if os.environ.get("PLANT") == "1":
        return torch.ops.pbtest.noisy(t)  # type: ignore[no-any-return]
    return t


@pytest.mark.parametrize("mode", ["circular", "reflect", "replicate"])
def test_padding(mode: str) -> None:
    x = torch.randn(1, 2, 5, 5)
    y = F.pad(x, (1, 1, 1, 1), mode=mode)
    assert y.shape == (1, 2, 7, 7)
    plant(y * 2)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_dataloader(workers: int) -> None:
    ds = TensorDataset(torch.arange(40.0).reshape(20, 2))
    total = torch.zeros(())
    for (batch,) in DataLoader(ds, batch_size=4, num_workers=workers):
        total = total + batch.sum()
    assert total.item() == 780.0
    plant(total)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def test_seeded_generator_fixture(gen: torch.Generator) -> None:
    x = torch.randn(16, generator=gen)
    idx = torch.randperm(16, generator=gen)
    assert x[idx].shape == (16,)
    plant(x[idx])


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_deepcopy_model() -> None:
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(3, 4)
    assert torch.equal(model(x), twin(x))
    plant(twin(x))


def test_load_state_dict_from_checkpoint() -> None:
    model = _model()
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    other = _model()
    other.load_state_dict(checkpoint)
    x = torch.randn(3, 4)
    assert torch.equal(model(x), other(x))
    plant(other(x))


def test_optimizer_step() -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward(torch.randn(()))
        opt.step()
    plant(model(x))


def test_ema_update() -> None:
    model = _model()
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
    plant(ema(torch.randn(2, 4)))


def test_dropout() -> None:
    drop = nn.Dropout(0.5)
    y = drop(torch.ones(100))
    assert 0 < int((y == 0).sum()) < 100
    plant(y)


def test_batchnorm_train_mode() -> None:
    bn = nn.BatchNorm1d(4)
    bn.train()
    x = torch.randn(16, 4)
    y = bn(x)
    y.backward(torch.randn_like(y))
    assert bn.running_mean.abs().sum() > 0
    plant(y)


def test_reference_conv_batchnorm() -> None:
    m = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4))
    x = torch.randn(2, 2, 8, 8)
    out = m(x)
    assert_close(out, reference(m, x))
    plant(out)


class TestCaseClass(unittest.TestCase):
    def test_passes(self) -> None:
        plant(torch.ones(3) * 2)

    def test_fails(self) -> None:
        self.assertEqual(torch.ones(2).sum().item(), 3.0)

    def test_skipped(self) -> None:
        self.skipTest("not here")

    @unittest.expectedFailure
    def test_xfail(self) -> None:
        self.assertEqual(1, 2)


if hasattr(pytest, "Subtests"):  # pytest >= 9 has the subtests fixture built in

    def test_subtests(subtests: Any) -> None:
        for k in range(3):
            with subtests.test(k=k):
                plant(torch.full((2,), float(k)) + 1)


def test_numpy_observation_buffer() -> None:
    # A policy reads a shared observation buffer that an unseeded environment fills in place.
    import numpy as np

    obs = torch.zeros(4)
    env_view = obs.numpy()
    policy = nn.Linear(4, 2)
    policy(obs).sum()
    env_view[:] = np.random.default_rng().random(4)
    plant(policy(obs))


def test_from_numpy_buffer_seeded() -> None:
    import numpy as np

    arr = np.zeros(4, dtype=np.float32)
    buf = torch.from_numpy(arr)
    (buf + 1).sum()
    arr[:] = np.random.default_rng(0).random(4)
    plant(buf * 2)


def test_augmentation_thread() -> None:
    # A thread draws from the global generator while the test draws from it too. Each
    # of the test's draws and each of the thread's holds a lock, so the number of the
    # thread's draws before each of the test's draws is known exactly: that sequence
    # fixes the generator's state at every draw of the test. With THREAD_LOG set, each
    # run appends its sequence there, for the corpus test to tell which verdict the
    # interleaving of that session calls for.
    import threading

    stop = threading.Event()
    lock = threading.Lock()
    drawn = [0]

    def augment() -> None:
        while not stop.is_set():
            with lock:
                torch.rand(1)
                drawn[0] += 1

    worker = threading.Thread(target=augment, name="augmenter", daemon=True)
    worker.start()
    seen = []
    try:
        noise = []
        for _ in range(50):
            with lock:
                seen.append(drawn[0])
                noise.append(torch.randn(8))
    finally:
        stop.set()
        worker.join()
    log = os.environ.get("THREAD_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(" ".join(map(str, seen)) + "\n")
    plant(noise[-1])


_DRAWS = itertools.count(1)


def test_augmentation_thread_before_draws() -> None:
    # The thread draws a different number of times in every run (a count kept between
    # runs) and ends before the test draws: the generator's state at the test's first
    # draw differs between runs in every session, so "not checked", naming the thread.
    import threading

    draws = next(_DRAWS)
    worker = threading.Thread(target=lambda: [torch.rand(1) for _ in range(draws)], name="aug2")
    worker.start()
    worker.join()
    plant(torch.randn(8))


def test_augmentation_thread_fixed_draws() -> None:
    # The same thread drawing the same count in every run: every run's draws start from
    # the same state, so the test is checked in every session.
    import threading

    worker = threading.Thread(target=lambda: [torch.rand(1) for _ in range(3)], name="aug3")
    worker.start()
    worker.join()
    plant(torch.randn(8))


@pytest.mark.backends_leaks("off")
def test_flags_changed_after_use() -> None:
    # Left changed on purpose (the guard puts them back after the test): a later run
    # of the determinism check must still start from the flags the test started with.
    x = torch.randn(1, 3, 8, 8)
    w = torch.randn(4, 3, 3, 3)
    y = F.conv2d(x, w)
    z = torch.full((4,), 1e-40) * 1
    torch.backends.mkldnn.enabled = False
    torch.set_flush_denormal(True)
    plant(y.sum() + z.sum())


_COUNTER = itertools.count()


def test_not_repeatable() -> None:
    x = torch.full((2,), float(next(_COUNTER)))
    plant(x * 2)
