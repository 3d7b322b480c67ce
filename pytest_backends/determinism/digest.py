"""Bitwise digests of tensors, computed on the tensor's device.

``digest(t)`` returns a 128-bit hash of ``t``'s exact bits as an ``int64``
tensor of shape ``(2,)`` on ``t``'s device, without a host sync. The hash
covers the dtype, the shape and every byte of the elements in logical
(row-major) order, so two tensors get the same digest exactly when they are
bitwise equal, up to a 2**-64-per-lane chance of an accidental collision.
``-0.0`` and ``0.0`` differ, as do NaNs with different payloads.

The native extension (``native/``, loaded by :mod:`pytest_backends._native`)
computes it with a threaded CPU kernel or a CUDA kernel. Without the extension,
the same algorithm runs as torch operations on the tensor's device: the values
are identical, only slower. See ``docs/explanation/digest.rst``.

The algorithm, per lane ``L`` in ``(0, 1)``: the bytes, zero-padded to a
multiple of 8, are read as little-endian 64-bit words ``w[i]``; each word is
keyed by its position, ``x = w[i] ^ (i * K_L + S_L)``, and contributes
``r_L(x) + lo32(x) * hi32(x)`` (``r_0`` the identity, ``r_1`` a swap of the
32-bit halves); ``data`` is the sum of the terms mod ``2**64``. A header hash
``h`` chains ``mix_L`` over ``(version, dtype code, ndim, *shape, nbytes)``;
the lane is ``mix_L(h ^ data)``. ``mix_0`` is MurmurHash3's 64-bit finalizer,
``mix_1`` is Stafford's variant 13 (the SplitMix64 finalizer). Each term costs
one 32x32->64-bit multiply, so the native kernels run at memory speed; a single
flipped bit changes exactly one term, always; the position key makes the
digest order-sensitive; and a sum parallelises without ordering constraints,
so the digest is itself deterministic on every device.
"""

from __future__ import annotations

import contextlib
import contextvars
import struct
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_backends import _tree

if TYPE_CHECKING:
    import torch

__all__ = [
    "DIGEST_SIZE",
    "NativeDigestUnavailableWarning",
    "backend",
    "digest",
    "digest_bytes",
    "digest_many",
    "repeat",
    "use_python_fallback",
]

#: Bytes in one host digest (two 64-bit lanes).
DIGEST_SIZE = 16

_FORMAT_VERSION = 2
_MASK64 = (1 << 64) - 1
# Words hashed per step of the torch-ops fallback; bounds its temporary memory.
_CHUNK_WORDS = 1 << 21


class NativeDigestUnavailableWarning(UserWarning):
    """The native digest extension could not be built or loaded.

    Digests are then computed with torch operations: the values are the same,
    the determinism harness is slower.
    """


# Per lane: position key multiplier K, seed S, and the mixer
# (shift1, mult1, shift2, mult2, shift3). Mirrored in native/digest.h.
_LANES: tuple[tuple[int, int, tuple[int, int, int, int, int]], ...] = (
    (
        0x9E3779B97F4A7C15,
        0x243F6A8885A308D3,
        (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33),
    ),
    (
        0xD6E8FEB86659FD93,
        0x13198A2E03707344,
        (30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31),
    ),
)

# Stable dtype codes: c10::ScalarType enum values (append-only in PyTorch).
# Mirrored in native/digest.h, which uses the enum directly.
_DTYPE_CODES: dict[str, int] = {
    "uint8": 0,
    "int8": 1,
    "int16": 2,
    "int32": 3,
    "int64": 4,
    "float16": 5,
    "float32": 6,
    "float64": 7,
    "complex32": 8,
    "complex64": 9,
    "complex128": 10,
    "bool": 11,
    "bfloat16": 15,
    "bits1x8": 18,
    "bits2x4": 19,
    "bits4x2": 20,
    "bits8": 21,
    "bits16": 22,
    "float8_e5m2": 23,
    "float8_e4m3fn": 24,
    "float8_e5m2fnuz": 25,
    "float8_e4m3fnuz": 26,
    "uint16": 27,
    "uint32": 28,
    "uint64": 29,
    "float8_e8m0fnu": 44,
    "float4_e2m1fn_x2": 45,
}

