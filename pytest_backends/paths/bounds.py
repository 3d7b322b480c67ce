"""Per-op bounds from the tolerance model, and the certificate that explains each.

An op's family and reduction length come from its name and shapes (the inner
dimension of a matmul, ``in_channels/groups * kernel size`` of a conv, the
reduced element count of a reduction).  Two paths each err from the exact
result by at most the model's bound under their own flags, so two results
may differ by the sum of the two bounds; the certificate says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from pytest_backends.tolerance import tolerance_for
from pytest_backends.tolerance.model import Tolerance

_MATMUL = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "aten::addmv",
    "aten::mv",
    "aten::dot",
    "aten::_mkldnn_matmul",
}
_CONV_PREFIX = ("aten::convolution", "aten::_convolution", "aten::conv", "aten::mkldnn_conv")
_SDPA_PREFIX = ("aten::_scaled_dot_product", "aten::scaled_dot_product")
_REDUCTION = {
    "aten::sum",
    "aten::mean",
    "aten::_softmax",
    "aten::_log_softmax",
    "aten::_softmax_backward_data",
    "aten::_log_softmax_backward_data",
    "aten::norm",
    "aten::linalg_vector_norm",
    "aten::var",
    "aten::var_mean",
    "aten::std",
    "aten::native_layer_norm",
    "aten::native_layer_norm_backward",
    "aten::native_batch_norm",
    "aten::native_batch_norm_backward",
    "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_functional",
    "aten::_native_batch_norm_legit_no_training",
    "aten::native_group_norm",
    "aten::native_group_norm_backward",
    "aten::cumsum",
    "aten::prod",
    "aten::logsumexp",
    "aten::embedding_dense_backward",
    "aten::_embedding_bag",
    "aten::_embedding_bag_backward",
    "aten::_embedding_bag_dense_backward",
}


def family(name: str) -> str | None:
    """The tolerance model's op family for an op name; ``None``: unknown, every flag counts."""
    if name in _MATMUL:
        return "matmul"
    if name.startswith(_CONV_PREFIX):
        return "conv"
    if name.startswith(_SDPA_PREFIX):
        return "sdpa"
    if name in _REDUCTION:
        return "reduction"
    if "_backward" in name or name.endswith("_rnn"):
        return None
    if name.startswith("aten::"):
        return "elementwise"
    return None


def reduction_length(
    name: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]
) -> int:
    """The longest sum an output element of the op can contain (at least 1)."""
    fam = family(name)
    floats = [t for t in inputs if t.is_floating_point() or t.is_complex()]
    if fam == "matmul" and floats:
        if name == "aten::linear" or name in ("aten::addmm", "aten::addmv", "aten::baddbmm"):
            a = floats[1] if len(floats) > 2 else floats[0]
            return max(1, int(a.shape[-1]) if a.dim() else 1)
        return max(1, int(floats[0].shape[-1]) if floats[0].dim() else 1)
    if name == "aten::convolution_backward" and len(floats) >= 3:
        grad_out, weight = floats[0], floats[2]
        per_weight = grad_out.numel() // max(1, int(grad_out.shape[1]))
        per_input = int(weight.shape[0]) * math.prod(int(d) for d in weight.shape[2:])
        return max(1, per_weight, per_input)
    if fam == "conv" and len(floats) >= 2:
        weight = floats[1]
        return max(1, int(weight[0].numel()) if weight.dim() else 1)
    if fam == "sdpa" and floats:
        q = floats[0]
        return max(1, int(q.shape[-1]) * (int(floats[1].shape[-2]) if len(floats) > 1 else 1))
    if fam in ("reduction", None) and floats and outputs:
        # A reduction, or a backward op (which sums over broadcast dims).
        biggest_in = max(t.numel() for t in floats)
        smallest_out = max(1, min(t.numel() for t in outputs))
        if biggest_in > smallest_out:
            return biggest_in // smallest_out
        return max(1, int(floats[0].shape[-1]) if floats[0].dim() else 1)
    return 1


def _rms(t: torch.Tensor) -> float:
    if t.numel() == 0:
        return 0.0
    value = float(t.detach().double().abs().pow(2).mean().sqrt())
    return value if math.isfinite(value) else 0.0


def term_scale(name: str, inputs: Sequence[torch.Tensor]) -> float:
    """The RMS magnitude of the terms the op sums (``a_i * b_i`` of a dot product)."""
    floats = [t for t in inputs if t.is_floating_point()]
    if not floats:
        return 1.0
    fam = family(name)
    if fam in ("matmul", "conv", "sdpa") and len(floats) >= 2:
        if name in ("aten::addmm", "aten::addmv", "aten::baddbmm") and len(floats) >= 3:
            value = _rms(floats[1]) * _rms(floats[2])
        else:
            value = _rms(floats[0]) * _rms(floats[1])
    else:
        value = max(_rms(t) for t in floats)
    return value if value > 0 else 1.0


@lru_cache(maxsize=4096)
def _unit(
    dtype: str, device: str, fam: str | None, k: int, flags: tuple[tuple[str, object], ...]
) -> Tolerance:
    k = 1 if fam == "elementwise" else k
    return tolerance_for(dtype, device=device, op=fam, k=k, flags=dict(flags), kernel=True)


@dataclass(frozen=True)
class Bound:
    """``|a - b| <= atol + rtol * |b|`` between two paths' results, and its derivation."""

    rtol: float
    atol: float
    certificate: str

    def allowed(self, expected: torch.Tensor) -> torch.Tensor:
        """The allowed difference per element."""
        return self.atol + self.rtol * expected.abs()


def pair_bound(
    name: str,
    dtype: torch.dtype,
    device: str,
    k: int,
    scale: float,
    configs: Sequence[tuple[str, Mapping[str, object]]],
) -> Bound:
    """The sum of the model's bounds under each configuration's flags."""
    fam = family(name)
    dname = str(dtype).removeprefix("torch.")
    rtol = atol = 0.0
    lines = [
        f"tolerance certificate for {name} ({dname} on {device}, op family "
        f"{fam or 'unknown (every precision flag counts)'}, reduction length k={k}, "
        f"term scale {scale:.3g}):"
    ]
    for config_id, flags in configs:
        unit = _unit(dname, device, fam, k, tuple(sorted(flags.items(), key=lambda kv: kv[0])))
        tol_atol = unit.atol * scale
        rtol += unit.rtol
        atol += tol_atol
        finfo_eps = torch.finfo(dtype).eps if (dtype.is_floating_point) else 0.0
        consulted = ", ".join(f"{n}={v!r}" for n, v in unit.flags) or "none apply"
        lines.append(
            f"  [{config_id}] dtype eps {finfo_eps:.3g}; flags {consulted}; "
            f"path: {'; '.join(unit.path)}"
            + (f"; precision from {unit.precision_source}" if unit.precision_source else "")
            + f" -> rtol {unit.rtol:.3g}, atol {tol_atol:.3g}"
        )
    lines.append(
        f"  two paths, each within its bound of the exact result, differ by at most the "
        f"sum: |a - b| <= {atol:.3g} + {rtol:.3g} * |b|"
    )
    return Bound(rtol, atol, "\n".join(lines))
