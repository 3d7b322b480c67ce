"""A small realistic suite of deterministic tests, one per construct the recorder meets.

Copied into pytester runs as ``test_constructs.py``: every test passes plainly and must
pass under ``--backends-determinism-all``. Compiled tests use tiny functions and the
``aot_eager`` backend, which runs the same Dynamo and AOTAutograd stages as Inductor
(Dynamo's check for dispatch modes is the same for every backend) without a C++ build.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch.func import grad, jacrev, vmap


@torch.library.custom_op("suite::scale", mutates_args=())
def scale(x: torch.Tensor, k: float) -> torch.Tensor:
    """``x * k``, as a custom op."""
    return x * k


@scale.register_fake
def _scale_fake(x: torch.Tensor, k: float) -> torch.Tensor:
    return torch.empty_like(x)


scale.register_autograd(
    lambda ctx, g: (g * ctx.k, None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "k", inputs[1]),
)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Counter(torch.nn.Module):
    """A solver-style module counting its evaluations in Python state."""

    def __init__(self) -> None:
        super().__init__()
        self.nfe = 0
        self.lin = torch.nn.Linear(4, 4).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.nfe += 1
        return torch.tanh(self.lin(x))


counter = Counter()


@pytest.mark.backends(deterministic=["on"])
def test_compiled_fullgraph():
    f = torch.compile(lambda x: x.sin() + 1, backend="aot_eager", fullgraph=True)
    x = torch.randn(8)
    torch.testing.assert_close(f(x), x.sin() + 1)


def test_compiled_graph_break():
    def f(x):
        y = x.cos() * 2
        torch._dynamo.graph_break()
        return scale(y, 3.0).sum()

    compiled = torch.compile(f, backend="aot_eager")
    x = torch.randn(6)
    torch.testing.assert_close(compiled(x), f(x))


def test_compiled_module_backward():
    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, 4, requires_grad=True)
    y = compiled(x)
    y.backward(torch.randn_like(y))
    assert x.grad is not None and net.lin.weight.grad is not None


def test_scripted():
    @torch.jit.script
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + x.sum()

    x = torch.randn(5)
    assert torch.equal(f(x), torch.relu(x) * 2 + x.sum())


def test_traced_check_inputs():
    net = Net()
    traced = torch.jit.trace_module(
        net, {"forward": torch.randn(2, 4)}, check_inputs=[{"forward": torch.randn(3, 4)}]
    )
    x = torch.randn(2, 4)
    torch.testing.assert_close(traced(x), net(x))


def test_traced_check_reports_mismatch():
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.sum().item()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(torch.jit.TracingCheckError):
            torch.jit.trace_module(
                DataDependent(),
                {"forward": torch.ones(2, 3)},
                check_inputs=[{"forward": torch.full((2, 3), 2.0)}],
            )


def test_export():
    net = Net()
    x = torch.randn(2, 4)
    exported = torch.export.export(net, (x,))
    torch.testing.assert_close(exported.module()(x), net(x))


def test_custom_op_backward():
    x = torch.randn(4, requires_grad=True)
    y = scale(x, 2.5)
    y.backward(torch.randn_like(y))
    assert x.grad is not None


def test_autograd_function():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = torch.randn(5, requires_grad=True)
    Square.apply(x).backward(torch.randn(5))
    assert x.grad is not None


def test_func_transforms():
    x = torch.randn(3)
    torch.testing.assert_close(grad(lambda t: t.sin().sum())(x), x.cos())
    assert vmap(torch.outer)(torch.randn(2, 3), torch.randn(2, 3)).shape == (2, 3, 3)
    assert jacrev(torch.tanh)(x).shape == (3, 3)


def test_hooks():
    net = Net()
    handle = net.register_forward_hook(lambda mod, args, out: out * 2)
    x = torch.randn(2, 4, requires_grad=True)
    x.register_hook(lambda g: g * 3)
    net(x).sum().backward()
    handle.remove()
    assert x.grad is not None


def test_threads():
    results = {}

    def work():
        results["y"] = torch.randn(4, generator=torch.Generator().manual_seed(1)).exp()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert results["y"].add(1).min() > 1


def test_python_state():
    counter(torch.randn(2, 4, dtype=torch.double))
    torch.full((1,), float(counter.nfe)).add(1)