_force_python: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pytest_backends_digest_force_python", default=False
)
# Process-level: whether the "native unavailable" warning was already given.
_warned: list[bool] = [False]


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _mix_int(x: int, mixer: tuple[int, int, int, int, int]) -> int:
    s1, m1, s2, m2, s3 = mixer
    x &= _MASK64
    x ^= x >> s1
    x = (x * m1) & _MASK64
    x ^= x >> s2
    x = (x * m2) & _MASK64
    x ^= x >> s3
    return x


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix_tensor(x: torch.Tensor, mixer: tuple[int, int, int, int, int]) -> torch.Tensor:
    s1, m1, s2, m2, s3 = mixer
    x = x ^ _lsr(x, s1)
    x = x * _signed(m1)
    x = x ^ _lsr(x, s2)
    x = x * _signed(m2)
    return x ^ _lsr(x, s3)


def _lane_terms(x: torch.Tensor, lane: int) -> torch.Tensor:
    """The data terms of keyed words ``x``: ``r_L(x) + lo32(x) * hi32(x)`` (mod 2**64)."""
    hi = _lsr(x, 32)
    product = (x & 0xFFFFFFFF) * hi  # wraps like the uint64 product in C++
    if lane == 0:
        return x + product
    return ((x << 32) | hi) + product


def dtype_code(dtype: torch.dtype) -> int:
    """The stable integer code of ``dtype`` mixed into its digests."""
    name = str(dtype).removeprefix("torch.")
    try:
        return _DTYPE_CODES[name]
    except KeyError:
        raise TypeError(f"digest: unsupported dtype {dtype}") from None


def _header_words(t: torch.Tensor, nbytes: int) -> list[int]:
    return [_FORMAT_VERSION, dtype_code(t.dtype), t.dim(), *t.shape, nbytes]


def _header_hash(words: Sequence[int], lane: int) -> int:
    _, seed, mixer = _LANES[lane]
    h = seed
    for w in words:
        h = _mix_int(h ^ (w & _MASK64), mixer)
    return h


def _check_digestible(t: torch.Tensor) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"digest: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"digest: only strided tensors are supported, got layout {t.layout}")
    if t.is_quantized:
        raise TypeError("digest: quantized tensors are not supported (digest t.int_repr())")
    if t.device.type == "meta":
        raise TypeError("digest: meta tensors have no data to digest")


def _logical_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in logical order, as a flat uint8 tensor."""
    import torch

    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    if flat.dtype.itemsize == 0:  # pragma: no cover - no such dtype today
        raise TypeError(f"digest: unsupported dtype {t.dtype}")
    return flat.view(torch.uint8)


def _python_digest(t: torch.Tensor) -> torch.Tensor:
    """The digest computed with torch ops on ``t``'s device (same values as native)."""
    import torch

    _check_digestible(t)
    data = _logical_bytes(t)
    nbytes = data.numel()
    header = _header_words(t, nbytes)
    full = nbytes // 8
    device = data.device
    accs = [torch.zeros((), dtype=torch.int64, device=device) for _ in _LANES]

    def add_words(words: torch.Tensor, start: int) -> None:
        index = torch.arange(start, start + words.numel(), dtype=torch.int64, device=device)
        for lane, (key, seed, _) in enumerate(_LANES):
            keyed = words ^ (index * _signed(key) + _signed(seed))
            accs[lane] = accs[lane] + _lane_terms(keyed, lane).sum()

    if full:
        body = data[: full * 8]
        if body.storage_offset() % 8:
            body = body.clone()
        words = body.view(torch.int64)
        for start in range(0, full, _CHUNK_WORDS):
            add_words(words[start : start + _CHUNK_WORDS], start)
    if nbytes > full * 8:
        tail = torch.zeros(8, dtype=torch.uint8, device=device)  # zero padding
        tail[: nbytes - full * 8] = data[full * 8 :]
        add_words(tail.view(torch.int64), full)
    lanes = [
        _mix_tensor(acc ^ _signed(_header_hash(header, lane)), _LANES[lane][2])
        for lane, acc in enumerate(accs)
    ]
    return torch.stack(lanes)


