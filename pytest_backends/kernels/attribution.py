"""Which op a primitive computed: shapes (:func:`computes_shape`) and the profiler's op
events (:func:`attribute`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_backends.kernels.primitives import Primitive


def _ints(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in text.split("x"))
    except ValueError:
        return None


def computes_shape(primitive: Primitive, result: Sequence[int], k: int | None) -> bool:
    """Whether ``primitive`` computed a result of shape ``result`` reducing over ``k``.

    A matmul problem ``[B x]M x K : [B x]K x N`` matches a result whose last
    dimension is ``N`` and whose other dimensions hold ``B * M`` elements (a
    1-D result of length ``M`` is a matrix-vector product, ``N = 1``); a
    convolution problem matches the result's batch, output channels and
    spatial size, and ``k = ic / groups * kernel size``.
    """
    dims = tuple(int(d) for d in result)
    if primitive.family == "matmul":
        parts = primitive.problem.split(":")
        if len(parts) < 2:
            return False
        a, b = _ints(parts[0]), _ints(parts[1])
        if not a or not b or len(a) < 2 or len(b) < 2:
            return False
        rows = math.prod(a[:-1])
        kk, n = a[-1], b[-1]
        if len(dims) == 1:
            want_rows, want_n = dims[0], 1
        elif not dims:
            want_rows, want_n = 1, 1
        else:
            want_rows, want_n = math.prod(dims[:-1]), dims[-1]
        return rows == want_rows and n == want_n and (k is None or kk == k)
    if primitive.family == "conv":
        numbers = {name: int(v) for name, v in re.findall(r"([a-z]+)(\d+)", primitive.problem)}
        if len(dims) < 3 or "mb" not in numbers or "oc" not in numbers:
            return False
        spatial = [numbers[d] for d in ("od", "oh", "ow") if d in numbers]
        if (numbers["mb"], numbers["oc"]) != dims[:2] or tuple(spatial) != dims[2:]:
            return False
        if k is None:
            return True
        groups = numbers.get("g", 1)
        window = math.prod(numbers.get(d, 1) for d in ("kd", "kh", "kw"))
        return numbers.get("ic", 0) // max(groups, 1) * window == k
    return False


# ---------------------------------------------------------------- attribution


@dataclass(frozen=True)
class OpEvent:
    """One op the profiler recorded: its name, input shapes and parent (an index)."""

    name: str
    shapes: tuple[tuple[int, ...], ...] = ()
    parent: int | None = None


#: Ops whose kernels a oneDNN primitive of that family computes.
FAMILY_OPS = {
    "matmul": (
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::addbmm",
        "aten::_addmm_activation",
        "aten::mv",
        "aten::addmv",
        "aten::mkldnn_linear",
        "mkldnn::_linear_pointwise",
        "aten::_scaled_mm",
        "aten::linear",
        "aten::matmul",
        "aten::mkldnn_matmul",
    ),
    "conv": (
        "aten::convolution",
        "aten::_convolution",
        "aten::mkldnn_convolution",
        "mkldnn::_convolution_pointwise",
        "aten::convolution_backward",
        "aten::mkldnn_convolution_transpose",
        "aten::convolution_overrideable",
    ),
    "rnn": (
        "aten::lstm",
        "aten::gru",
        "aten::rnn_tanh",
        "aten::rnn_relu",
        "aten::mkldnn_rnn_layer",
        "aten::mkldnn_rnn_layer_backward",
    ),
}


def _problem_shapes(primitive: Primitive) -> list[tuple[int, ...]]:
    """Input shapes a problem descriptor implies (matmul ``AxB:BxC``, conv ``mb..ic..ih..``)."""
    problem = primitive.problem
    if primitive.family == "matmul" and ":" in problem:
        shapes = []
        for part in problem.split(":")[:2]:
            with contextlib.suppress(ValueError):
                shapes.append(tuple(int(x) for x in part.split("x")))
        return shapes
    if primitive.family == "conv":
        numbers = dict(re.findall(r"(mb|ic|id|ih|iw)(\d+)", problem))
        if "mb" in numbers and "ic" in numbers:
            spatial = [int(numbers[k]) for k in ("id", "ih", "iw") if k in numbers]
            return [(int(numbers["mb"]), int(numbers["ic"]), *spatial)]
    return []


def _fits(shapes: Sequence[tuple[int, ...]], event: OpEvent) -> bool:
    """Whether some input of ``event`` has one of ``shapes`` (2-D flattened too)."""
    if not shapes:
        return True
    have = set()
    for shape in event.shapes:
        have.add(tuple(shape))
        if len(shape) > 2:
            lead = 1
            for d in shape[:-1]:
                lead *= d
            have.add((lead, shape[-1]))
    return any(s in have for s in shapes)


def attribute(primitives: Sequence[Primitive], events: Sequence[OpEvent]) -> list[Primitive]:
    """Attribute each primitive to the op that ran it.

    Both sequences are in execution order.  A computing primitive goes to
    the next op of its family (innermost first) whose input shapes match
    the primitive's problem, at or after the previous match (any shape when
    none matches); data movement (reorders) goes to the op of the computing
    primitive it serves.  Where nothing matches, ``op`` stays ``None``.
    """
    out = list(primitives)
    cursor = -1  # the event the previous computing primitive went to
    for index, primitive in enumerate(primitives):
        family = primitive.family
        if family is None:
            continue
        names = FAMILY_OPS[family]
        shapes = _problem_shapes(primitive)

        def found(
            start: int,
            check: bool,
            names: tuple[str, ...] = names,
            shapes: list[tuple[int, ...]] = shapes,
        ) -> list[int]:
            return [
                i
                for i in range(max(start, 0), len(events))
                if events[i].name in names and (not check or _fits(shapes, events[i]))
            ]

        # a later op first (each op usually runs one computing primitive), then
        # the previous one again (an op that runs several), then any shape
        candidates = (
            found(cursor + 1, True)
            or found(cursor, True)
            or found(cursor + 1, False)
            or found(cursor, False)
        )
        if not candidates:
            continue
        # innermost: the candidate whose descendants hold no other candidate
        first = candidates[0]
        chosen = first
        for i in candidates[1:]:
            if _ancestor(events, chosen, i):
                chosen = i
            else:
                break
        cursor = chosen
        event = events[chosen]
        out[index] = dataclasses.replace(
            primitive, op=event.name, op_shapes=event.shapes, op_index=chosen
        )
    # data movement serves a computing primitive: the next one when it reorders
    # one of that op's inputs, else the previous one (its output), else the next
    for index, primitive in enumerate(out):
        if primitive.op is not None:
            continue
        later = next((p for p in out[index + 1 :] if p.op is not None and p.family), None)
        earlier = next((p for p in reversed(out[:index]) if p.op is not None and p.family), None)
        dims = _dims(primitive.problem)
        if later is not None and dims is not None and dims in later.op_shapes:
            source: Primitive | None = later
        else:
            source = earlier or later
        if source is not None:
            out[index] = dataclasses.replace(
                primitive, op=source.op, op_shapes=source.op_shapes, op_index=source.op_index
            )
    return out


def _dims(problem: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in problem.split("x"))
    except ValueError:
        return None


def _ancestor(events: Sequence[OpEvent], ancestor: int, index: int) -> bool:
    parent = events[index].parent
    while parent is not None:
        if parent == ancestor:
            return True
        parent = events[parent].parent
    return False
