"""Comparing results under the bound: :func:`assert_close`, :func:`reference` (an fp64
reference) and the ``backend_tolerance`` fixture's value, :class:`BackendTolerance`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from pytest_backends import _tree
from pytest_backends.tolerance.bounds import tolerance_for
from pytest_backends.tolerance.model import (
    Tolerance,
    as_device_type,
    check_k,
    check_op,
    check_scale,
)


def _is_reference_pair(actual: object, expected: object) -> bool:
    """``expected`` is a wider floating reference for ``actual`` (e.g. fp64 for fp32)."""
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        return False
    a, e = actual.dtype, expected.dtype
    if a == e or not (a.is_floating_point or a.is_complex):
        return False
    if a.is_complex != e.is_complex:
        return False
    return torch.finfo(e).eps < torch.finfo(a).eps


def assert_close(
    actual: Any,
    expected: Any,
    *,
    k: int | None = None,
    op: str | None = None,
    scale: float = 1.0,
    rtol: float | None = None,
    atol: float | None = None,
    kernel: bool = True,
    **kwargs: Any,
) -> None:
    """Like :func:`torch.testing.assert_close`, with tolerances from the active flags.

    The default ``rtol``/``atol`` come from :func:`tolerance_for` for
    ``actual``'s dtype and device, the op family ``op`` and the reduction
    length ``k``; an explicit ``rtol`` or ``atol`` wins over the model's.
    A reduced-precision flag widens the bound only where the kernel used
    that precision for a result of ``actual``'s shape (``kernel=False``:
    wherever the flag allows it; see :func:`tolerance_for`).
    ``expected`` may be a wider reference (an fp64 result for an fp32
    ``actual``, e.g. from :func:`reference`): ``actual`` is then compared in
    the reference's dtype.  Nested sequences and mappings are compared leaf
    by leaf, each with the tolerance of its own dtype.  Other keyword
    arguments go to :func:`torch.testing.assert_close`.

    On failure the message states the model's inputs (dtype, device, op, k,
    the flags that were consulted) and the bound.
    """
    op_family = "mean" if op == "mean" else check_op(op)
    check_k(k, op_family)
    check_scale(scale)
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
        ):
            raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    user_msg = kwargs.pop("msg", None)
    for where, a, e in _tree.zip_leaves(actual, expected):
        leaf_kwargs = dict(kwargs)
        if isinstance(a, torch.Tensor):
            tol = tolerance_for(
                a.dtype,
                device=a.device,
                op=op_family,
                k=k,
                scale=scale,
                kernel=kernel,
                shape=tuple(a.shape),
            )
            hint = None
            if _is_reference_pair(a, e):
                hint = _autocast_hint(tol, a.dtype)
                a = a.to(e.dtype)
                leaf_kwargs["check_dtype"] = False
            leaf_rtol = tol.rtol if rtol is None else float(rtol)
            leaf_atol = tol.atol if atol is None else float(atol)
            message: str | Callable[[str], str] | None = (
                user_msg if user_msg is not None else _explain(tol, where, rtol, atol, hint)
            )
            torch.testing.assert_close(
                a, e, rtol=leaf_rtol, atol=leaf_atol, msg=message, **leaf_kwargs
            )
        else:
            if rtol is not None or atol is not None:
                leaf_kwargs["rtol"] = float(rtol if rtol is not None else 0.0)
                leaf_kwargs["atol"] = float(atol if atol is not None else 0.0)
            torch.testing.assert_close(a, e, msg=user_msg, **leaf_kwargs)


def _autocast_hint(tol: Tolerance, dtype: torch.dtype) -> str | None:
    """For a low-precision result checked against a wider reference: name input rounding."""
    if dtype not in (torch.float16, torch.bfloat16) or any(
        line.startswith("inputs rounded") for line in tol.path
    ):
        return None
    name = str(dtype).removeprefix("torch.")
    return (
        f"  hint: the bound assumes the {name} result came from {name} inputs. If "
        f"torch.autocast (or a .to({name})) rounded fp32 inputs and weights to {name}, "
        "that rounding is not in it: compare with reference() of the rounded inputs, "
        "or call assert_close inside the autocast region so the model counts it"
    )


def _explain(
    tol: Tolerance,
    where: str,
    rtol: float | None,
    atol: float | None,
    hint: str | None = None,
) -> Callable[[str], str]:
    def message(generated: str) -> str:
        lines = [generated, ""]
        if where:
            lines.append(f"compared element: {where}")
        lines.append(tol.describe())
        if rtol is not None or atol is not None:
            given = ", ".join(
                f"{n}={v!r}" for n, v in (("rtol", rtol), ("atol", atol)) if v is not None
            )
            lines.append(f"  explicit {given} replaced the model's value")
        if tol.k == 1 and tol.op != "elementwise":
            lines.append("  (k=1 assumed: pass k=<reduction length> for a matmul, conv or sum)")
        if hint is not None:
            lines.append(hint)
        return "\n".join(lines)

    return message


# ---------------------------------------------------------------- reference


def _widen(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.detach().to(torch.complex128)
        if value.is_floating_point():
            return value.detach().to(torch.float64)
        return value
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(torch.float64)
    if isinstance(value, tuple):
        return tuple(_widen(v) for v in value)
    if isinstance(value, list):
        return [_widen(v) for v in value]
    if isinstance(value, dict):
        return {key: _widen(v) for key, v in value.items()}
    return value


def reference(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Compute ``fn(*args, **kwargs)`` in float64 from the same inputs.

    Floating tensors (also inside lists, tuples and dicts) are converted to
    float64 (complex ones to complex128) on their device; a
    :class:`torch.nn.Module`, passed as ``fn`` or as an argument, is replaced
    by a float64 copy.  The default dtype is float64 during the call, so
    tensors ``fn`` creates match.  Reduced-precision flags do not apply to
    float64 ops, so the result is the reference a reduced-precision path
    should be compared with::

        expected = pytest_backends.reference(torch.matmul, a, b)
        pytest_backends.assert_close(a @ b, expected, k=a.shape[-1], op="matmul")
    """
    from pytest_backends.flags import override_flags

    function = _widen(fn) if isinstance(fn, torch.nn.Module) else fn
    with override_flags({"default_dtype": "float64"}), torch.no_grad():
        return function(*_widen(args), **_widen(kwargs))


