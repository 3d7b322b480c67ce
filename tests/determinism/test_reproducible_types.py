"""assert_reproducible compares every leaf it is given, or says why it cannot."""

from __future__ import annotations

import itertools
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from pytest_backends import NotReproducibleError, assert_reproducible

np = pytest.importorskip("numpy")

_calls = itertools.count()


def _noise() -> float:
    """A value that changes on every call: planted nondeterminism outside torch's RNGs."""
    return next(_calls) * 1e-3


@dataclass
class State:
    weight: torch.Tensor
    steps: int


Pair = namedtuple("Pair", ["mean", "spread"])


@pytest.mark.parametrize(
    ("fn", "what"),
    [
        (lambda: np.ones(4) + _noise(), "output"),
        (lambda: [np.float64(1.0), np.ones(3, dtype=np.float32) * (1 + _noise())], "output[1]"),
        (lambda: State(torch.ones(2) + _noise(), 3), "output.weight"),
        (lambda: State(torch.ones(2), next(_calls)), "output.steps"),
        (lambda: Pair(torch.zeros(1), torch.ones(2) * _noise()), "output.spread"),
        (lambda: {"a": [1.5, (2, 0.25 + _noise())]}, "output['a'][1][1]"),
        (lambda: complex(1, _noise()), "output"),
    ],
    ids=[
        "ndarray",
        "numpy-in-list",
        "dataclass",
        "dataclass-int",
        "namedtuple",
        "nested",
        "complex",
    ],
)
def test_noisy_leaf_of_every_supported_kind_is_caught(fn: object, what: str) -> None:
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(fn, runs=3)  # type: ignore[arg-type]
    assert info.value.what == what


def test_equal_leaves_of_every_kind_pass() -> None:
    def fn() -> object:
        x = torch.randn(3)
        return {
            "array": x.numpy().copy(),
            "scalar": np.float32(2.5),
            "state": State(x * 2, 1),
            "pair": Pair(x.mean(), x.std()),
            "misc": [None, "label", b"raw", True, 3, 2.0, 1j],
        }

    assert_reproducible(fn, runs=3)


def _generator() -> Iterator[torch.Tensor]:
    yield torch.ones(2) + _noise()


class Opaque:
    def __init__(self) -> None:
        self.value = torch.ones(2) + _noise()


@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (lambda: {1.0 + _noise()}, r"output of type set"),
        (lambda: (torch.ones(1), _generator()), r"output\[1\] of type generator"),
        (lambda: {"model": Opaque()}, r"output\['model'\] of type Opaque"),
        (
            lambda: [np.array(["a", object()], dtype=object)],
            r"output\[0\], a NumPy array of dtype object",
        ),
    ],
    ids=["set", "generator", "object", "object-array"],
)
def test_values_that_cannot_be_compared_raise_type_error(fn: object, pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        assert_reproducible(fn, runs=2)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensor_and_mkldnn_layout_give_a_clear_error() -> None:
    def nested() -> object:
        return [torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])]

    with pytest.raises(TypeError, match=r"output\[0\] is a nested tensor.*unbind"):
        assert_reproducible(nested, runs=2, backward=False)

    def opaque() -> object:
        return {"m": torch.ones(2, 2).to_mkldnn()}

    with pytest.raises(TypeError, match=r"output\['m'\] has layout torch._mkldnn.*to_dense"):
        assert_reproducible(opaque, runs=2, backward=False)


@pytest.mark.filterwarnings("ignore:Sparse")
@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "bsr"])
def test_sparse_outputs_are_compared_by_their_stored_form(layout: str) -> None:
    """Indices, values, layout and size, bitwise: equal ones pass, a changed value fails."""
    dense = torch.eye(4)

    def sparse(scale: float = 1.0) -> torch.Tensor:
        x = dense * scale
        if layout == "bsr":
            return x.to_sparse_bsr((2, 2))
        return x.to_sparse_csr() if layout == "csr" else getattr(x, f"to_sparse_{layout}")()

    assert_reproducible(lambda: {"adj": sparse()}, runs=3, backward=False)
    with pytest.raises(NotReproducibleError, match=r"output\['adj'\] differs"):
        assert_reproducible(lambda: {"adj": sparse(1.0 + _noise())}, runs=3, backward=False)
    with pytest.raises(NotReproducibleError, match="output differs"):
        assert_reproducible(lambda: torch.sparse_coo_tensor([[0]], [1.0], (2 + next(_calls),)))


def test_sparse_gradients_are_compared() -> None:
    """``nn.Embedding(sparse=True)`` has a sparse weight gradient: digested, not a crash."""
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    assert_reproducible(embedding, torch.tensor([1, 2, 2]), runs=3)

    def noisy(idx: torch.Tensor) -> torch.Tensor:
        return embedding(idx) * (1.0 + _noise())

    with pytest.raises(NotReproducibleError, match="also differing in run 1: grad of leaf #0"):
        assert_reproducible(noisy, torch.tensor([1, 2, 2]), runs=3)


def test_non_tensor_arguments_are_still_accepted() -> None:
    """Arguments are only searched for tensors that need grads: other values are fine."""
    x = torch.randn(3, requires_grad=True)
    assert_reproducible(lambda t, opts, fmt: t * opts["scale"], x, {"scale": 2.0}, {1, 2})
