"""A zoo of real modules and functions for determinism verdicts, on any device.

Each entry builds, on the given device, a function and its arguments (tensors
that need grads where the op is differentiable). :func:`run_entry` calls it
forward and backward with random upstream gradients, as a test body would.
Everything is built from the global RNG, so a run restored to the same RNG
state builds the same weights and inputs. Sizes are small: the zoo checks
verdicts, not speed.

``KNOWN_NONDETERMINISTIC_CUDA`` names the entries whose CUDA kernels are
nondeterministic by default (they accumulate with atomics), with sizes that give the
atomics contention.

The tests load this file as a module, and copy it into pytester runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Built = tuple[Callable[..., Any], tuple[Any, ...]]


def _x(*shape: int, device: str, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, device=device, requires_grad=grad)


def _module(m: nn.Module, device: str, *shape: int) -> Built:
    m = m.to(device)
    return m, (_x(*shape, device=device),)


def _rnn(kind: type[nn.Module], device: str, **kw: Any) -> Built:
    m = kind(8, 12, num_layers=2, bidirectional=True, batch_first=True, **kw).to(device)
    return (lambda x: m(x)), (_x(3, 5, 8, device=device),)


def _attention(device: str) -> Built:
    m = nn.MultiheadAttention(16, 4, batch_first=True, dropout=0.1).to(device)
    q, k = _x(2, 5, 16, device=device), _x(2, 7, 16, device=device)
    return (lambda q, k: m(q, k, k)), (q, k)


def _decoder(device: str) -> Built:
    m = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.1, batch_first=True).to(device)
    return (lambda t, mem: m(t, mem)), (_x(2, 5, 16, device=device), _x(2, 6, 16, device=device))


def _sdpa(device: str) -> Built:
    shape = (4, 8, 512, 64) if _big(device) else (2, 2, 6, 8)
    q, k, v = (_x(*shape, device=device) for _ in range(3))
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, k, v)


def _embedding_bag(device: str) -> Built:
    m = nn.EmbeddingBag(20, 6, mode="sum").to(device)
    idx = torch.randint(0, 20, (12,), device=device)
    offsets = torch.tensor([0, 3, 7], device=device)
    weights = _x(12, device=device)
    return (lambda w: m(idx, offsets, per_sample_weights=w)), (weights,)


def _embedding(device: str) -> Built:
    m = nn.Embedding(20, 6).to(device)
    idx = torch.randint(0, 20, (4, 5), device=device)
    return (lambda: m(idx)), ()


def _ctc(device: str) -> Built:
    t_len, batch, classes, s_len = 12, 3, 6, 4
    logits = _x(t_len, batch, classes, device=device)
    targets = torch.randint(1, classes, (batch, s_len), device=device)
    in_lens = torch.full((batch,), t_len, dtype=torch.long, device=device)
    tgt_lens = torch.randint(1, s_len + 1, (batch,), device=device)
    return (lambda z: F.ctc_loss(z.log_softmax(2), targets, in_lens, tgt_lens)), (logits,)


def _big(device: str) -> bool:
    """On a GPU, sizes that give atomics contention (nondeterminism shows only then)."""
    return not device.startswith("cpu")


def _indexed(op: str, device: str) -> Built:
    rows, width, n = (64, 32, 200_000) if _big(device) else (40, 6, 100)
    src = _x(n, width, device=device)
    idx = torch.randint(0, rows, (n,), device=device)

    def fn(s: torch.Tensor) -> torch.Tensor:
        base = torch.zeros(rows, width, device=device)
        if op == "index_add":
            return base.index_add(0, idx, s)
        if op == "scatter_add":
            return base.scatter_add(0, idx[:, None].expand(-1, width), s)
        if op == "index_put":
            return base.index_put((idx,), s, accumulate=True)
        if op == "index_select":
            return s.index_select(0, idx)
        return s.gather(0, idx[:, None].expand(-1, width))

    return fn, (src,)


def _sort_like(device: str, kind: str) -> Built:
    x = _x(6, 10, device=device)

    def fn(t: torch.Tensor) -> Any:
        if kind == "sort":
            return t.sort(dim=1)
        if kind == "topk":
            return t.topk(3, dim=1)
        values, inverse, counts = torch.unique(
            (t.detach() * 2).round(), return_inverse=True, return_counts=True
        )
        return values, inverse, counts, t * counts.sum()

    return fn, (x,)


def _linalg(device: str, kind: str) -> Built:
    a = _x(5, 5, device=device)

    def fn(m: torch.Tensor) -> Any:
        if kind == "qr":
            return torch.linalg.qr(m)
        if kind == "svd":
            u, s, vh = torch.linalg.svd(m, full_matrices=False)
            return s, (u @ vh)  # singular vectors alone are sign-ambiguous in backward
        if kind == "eigh":
            sym = m @ m.mT + torch.eye(5, device=device)
            return torch.linalg.eigvalsh(sym), torch.linalg.eigh(sym)[1].abs()
        rhs = torch.randn(5, 2, device=device)
        return torch.linalg.solve(m + 5 * torch.eye(5, device=device), rhs)

    return fn, (a,)


def _grid_sample(device: str) -> Built:
    img = _x(2, 3, 8, 8, device=device)
    side = 256 if _big(device) else 6  # many grid points land on the same input pixels
    grid = (torch.rand(2, side, side, 2, device=device) * 2 - 1).requires_grad_()
    return (lambda i, g: F.grid_sample(i, g, align_corners=False)), (img, grid)


def _fn(f: Callable[..., Any], *shapes: tuple[int, ...]) -> Callable[[str], Built]:
    def build(device: str) -> Built:
        return f, tuple(_x(*s, device=device) for s in shapes)

    return build


ZOO: dict[str, Callable[[str], Built]] = {
    "rnn": lambda d: _rnn(nn.RNN, d),
    "lstm": lambda d: _rnn(nn.LSTM, d),
    "lstm_proj": lambda d: _module(nn.LSTM(8, 12, proj_size=4), d, 5, 3, 8),
    "gru": lambda d: _rnn(nn.GRU, d),
    "lstm_cell": lambda d: _module(nn.LSTMCell(8, 12), d, 4, 8),
    "gru_cell": lambda d: _module(nn.GRUCell(8, 12), d, 4, 8),
    "transformer_encoder_layer": lambda d: _module(
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True), d, 2, 5, 16
    ),
    "transformer_decoder_layer": _decoder,
    "multihead_attention": _attention,
    "scaled_dot_product_attention": _sdpa,
    "conv1d": lambda d: _module(nn.Conv1d(3, 4, 3, padding=1), d, 2, 3, 10),
    "conv2d": lambda d: _module(nn.Conv2d(3, 4, 3, stride=2), d, 2, 3, 9, 9),
    "conv3d": lambda d: _module(nn.Conv3d(2, 3, 3), d, 1, 2, 5, 5, 5),
    "conv_transpose1d": lambda d: _module(nn.ConvTranspose1d(3, 2, 3, stride=2), d, 2, 3, 6),
    "conv_transpose2d": lambda d: _module(nn.ConvTranspose2d(3, 2, 3, stride=2), d, 2, 3, 5, 5),
    "conv_transpose3d": lambda d: _module(
        nn.ConvTranspose3d(2, 2, 3, stride=2),
        d,
        *((4, 2, 16, 16, 16) if _big(d) else (1, 2, 3, 3, 3)),
    ),
    "batch_norm1d_train": lambda d: _module(nn.BatchNorm1d(6), d, 8, 6),
    "batch_norm2d_train": lambda d: _module(nn.BatchNorm2d(3), d, 4, 3, 5, 5),
    "group_norm": lambda d: _module(nn.GroupNorm(2, 4), d, 3, 4, 5, 5),
    "layer_norm": lambda d: _module(nn.LayerNorm(16), d, 4, 16),
    "instance_norm2d": lambda d: _module(nn.InstanceNorm2d(3, affine=True), d, 2, 3, 6, 6),
    "embedding": _embedding,
    "embedding_bag": _embedding_bag,
    "max_pool2d": lambda d: _module(nn.MaxPool2d(3, 2), d, 2, 3, 9, 9),
    "max_pool3d": lambda d: _module(nn.MaxPool3d(2), d, 1, 2, 4, 4, 4),
    "avg_pool2d": lambda d: _module(nn.AvgPool2d(3, 2, padding=1), d, 2, 3, 9, 9),
    "adaptive_avg_pool2d": lambda d: _module(nn.AdaptiveAvgPool2d((3, 2)), d, 2, 3, 8, 7),
    "adaptive_max_pool2d": lambda d: _module(nn.AdaptiveMaxPool2d(3), d, 2, 3, 8, 7),
    "interpolate_bilinear": lambda d: _fn(
        lambda x: F.interpolate(x, scale_factor=2.5, mode="bilinear"),
        (8, 16, 64, 64) if _big(d) else (2, 3, 5, 5),
    )(d),
    "interpolate_nearest": _fn(lambda x: F.interpolate(x, size=(7, 9)), (2, 3, 4, 4)),
    "interpolate_trilinear": _fn(
        lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), (1, 2, 3, 3, 3)
    ),
    "grid_sample": _grid_sample,
    "ctc_loss": _ctc,
    "sort": lambda d: _sort_like(d, "sort"),
    "topk": lambda d: _sort_like(d, "topk"),
    "unique": lambda d: _sort_like(d, "unique"),
    "index_add": lambda d: _indexed("index_add", d),
    "scatter_add": lambda d: _indexed("scatter_add", d),
    "index_put_accumulate": lambda d: _indexed("index_put", d),
    "index_select": lambda d: _indexed("index_select", d),
    "gather": lambda d: _indexed("gather", d),
    "cumsum": _fn(lambda x: x.cumsum(1), (4, 50)),
    "cumprod": _fn(lambda x: x.cumprod(1), (4, 8)),
    "einsum": _fn(lambda a, b: torch.einsum("bij,bjk->bik", a, b), (3, 4, 5), (3, 5, 2)),
    "linalg_qr": lambda d: _linalg(d, "qr"),
    "linalg_svd": lambda d: _linalg(d, "svd"),
    "linalg_eigh": lambda d: _linalg(d, "eigh"),
    "linalg_solve": lambda d: _linalg(d, "solve"),
    "fft_rfft": _fn(lambda x: torch.fft.rfft(x, dim=-1).abs(), (3, 16)),
    "fft_fft2": _fn(lambda x: torch.view_as_real(torch.fft.fft2(x)), (2, 8, 8)),
    "cross_entropy": _fn(
        lambda x: F.cross_entropy(x, torch.arange(4, device=x.device) % 3), (4, 3)
    ),
    "unfold": _fn(lambda x: F.unfold(x, 3, padding=1), (2, 2, 5, 5)),
    "reflection_pad": _fn(lambda x: F.pad(x, (2, 2, 1, 1), mode="reflect"), (2, 3, 5, 5)),
    "cdist": _fn(lambda a, b: torch.cdist(a, b), (5, 3), (4, 3)),
    "dropout": _fn(lambda x: F.dropout(x, 0.3, training=True), (6, 10)),
}


def _racy_index_put(device: str) -> Built:
    # A million updates onto 64 rows: above the parallel grain, so with two or more
    # threads the accumulation order (and the float32 rounding) varies between calls.
    n = 1_000_000
    idx = torch.randint(0, 64, (n,), device=device)
    src = torch.randn(n, device=device)

    def fn(s: torch.Tensor) -> torch.Tensor:
        return torch.zeros(64, device=device).index_put((idx,), s, accumulate=True)

    return fn, (src,)


#: Real CPU races (threads writing the same memory): nondeterministic with two or
#: more threads, caught only sometimes in a few runs. Not in ``ZOO``, whose entries
#: are all deterministic on CPU.
RACY_CPU: dict[str, Callable[[str], Built]] = {
    "index_put_accumulate_1e6": _racy_index_put,
}

#: Entries whose default CUDA kernels are nondeterministic (atomics).
KNOWN_NONDETERMINISTIC_CUDA = (
    "index_add",
    "scatter_add",
    "index_put_accumulate",
    "index_select",  # backward: index_add
    "gather",  # backward: scatter_add
    "interpolate_bilinear",  # backward
    "grid_sample",  # backward
    "scaled_dot_product_attention",  # backward
    "conv_transpose3d",
    "cumsum",
    "reflection_pad",  # backward: reflection_pad2d_backward (atomics; seen on an H200)
    "interpolate_trilinear",  # backward: upsample_trilinear3d_backward (seen on an H200)
    "adaptive_max_pool2d",  # backward: adaptive_max_pool2d_backward (seen on an H200)
)


def run_entry(name: str, device: str = "cpu") -> list[torch.Tensor]:
    """Build entry ``name``, call it, back-propagate random upstream gradients.

    Returns the outputs and the gradients of the inputs and parameters.
    """
    fn, args = ZOO[name](device)
    outputs = [t for t in _leaves(fn(*args)) if isinstance(t, torch.Tensor)]
    diff = [t for t in outputs if t.requires_grad and t.is_floating_point()]
    if diff:
        torch.autograd.backward(diff, [torch.randn_like(t) for t in diff])
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    if isinstance(fn, nn.Module):
        leaves += list(fn.parameters())
    return outputs + [t.grad for t in leaves if t.grad is not None]


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]