# ------------------------------------------------------------------ fixture


class BackendTolerance:
    """The value of the ``backend_tolerance`` fixture.

    ``rtol, atol = backend_tolerance`` gives the bound for the default dtype
    and no named op; ``backend_tolerance(torch.float16, op="matmul", k=512)``
    gives a :class:`Tolerance` for another dtype, op or reduction length.
    Both read the flags active at that moment (the current backend
    configuration's, as the plugin applies them around the test) and use the
    configuration's device.
    """

    def __init__(self, device: str, config: object | None = None) -> None:
        self.device = device
        self.config = config

    @classmethod
    def for_config(cls, config: object) -> BackendTolerance:
        """For a ``BackendConfig`` (or anything with a ``device`` attribute)."""
        device = getattr(config, "device", None) or "cpu"
        return cls(as_device_type(str(device)), config)

    def __call__(
        self,
        dtype: torch.dtype | str | None = None,
        *,
        op: str | None = None,
        k: int | None = None,
        scale: float = 1.0,
        kernel: bool = True,
        shape: Sequence[int] | None = None,
    ) -> Tolerance:
        """The bound for ``dtype`` (default: torch's default dtype) on this device.

        Like :func:`tolerance_for`, it follows the precision the kernel used
        for a result of ``shape`` where given (``kernel=False``: the flags'
        worst case).
        """
        chosen = torch.get_default_dtype() if dtype is None else dtype
        return tolerance_for(
            chosen, device=self.device, op=op, k=k, scale=scale, kernel=kernel, shape=shape
        )

    def __iter__(self) -> Iterator[float]:
        return iter(self())

    def __repr__(self) -> str:
        rtol, atol = self()
        return f"BackendTolerance(device={self.device!r}, rtol={rtol:.3g}, atol={atol:.3g})"