def _native_ops() -> Any | None:
    """The loaded native extension module, or None (warning once) when unavailable."""
    from pytest_backends import _native

    module = _native.load()
    if module is None and not _warned[0] and not _native.disabled():
        _warned[0] = True
        reason = _native.unavailable_reason() or "unknown reason"
        # Shown, never raised: a missing extension must not fail the test that
        # first asked for a digest, even under -W error / filterwarnings = error.
        with warnings.catch_warnings():
            warnings.simplefilter("default", NativeDigestUnavailableWarning)
            warnings.warn(
                "pytest_backends: the native digest extension is unavailable "
                f"({reason}); digests use torch operations instead, so the determinism "
                "harness is slower. Run `python -m pytest_backends build-native` to see why.",
                NativeDigestUnavailableWarning,
                stacklevel=5,
            )
    return module


def _use_native(requested: str | None) -> bool:
    if requested is None:
        requested = "python" if _force_python.get() else "auto"
    if requested == "python":
        return False
    if requested not in ("auto", "native"):
        raise ValueError(f"backend must be 'auto', 'native' or 'python', got {requested!r}")
    module = _native_ops()
    if module is None and requested == "native":
        from pytest_backends import _native

        raise RuntimeError(
            f"pytest_backends native extension unavailable: {_native.unavailable_reason()}"
        )
    return module is not None


def backend() -> str:
    """``"native"`` when digests run in the compiled extension, else ``"python"``.

    Asking may load (and, the first time on a machine, build) the extension.
    """
    return "native" if _use_native(None) else "python"


@contextlib.contextmanager
def use_python_fallback(enabled: bool = True) -> Iterator[None]:
    """Within the block, compute digests with torch ops instead of the extension."""
    token = _force_python.set(enabled)
    try:
        yield
    finally:
        _force_python.reset(token)


# The native op (an OpOverload), cached once the extension is loaded: digest()
# runs once per op output in the determinism harness, so its path is kept short.
_native_digest: list[Any] = [None]


def _native_digest_op(requested: str | None) -> Any | None:
    if not _use_native(requested):
        return None
    import torch

    _native_digest[0] = torch.ops.pytest_backends.digest.default
    return _native_digest[0]


