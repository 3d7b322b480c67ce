"""No-effect detection: does a backend flag change an op's output on this machine?

Some flags change nothing on some hardware (the fp16/bf16 reduced-precision
reduction flags on an H100, a oneDNN precision flag on a CPU without the
instructions it needs, any CUDA flag for a CPU op).  A test that claims to
cover "flag on and off" can ask :func:`flag_effect` whether it really ran
two different paths instead of the same one twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pytest_backends import _tree

__all__ = ["FlagEffect", "flag_effect"]


@dataclass(frozen=True)
class FlagEffect:
    """The verdict of :func:`flag_effect`.

    ``groups`` partitions ``values`` into sets whose outputs were bitwise
    identical, in order of first appearance.  ``max_abs_diff`` gives, per
    value, the largest absolute difference from the first value's output
    (``None`` where the outputs are not comparable elementwise, e.g. shapes
    differ).  ``reproducible`` is False when running ``fn`` twice under the
    first value already gave different outputs; the comparison then says
    nothing about the flag.  ``max_rel_diff`` gives the size of the effect
    relative to the output, so a reduced-precision path (~1e-3) can be told
    from an fp32 kernel that merely sums in another order (~1e-7): see
    :attr:`size`.  The object is truthy when the flag had an effect.
    """

    flag: str
    values: tuple[object, ...]
    groups: tuple[tuple[object, ...], ...]
    max_abs_diff: tuple[float | None, ...]
    reproducible: bool
    #: per value, the normwise relative difference ``||out - out_0|| / ||out_0||``
    #: from the first value's output (the size of the effect; ``None`` where
    #: not comparable).  A bf16 path moves a matmul by ~2e-3, TF32 by ~3e-4,
    #: an fp32 kernel that only blocks differently by ~1e-7.
    max_rel_diff: tuple[float | None, ...] = ()

    @property
    def has_effect(self) -> bool:
        """True when some value gave a bitwise different output (and ``fn`` is reproducible)."""
        return self.reproducible and len(self.groups) > 1

    @property
    def size(self) -> float:
        """The largest relative difference between any value's output and the first's."""
        return max((r for r in self.max_rel_diff if r is not None), default=0.0)

    @property
    def verdict(self) -> str:
        """``"effect"``, ``"no effect"`` or ``"not reproducible"``."""
        if not self.reproducible:
            return "not reproducible"
        return "effect" if self.has_effect else "no effect"

    def __bool__(self) -> bool:
        return self.has_effect

    def __str__(self) -> str:
        shown = ", ".join(map(repr, self.values))
        if not self.reproducible:
            return (
                f"{self.flag}: not reproducible: two runs under {self.values[0]!r} already "
                "gave different outputs, so the flag's effect cannot be told apart"
            )
        if not self.has_effect:
            return (
                f"{self.flag}: no effect: {shown} gave bit-identical outputs here (other "
                "kernels may have run and happened to agree exactly; the op trace of "
                "assert_paths_agree tells)"
            )
        parts = " | ".join(", ".join(map(repr, group)) for group in self.groups)
        rel = self.max_rel_diff or (None,) * len(self.values)
        diffs = ", ".join(
            f"{value!r}: {diff:.3g}" + (f" (relative {r:.2g})" if r is not None else "")
            for value, diff, r in zip(self.values[1:], self.max_abs_diff[1:], rel[1:])
            if diff is not None
        )
        detail = f"; max |difference| from {self.values[0]!r}: {diffs}" if diffs else ""
        return f"{self.flag}: effect: outputs differ between groups {parts}{detail}"


def _leaves(value: object) -> list[tuple[str, object]]:
    """``(path, leaf)`` of an output, tensors cloned (a later call may overwrite them)."""
    import torch

    return [
        (path, leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf)
        for path, leaf in _tree.leaves(value, empty=True)
    ]


def _same(a: list[tuple[str, object]], b: list[tuple[str, object]]) -> bool:
    import torch

    if [path for path, _ in a] != [path for path, _ in b]:
        return False
    for (_, x), (_, y) in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not _bitwise_equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return False
        elif type(x) is not type(y) or repr(x) != repr(y):
            # repr: NaN and -0.0 compare by their bits, as tensors do
            return False
    return True


def _bitwise_equal(a: Any, b: Any) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.layout != torch.strided or b.layout != torch.strided:
        return bool(torch.equal(a.to_dense(), b.to_dense()))
    if a.numel() == 0:
        return True
    bytes_a = a.contiguous().reshape(-1).view(torch.uint8)
    bytes_b = b.contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(bytes_a, bytes_b))


def _tensor_pairs(
    a: list[tuple[str, object]], b: list[tuple[str, object]]
) -> list[tuple[Any, Any]] | None:
    """The pairs of tensors of two flattened outputs; None when they cannot be compared."""
    import torch

    if [path for path, _ in a] != [path for path, _ in b]:
        return None
    pairs = []
    for (_, x), (_, y) in zip(a, b):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            continue
        if x.shape != y.shape or x.device != y.device:
            return None
        pairs.append((x, y))
    return pairs


def _max_abs_diff(a: list[tuple[str, object]], b: list[tuple[str, object]]) -> float | None:
    import torch

    pairs = _tensor_pairs(a, b)
    if pairs is None:
        return None
    worst = 0.0
    for x, y in pairs:
        if not (x.is_floating_point() or x.is_complex()):
            x, y = x.double(), y.double()
        diff = (
            x.to(torch.promote_types(x.dtype, y.dtype))
            - y.to(torch.promote_types(x.dtype, y.dtype))
        ).abs()
        if diff.numel():
            finite = diff[diff.isfinite()] if diff.is_floating_point() else diff
            if finite.numel():
                worst = max(worst, float(finite.max()))
    return worst


def _rel_diff(a: list[tuple[str, object]], b: list[tuple[str, object]]) -> float | None:
    """``||a - b|| / ||a||`` over the floating tensors of two outputs (normwise)."""
    import torch

    pairs = _tensor_pairs(a, b)
    if pairs is None:
        return None
    num = den = 0.0
    for x, y in pairs:
        if not (x.is_floating_point() or x.is_complex()):
            continue
        wide = torch.complex128 if x.is_complex() or y.is_complex() else torch.float64
        xd, yd = x.to(wide), y.to(wide)
        keep = xd.isfinite() & yd.isfinite()
        num += float((xd - yd)[keep].abs().pow(2).sum())
        den += float(xd[keep].abs().pow(2).sum())
    if den == 0.0:
        return 0.0 if num == 0.0 else None
    return float((num / den) ** 0.5)


def flag_effect(
    fn: Callable[[], object],
    flag: str,
    values: Iterable[object],
    *,
    check_reproducible: bool = True,
) -> FlagEffect:
    """Run ``fn()`` with ``flag`` set to each of ``values`` and compare the outputs bitwise.

    ``fn`` takes no arguments and returns a tensor or a (nested) sequence or
    mapping of tensors and plain values; it should build or capture its
    inputs so that every call computes the same thing.  All other flags stay
    as they are, and every flag is restored afterwards.  With
    ``check_reproducible`` (the default) ``fn`` runs once more under the
    first value: if that output differs, the verdict is "not reproducible".

    Raises ``ValueError`` (before running anything) for an unknown flag, an
    invalid value, or fewer than two distinct values.
    """
    from pytest_backends.flags import override_flags, registry

    if not callable(fn):
        raise TypeError(
            f"flag_effect: fn must be a callable taking no arguments, got {type(fn).__name__}"
        )
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(
            f"flag_effect: values must be a list of the values to compare, got {values!r}"
        )
    chosen = tuple(values)
    reg = registry()
    normalised = [reg.validate({flag: value})[flag] for value in chosen]
    distinct = {repr(v) for v in normalised}
    if len(distinct) < 2:
        raise ValueError(
            f"flag_effect needs at least two distinct values for {flag!r}, got {list(chosen)!r}"
        )
    outputs: list[list[tuple[str, object]]] = []
    for value in chosen:
        with override_flags({flag: value}):
            outputs.append(_leaves(fn()))
    reproducible = True
    if check_reproducible:
        with override_flags({flag: chosen[0]}):
            again = _leaves(fn())
        reproducible = _same(outputs[0], again)
    groups: list[list[int]] = []
    for index, out in enumerate(outputs):
        for group in groups:
            if _same(outputs[group[0]], out):
                group.append(index)
                break
        else:
            groups.append([index])
    return FlagEffect(
        flag=flag,
        values=chosen,
        groups=tuple(tuple(chosen[i] for i in group) for group in groups),
        max_abs_diff=tuple(_max_abs_diff(outputs[0], out) for out in outputs),
        reproducible=reproducible,
        max_rel_diff=tuple(_rel_diff(outputs[0], out) for out in outputs),
    )
