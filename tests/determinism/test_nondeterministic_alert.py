"""expect_nondeterministic_alert with real CPU ops that do and do not alert."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pytest_backends import AlertExpectationError, expect_nondeterministic_alert


def _put() -> object:
    # put_ without accumulate has no deterministic kernel on any device.
    return torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))


def _max_unpool() -> object:
    pooled, indices = torch.nn.functional.max_pool2d(
        torch.randn(1, 1, 4, 4), 2, return_indices=True
    )
    return torch.nn.functional.max_unpool2d(pooled, indices, (2, 2))


def _put_accumulate() -> object:
    return torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), accumulate=True)


def _index_add() -> object:
    return torch.zeros(3).index_add_(0, torch.tensor([0, 1, 1]), torch.ones(3))


ALERTING: list[Callable[[], object]] = [_put, _max_unpool]
QUIET: list[Callable[[], object]] = [_put_accumulate, _index_add, lambda: torch.randn(4).cumsum(0)]


@pytest.mark.parametrize("fn", ALERTING, ids=lambda f: f.__name__)
def test_alerting_cpu_ops(fn: Callable[[], object]) -> None:
    expect_nondeterministic_alert(fn)
    with pytest.raises(AlertExpectationError, match="expected no nondeterministic-op alert"):
        expect_nondeterministic_alert(fn, should_alert=False)


@pytest.mark.parametrize("fn", QUIET, ids=["put_accumulate", "index_add", "cumsum"])
def test_quiet_cpu_ops(fn: Callable[[], object]) -> None:
    expect_nondeterministic_alert(fn, should_alert=False)
    with pytest.raises(AlertExpectationError, match="but it returned normally"):
        expect_nondeterministic_alert(fn, should_alert=True)


def test_flags_are_restored() -> None:
    torch.use_deterministic_algorithms(False)
    expect_nondeterministic_alert(_put)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


def test_warn_only_mode_is_checked_separately() -> None:
    """An fn that alerts only when errors are raised fails the warn_only half."""

    def raises_but_never_warns() -> None:
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            _put()

    with pytest.raises(AlertExpectationError, match=r"warn_only=True.*no such warning"):
        expect_nondeterministic_alert(raises_but_never_warns)


def test_other_errors_propagate() -> None:
    def broken() -> None:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        expect_nondeterministic_alert(broken)


def test_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        expect_nondeterministic_alert(_put())  # type: ignore[arg-type]