def digest(t: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """The 128-bit digest of ``t`` as an int64 tensor of shape ``(2,)`` on ``t``'s device.

    ``backend`` is ``"native"`` (the extension, an error if unavailable),
    ``"python"`` (torch ops) or ``"auto"``/None (native when available).
    Unsupported inputs (sparse, quantized, meta, not a tensor) raise TypeError.
    """
    op = _native_digest[0]
    if op is None or backend is not None or _force_python.get():
        op = _native_digest_op(backend)
        if op is None:
            return _python_digest(t)
    try:
        usable = not t.is_meta
    except AttributeError:
        usable = False
    if usable:
        try:
            result: torch.Tensor = op(t)
            return result
        except NotImplementedError:
            _check_digestible(t)  # a clearer TypeError for unsupported inputs
            if backend == "native":
                raise
            # A device without a native kernel (e.g. mps): same values from torch ops.
            return _python_digest(t)
        except RuntimeError:
            _check_digestible(t)
            raise
    _check_digestible(t)
    raise AssertionError("unreachable: _check_digestible rejects this input")  # pragma: no cover


def _to_host(digests: Sequence[torch.Tensor]) -> list[bytes]:
    """Copy many digest tensors to the host with one transfer per device."""
    import torch

    by_device: dict[torch.device, list[int]] = {}
    for i, d in enumerate(digests):
        by_device.setdefault(d.device, []).append(i)
    out: list[bytes] = [b""] * len(digests)
    for indices in by_device.values():
        host = torch.stack([digests[i] for i in indices]).cpu().tolist()
        for i, pair in zip(indices, host):
            out[i] = struct.pack("<2q", *pair)
    return out


def digest_bytes(t: torch.Tensor, *, backend: str | None = None) -> bytes:
    """The digest of ``t`` as 16 host bytes (one device sync)."""
    return _to_host([digest(t, backend=backend)])[0]


def digest_many(tensors: Iterable[torch.Tensor], *, backend: str | None = None) -> list[bytes]:
    """Digests of many tensors as host bytes, with one sync per device."""
    return _to_host([digest(t, backend=backend) for t in tensors])


def _output_tensors(value: object) -> list[torch.Tensor]:
    """Flatten an op's output: tensors in order; Python scalars as 0-dim tensors."""
    import torch

    out = []
    for leaf in _tree.iter_leaves(value):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif leaf is None:
            continue
        elif isinstance(leaf, bool):
            out.append(torch.tensor(leaf, dtype=torch.bool))
        elif isinstance(leaf, int):
            out.append(torch.tensor(leaf, dtype=torch.int64))
        elif isinstance(leaf, float):
            out.append(torch.tensor(leaf, dtype=torch.float64))
        elif isinstance(leaf, complex):
            out.append(torch.tensor(leaf, dtype=torch.complex128))
        else:
            raise TypeError(f"repeat: cannot digest an op output of type {type(leaf).__name__}")
    return out


def _mutated_positions(op: Any) -> tuple[set[int], set[str]]:
    """Positions and names of the arguments ``op``'s schema says it writes to."""
    positions: set[int] = set()
    names: set[str] = set()
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            positions.add(i)
            names.add(arg.name)
    return positions, names


def _python_repeat(
    op: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    runs: int,
    clone_mutated: bool,
    digest_backend: str,
) -> list[bytes]:
    import torch

    positions, names = _mutated_positions(op) if clone_mutated else (set(), set())
    digests: list[torch.Tensor] = []
    counts: list[int] = []
    for _ in range(runs):
        call_args = [
            a.clone() if i in positions and isinstance(a, torch.Tensor) else a
            for i, a in enumerate(args)
        ]
        call_kwargs = {
            k: v.clone() if k in names and isinstance(v, torch.Tensor) else v
            for k, v in kwargs.items()
        }
        outputs = _output_tensors(op(*call_args, **call_kwargs))
        counts.append(len(outputs))
        digests.extend(digest(t, backend=digest_backend) for t in outputs)
    host = _to_host(digests)
    result: list[bytes] = []
    pos = 0
    for n in counts:
        result.append(b"".join(host[pos : pos + n]))
        pos += n
    return result


def repeat(
    op: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    runs: int = 2,
    *,
    clone_mutated: bool = True,
    backend: str | None = None,
) -> list[bytes]:
    """Call the aten op ``op`` ``runs`` times on the same inputs; digest each call's output.

    ``op`` is an ``OpOverload`` such as ``torch.ops.aten.index_add.default``.
    With the native extension the loop runs in C++ through the dispatcher
    (``callBoxed``) and digests each output on its device; otherwise a Python
    loop does the same. Returns one ``bytes`` per run: the 16-byte digests of
    the run's output tensors, concatenated in output order (Python scalars in
    the output are digested as 0-dim int64/float64/complex128/bool tensors,
    ``None`` is skipped). Equal entries mean bitwise-equal outputs.

    With ``clone_mutated`` (default), arguments the schema marks as written
    (``Tensor(a!)``, e.g. ``self`` of ``index_add_``) are cloned before every
    call, so in-place ops see the same inputs each run.
    """
    import torch

    if runs < 1:
        raise ValueError(f"repeat: runs must be >= 1, got {runs}")
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(
            "repeat: op must be an OpOverload such as torch.ops.aten.add.Tensor, "
            f"got {type(op).__name__}"
        )
    kwargs = dict(kwargs or {})
    if _use_native(backend):
        module = _native_ops()
        assert module is not None
        schema = op._schema
        flat: list[torch.Tensor] = module.repeat(
            schema.name, schema.overload_name, tuple(args), kwargs, runs, clone_mutated
        )
        if len(flat) % runs:  # pragma: no cover - the native loop checks this
            raise RuntimeError("repeat: native loop returned a ragged result")
        per_run = len(flat) // runs
        host = _to_host(flat)
        return [b"".join(host[r * per_run : (r + 1) * per_run]) for r in range(runs)]
    return _python_repeat(op, args, kwargs, runs, clone_mutated, "python")
