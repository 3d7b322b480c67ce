"""assert_reproducible on real torch ops, with planted nondeterminism on CPU."""

from __future__ import annotations

import itertools
import random
from types import ModuleType

import pytest
import torch

from pytest_backends import NotReproducibleError, assert_reproducible


def _mlp() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 3)
    )


def test_deterministic_model_with_dropout_passes() -> None:
    model = _mlp()
    x = torch.randn(5, 6, requires_grad=True)
    assert_reproducible(model, x, runs=4)


def test_nested_outputs_and_scalars_pass() -> None:
    x = torch.randn(3, 4, requires_grad=True)

    def fn(t: torch.Tensor) -> object:
        noise = torch.randn(4)  # reseeded identically every run
        mean = float(t.detach().mean())
        return {"y": (t * noise).sin(), "parts": [t.cos(), t.argmax()], "mean": mean}

    assert_reproducible(fn, x)


def test_planted_noisy_output_is_named(planted: ModuleType) -> None:
    x = torch.randn(8)
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(lambda t: (t.sin(), {"noisy": planted.noisy(t)}), x, runs=3)
    err = info.value
    assert err.what == "output[1]['noisy']"
    assert err.run == 1
    assert "output[1]['noisy'] differs between run 0 and run 1" in str(err)


def test_planted_backward_caught_by_random_upstream_grads(planted: ModuleType) -> None:
    x = torch.randn(32, requires_grad=True)
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(lambda t: planted.spread(t, 16), x)
    assert info.value.what == "grad of args[0]"
    assert "grad of args[0] differs between run 0 and run 1" in str(info.value)


def test_sum_upstream_grads_would_miss_the_planted_backward(planted: ModuleType) -> None:
    """The same op, differentiated through ``.sum()``: an all-ones gradient hides it."""
    x = torch.randn(32, requires_grad=True)
    assert_reproducible(lambda t: planted.spread(t, 16).sum(), x)

    # The same contrast without the harness: 5 backward passes each way.
    def grads(upstream: torch.Tensor | None) -> set[bytes]:
        seen: set[bytes] = set()
        for _ in range(5):
            x.grad = None
            y = planted.spread(x, 16)
            if upstream is None:
                y.sum().backward()
            else:
                y.backward(upstream)
            assert x.grad is not None
            seen.add(x.grad.numpy().tobytes())
        return seen

    assert len(grads(None)) == 1
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    assert len(grads(g)) > 1


def test_parameter_gradient_is_named(planted: ModuleType) -> None:
    class Spreader(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = planted.spread(self.proj(x), 16)
            return out

    # Which grads differ depends on the data and on the planted op's rotation
    # counter; fix both so the outcome does not depend on test order.
    torch.manual_seed(0)
    planted._backward_calls = itertools.count()
    model = Spreader()
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(model, torch.randn(8, 4))
    assert info.value.what == "grad of parameter 'proj.weight'"
    assert "also differing in run 1: grad of parameter 'proj.bias'" in str(info.value)
    # A bound method of the module finds the same parameters.
    with pytest.raises(NotReproducibleError, match=r"parameter 'proj\.weight'"):
        assert_reproducible(model.forward, torch.randn(8, 4))


def test_leaves_captured_by_a_closure_are_checked(planted: ModuleType) -> None:
    proj = torch.nn.Linear(4, 4)
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(lambda x: planted.spread(proj(x), 16), torch.randn(8, 4))
    assert info.value.what.startswith("grad of leaf #")
    assert "float32[4, 4]" in info.value.what or "float32[4]" in info.value.what
    assert proj.weight.grad is None and proj.bias.grad is None

    model = _mlp()
    assert_reproducible(lambda x: model(x), torch.randn(5, 6), runs=3)
    assert all(p.grad is None for p in model.parameters())


def test_backward_false_skips_gradients(planted: ModuleType) -> None:
    x = torch.randn(32, requires_grad=True)
    assert_reproducible(lambda t: planted.spread(t, 16), x, backward=False)
    assert x.grad is None


def test_grads_are_cleared_between_runs_and_restored() -> None:
    model = _mlp()
    before = [torch.full_like(p, 7.0) for p in model.parameters()]
    for p, g in zip(model.parameters(), before):
        p.grad = g
    # Accumulating into .grad across runs would make runs differ: clearing is required.
    assert_reproducible(model, torch.randn(5, 6), runs=3)
    for p, g in zip(model.parameters(), before):
        assert p.grad is g


def test_rng_state_is_restored_after_the_call() -> None:
    torch.manual_seed(123)
    random.seed(123)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(123)
    assert_reproducible(lambda: (torch.rand(5), random.random()), seed=7)
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]


def test_python_random_is_reseeded_per_run() -> None:
    assert_reproducible(lambda: torch.tensor(random.random()), runs=3)
    assert_reproducible(lambda: torch.tensor(random.random()), runs=3, seed=None)


def test_unseeded_state_between_runs_is_detected() -> None:
    counter = iter(range(100))
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(lambda: next(counter) * 0.5, runs=2)
    assert info.value.what == "output"


def test_changed_output_structure_is_reported() -> None:
    calls = iter(range(100))
    with pytest.raises(NotReproducibleError, match="different structure"):
        assert_reproducible(lambda: [torch.ones(1)] * (1 + next(calls)), runs=2)


@pytest.mark.parametrize("runs", [0, 1, 2.5, True])
def test_invalid_runs(runs: object) -> None:
    with pytest.raises(ValueError, match="runs must be an int >= 2"):
        assert_reproducible(torch.sin, torch.ones(1), runs=runs)  # type: ignore[arg-type]


def test_bitwise_comparison_distinguishes_negative_zero() -> None:
    signs = iter([1.0, -1.0])
    with pytest.raises(NotReproducibleError):
        assert_reproducible(lambda: torch.zeros(2) * next(signs), runs=2)


def test_failures_show_the_callers_frame_not_the_plugins(
    planted_conftest: pytest.Pytester,
) -> None:
    """``__tracebackhide__``: the traceback ends at the user's call, with the message."""
    planted_conftest.makepyfile(
        test_user="""
        import itertools
        import torch
        from pytest_backends import assert_reproducible, expect_nondeterministic_alert

        def test_noisy():
            assert_reproducible(torch.ops.pbtest.noisy, torch.ones(3), backward=False)

        def test_structure():
            sizes = itertools.count(1)
            assert_reproducible(lambda: [torch.ones(1)] * next(sizes))

        def test_alert():
            expect_nondeterministic_alert(lambda: torch.ones(2).add(1))
        """
    )
    result = planted_conftest.runpytest_subprocess("--tb=long")
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            ">*assert_reproducible(torch.ops.pbtest.noisy, torch.ones(3), backward=False)",
            "E*NotReproducibleError: assert_reproducible: output differs between run 0 and run 1*",
            ">*assert_reproducible(lambda: [[]torch.ones(1)[]] * next(sizes))",
            "E*NotReproducibleError: assert_reproducible: run 1 returned a different structure*",
            ">*expect_nondeterministic_alert(lambda: torch.ones(2).add(1))",
            "E*AlertExpectationError: expected fn to raise*",
        ]
    )
    # No line of the plugin's source is shown: its frames are hidden.
    for internal in ("_check_runs", "raise NotReproducibleError", "_call_raising", "api.py:"):
        assert internal not in out, out
