"""Every configuration's run starts from the state ``fn`` found: training steps, RNGs, buffers.

Ordinary code changes state it reads: an optimizer step, a BatchNorm's running
statistics, Python's and NumPy's random draws. Were the second configuration to
start where the first left off, its results would differ with no kernel and no
branch to blame.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from pytest_backends import PathsDisagreeError, assert_paths_agree

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.1, momentum=0.9)


def _step(x: torch.Tensor) -> torch.Tensor:
    OPTIMIZER.zero_grad()
    loss = MODEL(x).pow(2).mean()
    loss.backward()
    OPTIMIZER.step()
    return MODEL[0].weight.detach().clone()


def _train_twice(x: torch.Tensor) -> torch.Tensor:
    """Through a helper: ``fn`` names only the helper, which names the model."""
    _step(x)
    return _step(x)


class Trainer:
    """A user's object holding a model and its optimizer."""

    def __init__(self) -> None:
        torch.manual_seed(1)
        self.model = nn.Linear(8, 4)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.01)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad()
        self.model(x).pow(2).mean().backward()
        self.opt.step()
        return self.model.weight.detach().clone()


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [t.detach().clone() for t in model.state_dict().values()]
    for per_param in opt.state.values():
        tensors += [v.clone() for v in per_param.values() if isinstance(v, torch.Tensor)]
    return tensors


@pytest.mark.parametrize("fn", [_step, _train_twice], ids=["a training step", "through a helper"])
def test_a_training_step_agrees_and_leaves_the_state_as_found(fn: object) -> None:
    x = torch.randn(16, 8)
    _step(x)  # momentum buffers exist: their state must be put back too
    before = _state(MODEL, OPTIMIZER)
    assert_paths_agree(fn, x, axes=["mkldnn"], backward=False)  # type: ignore[arg-type]
    after = _state(MODEL, OPTIMIZER)
    assert len(after) == len(before)
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_trainer_objects_step_agrees() -> None:
    trainer = Trainer()
    x = torch.randn(16, 8)
    assert_paths_agree(trainer.step, x, axes=["mkldnn"], backward=False)
    assert not trainer.opt.state, "the optimizer's state is left as found (empty)"


def test_a_learning_rate_schedule_starts_every_configuration_alike() -> None:
    """The schedule's step sets the rate the optimizer step uses: its epoch is put back too."""
    torch.manual_seed(3)
    net = nn.Linear(8, 4)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def fn(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        schedule.step()  # before the optimizer's step: torch warns, users do it
        opt.step()
        return net.weight.detach().clone()

    with pytest.warns(UserWarning, match="lr_scheduler.step"):
        assert_paths_agree(fn, torch.randn(16, 8), axes=["mkldnn"], backward=False)
    assert schedule.last_epoch == 0 and opt.param_groups[0]["lr"] == 1.0


def test_buffers_a_run_updates_and_reads_agree() -> None:
    """A train-mode pass updates BatchNorm's running statistics, which an eval pass reads."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))

    def fn(x: torch.Tensor) -> torch.Tensor:
        net.train()
        net(x)
        net.eval()
        return net(x)

    net.eval()
    assert_paths_agree(fn, torch.randn(16, 8), axes=["mkldnn"], backward=False)
    assert not net.training, "the module's mode is left as found"


def test_python_and_numpy_draws_agree() -> None:
    """Each configuration draws the same numbers from Python's and NumPy's generators."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * random.random() + torch.from_numpy(np.random.rand(8).astype(np.float32))

    state = random.getstate()
    assert_paths_agree(fn, torch.randn(4, 8), axes=["mkldnn"], backward=False)
    assert random.getstate() == state


def test_a_profiler_range_is_no_branch() -> None:
    """A ``record_function`` handle is a new object each run: never named as a differing value."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("block"):
            y = x * 2
        return y if torch.backends.mkldnn.enabled else y + 1  # THE-BRANCH

    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(fn, torch.randn(4, 8), axes=["mkldnn"], backward=False)
    text = str(info.value)
    assert "profiler::" not in text.split("\n")[1], text
    assert "aten::add at " in text and "ran under mkldnn-off only" in text, text
