"""A brute-force batch-invariance oracle and a generated corpus of functions to run it on.

The oracle runs ``fn`` on the full batch and on every slice of each size
(every row alone, every offset), each slice taken from the input in its own
memory layout (``x.narrow``: strides, memory format and addresses kept), and
compares every output leaf: the same paths, dtypes and shapes but for the
batch dimension, and bitwise equal rows. Every call gets fresh copies of the
inputs (as they are laid out), so no call sees another's writes. It is slow
and obviously right.

The corpus builds functions from ordinary layers and ops (linear, conv,
norms, pooling, reductions over non-batch dimensions, ``arange`` indexing,
argmax, embedding, attention, elementwise, a tensor every row shares that
some ops write in place, ops that read the other rows: a softmax, cumulative
sum or sort over the batch, a roll along it), inputs with random layouts
(contiguous, channels_last, transposed, expanded, non-zero storage offset),
dtypes (float32, bfloat16, int64, bool), batch sizes 2 to 64, the batch
dimension first or not, and outputs as tensors, tuples and dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode


def _leaves(value: object, path: str = "out") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}[{k!r}]")]
    if isinstance(value, (list, tuple)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, value)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def same_rows(full: object, sub: object, out_dim: int, start: int, size: int) -> bool:
    """Whether ``sub`` equals rows ``start .. start + size`` of ``full``, leaf by leaf, bitwise."""
    a, b = _leaves(full), _leaves(sub)
    if [p for p, _ in a] != [p for p, _ in b]:
        return False
    for (_, x), (_, y) in zip(a, b):
        if x is None or y is None:
            if (x is None) != (y is None):
                return False
            continue
        if x.dtype != y.dtype or x.dim() != y.dim() or y.shape[out_dim] != size:
            return False
        rows = x.narrow(out_dim, start, size)
        if rows.shape != y.shape or not torch.equal(_bits(rows), _bits(y)):
            return False
    return True


def tmap(value: object, f: Callable[[torch.Tensor], object]) -> object:
    """``value`` with ``f`` applied to every tensor in it (through lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return f(value)
    if isinstance(value, dict):
        return {k: tmap(v, f) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(tmap(v, f) for v in value)
    return value


def batch_size(inputs: Sequence[object], dims: Sequence[int | None]) -> int:
    """The size of the first batched input's (first tensor's) batch dimension."""
    x, d = next((x, d) for x, d in zip(inputs, dims) if d is not None)
    t = next(t for _, t in _leaves(x) if isinstance(t, torch.Tensor))
    return int(t.shape[d])  # type: ignore[index]


def sliced(
    inputs: Sequence[object], dims: Sequence[int | None], start: int, size: int
) -> list[object]:
    """Fresh copies of ``inputs``, each batched one narrowed to rows ``start .. start + size``."""
    return [
        x if d is None else tmap(x, lambda t, d=d: t.narrow(d, start, size))  # type: ignore[misc]
        for x, d in zip(fresh(inputs), dims)
    ]


def oracle(
    fn: Callable[..., object],
    inputs: Sequence[object],
    dims: Sequence[int | None],
    out_dim: int,
    sizes: Sequence[int],
    starts: Callable[[int, int], Sequence[int]] | None = None,
) -> tuple[bool, int | None]:
    """``(invariant, first differing slice size)`` over every offset of every size below N.

    ``starts(n, size)``, where given, names the offsets instead.
    """
    n = batch_size(inputs, dims)
    # Every call starts from the same generator state, as the check promises.
    rng = torch.get_rng_state()
    with torch.no_grad():
        full = fn(*fresh(inputs))
        for size in sorted({s for s in sizes if s < n}):
            for start in range(n - size + 1) if starts is None else starts(n, size):
                torch.set_rng_state(rng)
                if not same_rows(
                    full, fn(*sliced(inputs, dims, start, size)), out_dim, start, size
                ):
                    torch.set_rng_state(rng)
                    return False, size
    torch.set_rng_state(rng)
    return True, None


def fresh(inputs: Sequence[object]) -> list[object]:
    """Every tensor of ``inputs`` copied as it is laid out: each call starts from the same values,
    whatever an earlier call wrote in place."""
    return [tmap(x, clone_as_is) for x in inputs]


def same_bits(a: object, b: object) -> bool:
    """Whether two inputs hold the same bits (tensors) or are equal (anything else)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))
    if isinstance(a, (dict, list, tuple)) or isinstance(b, (dict, list, tuple)):
        la, lb = _leaves(a), _leaves(b)
        return [p for p, _ in la] == [p for p, _ in lb] and all(
            same_bits(x, y) for (_, x), (_, y) in zip(la, lb)
        )
    return a is b or a == b


def clone_as_is(a: torch.Tensor) -> torch.Tensor:
    """A copy of ``a`` in its own memory with the same sizes, strides and storage offset.

    ``Tensor.clone`` makes an expanded (stride 0) or offset view dense, and a
    kernel may take another path for the dense copy than for the view.
    """
    storage = a.untyped_storage().clone()
    return torch.empty(0, dtype=a.dtype, device=a.device).set_(
        storage, a.storage_offset(), a.shape, a.stride()
    )


class _Calls(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Keeps every call (with tensor arguments copied as they are laid out) of the ops named."""

    def __init__(self, names: set[str] | None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.names = names
        self.calls: list[tuple[Any, list[Any], dict[str, Any], Any]] = []
        self.seen: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func.name().split(".", 1)[0]
        tensors = [a for a in _leaves([list(args), kwargs]) if isinstance(a[1], torch.Tensor)]
        self.seen.append((name, [t for _, t in tensors]))
        # One copy per distinct tensor, laid out as it is: an op may take another path for
        # aliased arguments (multi-head attention's fused projection for query is key is
        # value) or for an expanded one (a GEMM over stride-0 rows).
        clones: dict[int, torch.Tensor] = {}
        clone = [
            clones.setdefault(id(a), clone_as_is(a)) if isinstance(a, torch.Tensor) else a
            for a in args
        ]
        out = func(*args, **kwargs)
        if self.names is not None and name in self.names:
            self.calls.append((func, clone, dict(kwargs), out))
        return out


def replay_args(args: Sequence[object], n: int, start: int, size: int) -> list[object]:
    """``args`` with every batch-sized tensor narrowed to the rows, one view per distinct tensor.

    An argument passed twice (``query is key``) stays one tensor passed twice.
    """
    views: dict[int, torch.Tensor] = {}
    return [
        views.setdefault(id(a), a.narrow(0, start, size))
        if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == n
        else a
        for a in args
    ]


def op_rows_differ(
    fn: Callable[..., object],
    inputs: Sequence[object],
    dims: Sequence[int | None],
    op: str,
    start: int,
    size: int,
) -> bool | None:
    """Replay ``op``'s calls of the full batch on rows ``start .. start + size``: do they differ?

    None when a call could not be replayed: no argument has the batch in dim 0,
    or narrowing every batch-sized argument gave a call the op refuses (a weight
    whose first dimension happens to equal the batch size), so that call, which
    may be the blamed one, proves nothing either way.
    """
    n = batch_size(inputs, dims)
    mode = _Calls({op})
    with torch.no_grad(), mode:
        fn(*inputs)
    replayed = unreplayable = False
    for func, args, kwargs, out in mode.calls:
        if not any(isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == n for a in args):
            continue
        sub = replay_args(args, n, start, size)
        try:
            got = func(*sub, **kwargs)
        except Exception:
            unreplayable = True
            continue
        outs = [o for _, o in _leaves(out) if isinstance(o, torch.Tensor)]
        gots = [o for _, o in _leaves(got) if isinstance(o, torch.Tensor)]
        for a, b in zip(outs, gots):
            if a.dim() and a.shape[0] == n and b.dim() and b.shape[0] == size:
                replayed = True
                if not torch.equal(_bits(a.narrow(0, start, size)), _bits(b)):
                    return True
    return False if replayed and not unreplayable else None


def op_draws(fn: Callable[..., object], inputs: Sequence[object], op: str) -> bool:
    """Whether ``op``'s outputs differ between two runs of ``fn`` one after the other."""
    runs = []
    for _ in range(2):
        mode = _Calls({op})
        with torch.no_grad(), mode:
            fn(*fresh(inputs))
        runs.append([o for *_, out in mode.calls for _, o in _leaves(out)])
    first, second = runs
    return len(first) == len(second) and any(
        isinstance(a, torch.Tensor) and not same_bits(a, b) for a, b in zip(first, second)
    )


def _others_changed(x: torch.Tensor, d: int, rows: Sequence[int]) -> torch.Tensor:
    """A copy of ``x``, laid out as ``x`` is, with every row along ``d`` but ``rows`` holding
    other values (``x`` itself where its rows share memory: they cannot differ)."""
    if x.stride(d) == 0 and x.shape[d] > 1:
        return x
    out = clone_as_is(x)
    for r in range(x.shape[d]):
        if r not in rows:
            row = out.select(d, r)
            for k in range(row.dim()):  # each element of the row's memory once
                if row.stride(k) == 0:
                    row = row.narrow(k, 0, 1)
            row.copy_(row * -1.5 + 0.75)
    return out


def reads_other_rows(
    fn: Callable[..., object],
    inputs: Sequence[object],
    dims: Sequence[int | None],
    out_dim: int,
    rows: Sequence[int],
) -> bool:
    """Whether ``fn``'s output ``rows`` change when every other row of the inputs changes.

    Only floating-point batched inputs are changed (an index changed at random
    would be out of range).
    """
    with torch.no_grad():
        base = fn(*fresh(inputs))
        changed = [
            x
            if d is None
            else tmap(
                x,
                lambda t, d=d: _others_changed(t, d, rows) if t.is_floating_point() else t,  # type: ignore[misc]
            )
            for x, d in zip(fresh(inputs), dims)
        ]
        other = fn(*changed)
    index = torch.tensor(list(rows))
    for (_, a), (_, b) in zip(_leaves(base), _leaves(other)):
        if (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dim() > out_dim
            and not torch.equal(
                _bits(a.index_select(out_dim, index)), _bits(b.index_select(out_dim, index))
            )
        ):
            return True
    return False


def op_reads_other_rows(
    fn: Callable[..., object],
    inputs: Sequence[object],
    dims: Sequence[int | None],
    op: str,
    start: int,
    size: int,
) -> bool:
    """Whether a call of ``op`` in the full batch gives other rows ``start .. start + size``
    when every other row of its batched floating-point arguments changes.

    An argument is batched when the same call in the sub-batch's run got it
    with ``size`` rows where the full batch's got ``n`` (a weight whose first
    dimension happens to be ``n`` has it in both).
    """
    n = batch_size(inputs, dims)
    full, sub = _Calls({op}), _Calls({op})
    with torch.no_grad():
        with full:
            fn(*fresh(inputs))
        with sub:
            fn(*sliced(inputs, dims, start, size))
    keep = range(start, start + size)
    for (func, args, kwargs, out), (_, sub_args, _, _) in zip(full.calls, sub.calls):
        copies: dict[int, object] = {}  # one changed copy per distinct tensor: aliases stay
        changed = [
            copies.setdefault(id(a), _others_changed(a, 0, keep))
            if isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.is_floating_point()
            and a.dim()
            and a.shape[0] == n
            and b.shape[0] == size
            else a
            for a, b in zip(args, sub_args)
        ]
        try:
            got = func(*changed, **kwargs)
        except Exception:
            continue
        outs = [o for _, o in _leaves(out) if isinstance(o, torch.Tensor)]
        gots = [o for _, o in _leaves(got) if isinstance(o, torch.Tensor)]
        for a, b in zip(outs, gots):
            if (
                a.dim()
                and a.shape[0] == n
                and a.shape == b.shape
                and not torch.equal(
                    _bits(a.narrow(0, start, size)), _bits(b.narrow(0, start, size))
                )
            ):
                return True
    return False


def ops_with_batch_rows(
    fn: Callable[..., object], inputs: Sequence[object], dims: Sequence[int | None]
) -> tuple[set[str], set[str]]:
    """Op names run with a tensor input that has a batch-sized dimension, and all op names."""
    n = batch_size(inputs, dims)
    mode = _Calls(None)
    with torch.no_grad(), mode:
        fn(*inputs)
    batched = {name for name, ts in mode.seen if any(n in t.shape for t in ts)}
    return batched, {name for name, _ in mode.seen}


# --- the corpus -------------------------------------------------------------------------------


@dataclass
class Case:
    """One generated function with its inputs."""

    label: str
    fn: Callable[..., object]
    inputs: list[object]
    dims: list[int | None]
    out_dim: int


def _layout(x: torch.Tensor, kind: str, draw: Any) -> torch.Tensor:
    """``x`` (batch in dim 0) laid out as ``kind``, with the same values."""
    if kind == "channels_last" and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if kind == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    if kind == "offset":
        pad = draw(st.integers(1, 7), label="offset")
        flat = torch.cat([torch.zeros(pad, dtype=x.dtype), x.reshape(-1)])
        return flat[pad:].view(x.shape)
    if kind == "expanded" and x.dim() >= 2:
        return x.narrow(-1, 0, 1).expand(x.shape)
    return x


def _float(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def _wrap(out: Any, kind: str) -> Any:
    if kind == "tuple":
        return (out, None) if out.dtype == torch.bool else (out, out * 2)
    if kind == "dict":
        return {"out": out, "flag": out != 0}
    return out


@st.composite
def cases(draw: Any) -> Case:
    """A generated function, its inputs and their batch dims; the inputs maybe in a container.

    A container (a dict, as a tokenizer gives, or a tuple) holds every input
    where all are batched along one dimension: the function unpacks it.
    """
    case = _case(draw)
    d = case.dims[0]
    if d is None or any(x != d for x in case.dims) or len(case.inputs) < 2:
        return case
    kind = draw(st.sampled_from(["arguments", "arguments", "dict", "tuple"]), label="inputs")
    fn, k = case.fn, len(case.inputs)
    if kind == "dict":
        keys = [f"in{i}" for i in range(k)]
        return Case(
            f"{case.label} from a dict",
            lambda b: fn(*(b[key] for key in keys)),
            [dict(zip(keys, case.inputs))],
            [d],
            case.out_dim,
        )
    if kind == "tuple":
        return Case(
            f"{case.label} from a tuple", lambda b: fn(*b), [tuple(case.inputs)], [d], case.out_dim
        )
    return case


def _case(draw: Any) -> Case:
    n = draw(st.integers(2, 64), label="batch")
    seed = draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16]), label="dtype")
    layout = draw(
        st.sampled_from(["contiguous", "channels_last", "transposed", "expanded", "offset"]),
        label="layout",
    )
    family = draw(
        st.sampled_from(["flat", "flat", "image", "sequence", "ids", "mask", "shared"]),
        label="family",
    )
    wrap = draw(st.sampled_from(["tensor", "tuple", "dict"]), label="output")
    helper = draw
    f = draw(st.integers(3, 24), label="features")

    if family == "image":
        c = draw(st.sampled_from([2, 4, 8]), label="channels")
        hw = draw(st.integers(3, 9), label="hw")
        x = _layout(_float((n, c, hw, hw), dtype, gen), layout, helper)
        op = draw(
            st.sampled_from(
                ["conv", "groupnorm", "batchnorm_eval", "avgpool", "maxpool", "sum123", "relu"]
            ),
            label="op",
        )
        mods: dict[str, Any] = {
            "conv": torch.nn.Conv2d(c, 4, 3, padding=1),
            "groupnorm": torch.nn.GroupNorm(2, c),
            "batchnorm_eval": torch.nn.BatchNorm2d(c).eval(),
        }
        for m in mods.values():
            m.to(dtype)

        def body(t: torch.Tensor) -> torch.Tensor:
            if op in mods:
                return mods[op](t).flatten(1)
            if op == "avgpool":
                return torch.nn.functional.adaptive_avg_pool2d(t, 1).flatten(1)
            if op == "maxpool":
                return torch.nn.functional.max_pool2d(t, 2, ceil_mode=True).flatten(1)
            if op == "sum123":
                return t.sum((1, 2, 3))
            return torch.relu(t).flatten(1)

        label = f"image {op}"
        return Case(
            f"{label} n={n} {dtype} {layout} {wrap}",
            lambda t: _wrap(body(t), wrap),
            [x],
            [0],
            0,
        )

    if family == "sequence":
        s = draw(st.integers(1, 6), label="seq")
        e = draw(st.sampled_from([4, 8, 16]), label="embed")
        x = _layout(_float((n, s, e), dtype, gen), layout, helper)
        op = draw(st.sampled_from(["sdpa", "mha", "layernorm", "lastpool"]), label="op")
        mha = torch.nn.MultiheadAttention(e, 2, batch_first=True).to(dtype).eval()
        norm = torch.nn.LayerNorm(e).to(dtype)

        def seq(t: torch.Tensor) -> torch.Tensor:
            if op == "sdpa":
                return torch.nn.functional.scaled_dot_product_attention(t, t, t)
            if op == "mha":
                return mha(t, t, t, need_weights=False)[0]
            if op == "layernorm":
                return norm(t)
            return t[torch.arange(t.shape[0]), -1]  # last-token pooling

        return Case(
            f"sequence {op} n={n} s={s} {dtype} {layout} {wrap}",
            lambda t: _wrap(seq(t), wrap),
            [x],
            [0],
            0,
        )

    if family == "ids":
        s = draw(st.integers(1, 6), label="seq")
        ids = torch.randint(0, 10, (n, s), generator=gen)
        ids = _layout(ids, layout if layout != "channels_last" else "contiguous", helper)
        emb = torch.nn.Embedding(10, 8).to(dtype)
        op = draw(st.sampled_from(["embed_mean", "embed_argmax", "onehot"]), label="op")

        def tokens(t: torch.Tensor) -> torch.Tensor:
            if op == "embed_mean":
                return emb(t).mean(1)
            if op == "embed_argmax":
                return emb(t).sum(1).argmax(-1)
            return torch.nn.functional.one_hot(t, 10).sum(1)

        return Case(
            f"ids {op} n={n} {layout} {wrap}", lambda t: _wrap(tokens(t), wrap), [ids], [0], 0
        )

    if family == "mask":
        x = _float((n, f), dtype, gen)
        mask = _layout(torch.rand((n, f), generator=gen) > 0.5, layout, helper)
        op = draw(st.sampled_from(["where", "any", "count"]), label="op")

        def masked(t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            if op == "where":
                return torch.where(m, t, torch.zeros_like(t))
            if op == "any":
                return m.any(-1)
            return m.sum(-1)

        return Case(
            f"mask {op} n={n} {dtype} {layout} {wrap}",
            lambda t, m: _wrap(masked(t, m), wrap),
            [x, mask],
            [0, 0],
            0,
        )

    if family == "shared":  # a tensor every row shares (dim None), written in place by some ops
        x = _layout(_float((n, f), dtype, gen), layout, helper)
        w = _float((f,), dtype, gen)
        op = draw(
            st.sampled_from(["scale", "scale_in_place", "shift_in_place", "table"]), label="op"
        )

        def shared(t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if op == "scale":
                return t * v
            if op == "scale_in_place":
                return t * v.add_(1)
            if op == "shift_in_place":
                v.mul_(2)
                return t + v
            return v[(t.abs() * 3).long().clamp(max=f - 1)]  # a lookup in the shared table

        return Case(
            f"shared {op} n={n} {dtype} {layout} {wrap}",
            lambda t, v: _wrap(shared(t, v), wrap),
            [x, w],
            [0, None],
            0,
        )

    # flat: (n, f), possibly with the batch in dim 1
    batch_dim = draw(st.sampled_from([0, 0, 1]), label="batch dim")
    x = _layout(_float((n, f), dtype, gen), layout, helper)
    op = draw(
        st.sampled_from(
            [
                "linear",
                "mlp",
                "softmax",
                "sigmoid",
                "elementwise",
                "sum",
                "cumsum",
                "argmax",
                "compare",
                "pick",
                "layernorm",
                "div_by_batch",
                "center",
                "softmax_over_batch",
                "cumsum_over_batch",
                "roll_along_batch",
                "sort_over_batch",
                "dropout_train",
                "noise",
            ]
        ),
        label="op",
    )
    lin = torch.nn.Linear(f, 5).to(dtype)
    mlp = torch.nn.Sequential(torch.nn.Linear(f, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    mlp.to(dtype)
    norm = torch.nn.LayerNorm(f).to(dtype)
    labels = torch.randint(0, f, (n,), generator=gen)

    def flat(t: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
        if op == "linear":
            return lin(t)
        if op == "mlp":
            return mlp(t)
        if op == "softmax":
            return t.softmax(-1)
        if op == "sigmoid":
            return torch.sigmoid(t)
        if op == "elementwise":
            return torch.tanh(t) * 3 + t.exp()
        if op == "sum":
            return t.sum(-1, keepdim=True)
        if op == "cumsum":
            return t.cumsum(-1)
        if op == "argmax":
            return lin(t).argmax(-1)
        if op == "compare":
            return t > 0
        if op == "pick":
            return t[torch.arange(t.shape[0]), lab]
        if op == "layernorm":
            return norm(t)
        if op == "div_by_batch":
            return t / t.shape[0]
        if op == "softmax_over_batch":
            return t.softmax(0)
        if op == "cumsum_over_batch":
            return t.cumsum(0)
        if op == "roll_along_batch":
            return t + t.roll(1, 0)
        if op == "sort_over_batch":
            return t.sort(0).values
        if op == "dropout_train":
            return torch.nn.functional.dropout(lin(t), 0.25, training=True)
        if op == "noise":
            return t.tanh() + torch.randn_like(t)
        return t - t.mean(0)

    if batch_dim == 1:
        xt = x.t()

        def fn(t: torch.Tensor, lab: torch.Tensor) -> Any:
            return _wrap(flat(t.t(), lab), wrap)

        return Case(f"flat {op} n={n} {dtype} {layout} dim1 {wrap}", fn, [xt, labels], [1, 0], 0)
    return Case(
        f"flat {op} n={n} {dtype} {layout} {wrap}",
        lambda t, lab: _wrap(flat(t, lab), wrap),
        [x, labels],
        [0, 0],
        0,
    )
