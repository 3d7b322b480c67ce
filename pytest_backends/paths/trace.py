"""Per-op numeric sketches, saved per test and configuration, and their offline comparison.

A sketch keeps, for each op's inputs and outputs, a digest of the bytes, the
shape and dtype, a fixed sample of values and two norms, plus what the
tolerance model needs (op family inputs: reduction length and term scale).
Two traces (two CPU capability levels, two machines, two GPU kinds, two
torch versions) are compared op by op, aligned by identity, so an op that
runs on one side only does not shift the rest.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from pytest_backends.paths.api import SKIPPED
from pytest_backends.paths.bounds import pair_bound, reduction_length, term_scale
from pytest_backends.paths.branches import one_sided
from pytest_backends.paths.record import OpRecord, PathRecorder, module_tracking

SAMPLE = 32
FORMAT = 2  # 2: an op's call site holds the user's calls that led to it


def _tensor_sketch(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach()
    out: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
    flat = t.reshape(-1).cpu()
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    try:
        out["digest"] = hashlib.sha256(flat.contiguous().numpy().tobytes()).hexdigest()[:24]
    except (TypeError, RuntimeError):  # bfloat16 and others numpy lacks
        out["digest"] = hashlib.sha256(
            flat.contiguous().view(torch.uint8).numpy().tobytes()
        ).hexdigest()[:24]
    n = flat.numel()
    if not (flat.is_floating_point() or flat.is_complex()):
        out["nonzero"] = int(torch.count_nonzero(flat))
    if n:
        idx = torch.unique(torch.linspace(0, n - 1, min(n, SAMPLE)).round().long())
        values = flat[idx].double()
        out["sample"] = [v if math.isfinite(v) else repr(v) for v in values.tolist()]
        d = flat.double()
        finite = d[torch.isfinite(d)]
        out["l2"] = float(finite.norm()) if finite.numel() else 0.0
        out["max_abs"] = float(finite.abs().max()) if finite.numel() else 0.0
    return out


def _reproduces(record: OpRecord) -> bool:
    """Whether the op, run again on copies of its inputs, gives the same bits.

    Not so for an op whose output holds uninitialised memory or random
    values: such an op is never blamed, since two runs of it differ anyway.  The
    replay reads memory the op leaves unwritten as NaN, so leftover bytes that
    happen to match never make such an op stable.
    """
    from pytest_backends.paths.record import copy_tree, results_of_call
    from pytest_backends.paths.unwritten import filled_replay

    args, kwargs = copy_tree(record.args), copy_tree(record.kwargs)
    try:
        with torch.random.fork_rng(devices=[]), filled_replay({}):
            again = results_of_call(record.func, args, kwargs, record.func(*args, **kwargs))
    except Exception:
        return False
    if len(again) != len(record.outputs):
        return False
    for a, b in zip(again, record.outputs, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not bool(torch.equal(a.detach(), b)) and not (
            (a.is_floating_point() or a.is_complex())
            and bool(torch.equal(a.detach().isnan(), b.isnan()))
            and bool(torch.equal(a.detach().nan_to_num(0.0), b.nan_to_num(0.0)))
        ):
            return False
    return True


def sketch(record: OpRecord, *, stable: bool = True) -> dict[str, Any]:
    """The sketch of one recorded op (inputs and outputs).

    ``stable`` is False for an op that did not reproduce its own result.
    """
    return {
        "identity": list(record.identity),
        "stable": stable,
        "k": reduction_length(record.name, record.inputs, record.outputs),
        "scale": term_scale(record.name, record.inputs),
        "inputs": [_tensor_sketch(t) for t in record.inputs],
        "outputs": [_tensor_sketch(t) for t in record.outputs],
    }


def safe_name(text: str) -> str:
    """A file-name-safe form of a node id or config id."""
    return re.sub(r"[^A-Za-z0-9_.,=-]+", "_", text).strip("_")[:180] or "_"


def capability() -> str:
    """The CPU capability level ATen dispatches to in this process."""
    try:
        return str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:  # pragma: no cover - very old torch
        return "unknown"


@contextmanager
def tracing(path: Path, header: Mapping[str, Any]) -> Iterator[None]:
    """Record every op of the ``with`` block and write one sketch per line to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps({"format": FORMAT, **header}) + "\n")

        def write(record: OpRecord) -> None:
            fh.write(json.dumps(sketch(record, stable=_reproduces(record))) + "\n")

        with module_tracking() as mods:
            recorder = PathRecorder(mods, keep=True, on_op=write, retain=False)
            with recorder:
                yield


@dataclass(frozen=True)
class Trace:
    """One test under one configuration: its header and sketches by identity."""

    path: Path
    header: dict[str, Any]
    ops: list[dict[str, Any]]

    @classmethod
    def load(cls, path: Path) -> Trace:
        """Read a trace file; ``ValueError`` naming the file when it is not one."""
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            if not any(line.strip() for line in lines):
                raise ValueError(f"{path}: not a pytest-backends trace (empty file)")
            header = json.loads(lines[0])
            ops = [json.loads(line) for line in lines[1:] if line.strip()]
        except (OSError, IndexError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a pytest-backends trace ({exc})") from None
        if not isinstance(header, dict) or "format" not in header:
            raise ValueError(f"{path}: not a pytest-backends trace (format {FORMAT})")
        if header["format"] != FORMAT:  # its identities would pair with none of these
            raise ValueError(
                f"{path}: a pytest-backends trace of format {header['format']!r}, not "
                f"{FORMAT}: record it again with this version"
            )
        return cls(path, header, ops)

    @property
    def label(self) -> str:
        """``config@capability``."""
        return f"{self.header.get('config', 'default')}@{self.header.get('capability', '?')}"


def _values(sk: Mapping[str, Any]) -> torch.Tensor:
    return torch.tensor([float(v) for v in sk.get("sample", [])], dtype=torch.float64)


def _elements(sk: Mapping[str, Any]) -> int:
    """How many real values a sketch's norms cover (a complex element is two)."""
    n = math.prod(int(d) for d in sk["shape"])
    return max(1, 2 * n if str(sk.get("dtype", "")).startswith("complex") else n)


def _norm_gap(a: Mapping[str, Any], b: Mapping[str, Any], rtol: float, atol: float) -> float:
    """The smallest max-abs difference of two float tensors their norms prove, or ``-1``.

    ``|max|a| - max|b||`` and ``|‖a‖ - ‖b‖| / sqrt(n)`` are lower bounds of
    ``max|a - b|`` whatever elements the samples missed.  Returns ``-1`` when
    both are consistent with ``|a - b| <= atol + rtol * |b|`` elementwise
    (which implies ``|max|a| - max|b|| <= atol + rtol * max|b|`` and
    ``|‖a‖ - ‖b‖| <= sqrt(n) * atol + rtol * ‖b‖``), else that lower bound.
    """
    if "l2" not in a or "l2" not in b:
        return -1.0
    n = _elements(b)
    ma, mb = float(a["max_abs"]), float(b["max_abs"])
    la, lb = float(a["l2"]), float(b["l2"])
    d_max, d_l2 = abs(ma - mb), abs(la - lb)
    slack = 1e-12 * max(ma, mb, la, lb)
    if d_max <= atol + rtol * mb + slack and d_l2 <= math.sqrt(n) * atol + rtol * lb + slack:
        return -1.0
    return max(d_max, d_l2 / math.sqrt(n))


def _sketch_gap(
    a: Mapping[str, Any], b: Mapping[str, Any], rtol: float, atol: float
) -> tuple[bool, float, float, str]:
    """(within, max abs error, max rel error, why they are lower bounds) of ``a`` against ``b``.

    Equal digests agree.  Otherwise a discrete tensor (integers, bools)
    differs: its digest covers every element.  A float tensor is within only
    if its sampled values *and* its norms (which see every element) are
    consistent with the bound: a difference the samples miss still moves
    ``max_abs`` or ``l2``.  The errors are exact only where the sample holds
    every value; otherwise they are lower bounds, and the fourth item says
    what they come from (``""`` when exact).
    """
    if a["digest"] == b["digest"]:
        return True, 0.0, 0.0, ""
    if a["shape"] != b["shape"] or a["dtype"] != b["dtype"]:
        return False, math.inf, math.inf, ""
    x, y = _values(a), _values(b)
    if x.numel() != y.numel():
        return False, math.inf, math.inf, ""
    if not str(a["dtype"]).startswith(("float", "bfloat", "complex")):
        # Its digest covers every element, so it differs; the samples give the figures.
        n = _elements(b)
        if x.numel() == 0:
            return False, math.inf, math.inf, ""
        gap = (x - y).abs()
        basis = "" if x.numel() >= n else f"{x.numel()} of {n} values sampled"
        return False, float(gap.max()), float((gap / y.abs().clamp_min(1.0)).max()), basis
    same_nonfinite = bool(torch.equal(torch.isfinite(x), torch.isfinite(y)))
    finite = torch.isfinite(x) & torch.isfinite(y)
    err = (x - y).abs().where(finite, torch.zeros_like(x))
    samples_within = bool((err <= atol + rtol * y.abs()).all())
    rel = err / y.abs().clamp_min(atol if atol > 0 else 1e-30)
    worst = float(err.max()) if err.numel() else 0.0
    worst_rel = float(rel.max()) if rel.numel() else 0.0
    if not same_nonfinite:  # a non-finite value against another value: an infinite error
        return False, math.inf, math.inf, ""
    n = _elements(b)
    basis = "" if x.numel() >= n else f"{x.numel()} of {n} values sampled"
    proven = _norm_gap(a, b, rtol, atol)
    if proven >= 0:
        if samples_within:
            basis = "the samples agree; the norms differ"
        worst = max(worst, proven)
        top = max(float(b.get("max_abs", 0.0)), atol if atol > 0 else 1e-30)
        worst_rel = max(worst_rel, proven / top)
    return samples_within and proven < 0, worst, worst_rel, basis


def _discrete(sk: Mapping[str, Any]) -> bool:
    return not str(sk.get("dtype", "")).startswith(("float", "bfloat", "complex"))


def _differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """How many elements of two integer or bool sketches with other digests differ.

    Exact when the samples hold every value; else a lower bound from the samples
    and, for bools, the counts of true elements.
    """
    n = math.prod(int(d) for d in b["shape"])
    if a["shape"] != b["shape"] or a["dtype"] != b["dtype"]:
        return f"{a['dtype']} {a['shape']} vs {b['dtype']} {b['shape']}"
    x, y = _values(a), _values(b)
    seen = int((x != y).sum()) if x.numel() == y.numel() else 0
    if x.numel() >= n and x.numel() == y.numel():
        return f"{seen} of {n} elements differ"
    least = max(seen, 1)
    if a["dtype"] == "bool" and "nonzero" in a and "nonzero" in b:
        least = max(least, abs(int(a["nonzero"]) - int(b["nonzero"])))
    return f">= {least} of {n} elements differ (from {x.numel()} sampled values and the digests)"


def _int_gap(sk: Mapping[str, Any], err: float, lower: str) -> str:
    """``, max abs (>=) E`` for an integer tensor; nothing for a bool."""
    if sk.get("dtype") == "bool" or not math.isfinite(err):
        return ""
    return f", max abs {'>= ' if lower else ''}{err:.3g}"


def _dtype(name: str) -> torch.dtype:
    found = getattr(torch, name, None)
    return found if isinstance(found, torch.dtype) else torch.float32


@dataclass(frozen=True)
class TraceDivergence:
    """The first op where two traces part."""

    op: str
    site: str
    module: str
    a: str
    b: str
    max_abs: float
    max_rel: float
    certificate: str
    rtol: float
    atol: float
    lower_bound: str = ""
    """Why ``max_abs`` and ``max_rel`` are lower bounds (the sketch did not see every
    value); ``""`` when they are exact."""
    kind: str = "op"
    """``"op"``: the op parts on its own; ``"one-sided"``: it ran in one trace only;
    ``"inputs"``: its inputs already differ (and its output), from ops the traces
    cannot compare."""
    detail: str = ""
    """For ``"op"``, how many elements of an integer or bool output differ; else why
    the paths part there."""

    def summary(self) -> str:
        """One line naming the op, where it ran, the error and the bound.

        A lower bound reads ``max rel error >= R, max abs >= A (why)``.
        """
        where = f"{self.op} ({self.site}, module {self.module or '<no module>'})"
        if self.kind != "op":
            return f"the paths part at {where}: {self.detail}"
        if self.detail:
            return (
                f"the paths part at {where}: {self.detail}, compared exactly ({self.a} vs {self.b})"
            )
        if self.lower_bound:
            error = (
                f"max rel error >= {self.max_rel:.3g}, max abs >= {self.max_abs:.3g} "
                f"({self.lower_bound})"
            )
        else:
            error = f"max rel error {self.max_rel:.3g} (max abs {self.max_abs:.3g})"
        return (
            f"the paths part at {self.op} ({self.site}, module {self.module or '<no module>'}): "
            f"{error}, bound {self.atol:.3g} + {self.rtol:.3g}*|x| ({self.a} vs {self.b})"
        )


def _propagated(op: Mapping[str, Any], other: Mapping[str, Any]) -> float:
    """How far an op's result may move because its inputs differ: sum_i rel_i * k * scale."""
    total = 0.0
    for x, y in zip(op["inputs"], other["inputs"], strict=True):
        if not str(y.get("dtype", "")).startswith(("float", "bfloat", "complex")):
            continue
        if x.get("digest") == y.get("digest"):
            continue
        xs, ys = _values(x), _values(y)
        if xs.numel() != ys.numel() or not xs.numel():
            continue
        finite = torch.isfinite(xs) & torch.isfinite(ys)
        diff = float((xs - ys).abs().where(finite, torch.zeros_like(xs)).max())
        if "l2" in x and "l2" in y:  # what the norms prove of the elements not sampled
            n = _elements(y)
            diff = max(
                diff,
                abs(float(x["max_abs"]) - float(y["max_abs"])),
                abs(float(x["l2"]) - float(y["l2"])) / math.sqrt(n),
            )
        top = max(float(y.get("max_abs", 0.0)), 1e-30)
        total += diff / top
    return total * int(other.get("k", 1)) * float(other.get("scale", 1.0))


def _bound(op: Mapping[str, Any], out: Mapping[str, Any], a: Trace, b: Trace) -> Any:
    name = op["identity"][0]
    return pair_bound(
        name,
        _dtype(out["dtype"]),
        str(a.header.get("device", "cpu")),
        int(op.get("k", 1)),
        float(op.get("scale", 1.0)),
        [(a.label, a.header.get("flags", {})), (b.label, b.header.get("flags", {}))],
    )


#: Ops whose results are random or uninitialised memory: never compared, never blamed.
RANDOM = ("aten::empty", "aten::new_empty", "aten::native_dropout")

NOT_RECORDED = (
    "  its tensor inputs agreed within their bounds but its output differs: another kernel, "
    "or a non-tensor argument (a Python value) that differs between the runs; non-tensor "
    "arguments are not recorded in traces, so the trace cannot tell which"
)


def _sides(a: Trace, b: Trace) -> tuple[str, str]:
    """How the report names the two traces: their labels, or their files when those agree."""
    if a.label != b.label:
        return a.label, b.label
    return f"{a.label} ({a.path})", f"{b.label} ({b.path})"


def _first_alone(a: Trace, b: Trace) -> TraceDivergence | None:
    """The first op that ran in one trace only (by the aligned ops before it), or None."""
    ids_a = {tuple(op["identity"]) for op in a.ops}
    ids_b = {tuple(op["identity"]) for op in b.ops}
    side_a, side_b = _sides(a, b)
    best: tuple[int, dict[str, Any], str, str, list[dict[str, Any]]] | None = None
    for mine, yours, in_yours, in_mine, name in (
        (b.ops, a.ops, ids_a, ids_b, (side_b, side_a)),
        (a.ops, b.ops, ids_b, ids_a, (side_a, side_b)),
    ):
        before = 0  # the ops of ``mine`` before it that the other trace ran too
        for op in mine:
            ident = tuple(op["identity"])
            if ident in in_yours:
                before += 1
            elif not ident[0].startswith(SKIPPED) and (best is None or before < best[0]):
                yours_only = [t for t in yours if tuple(t["identity"]) not in in_mine]
                best = (before, op, *name, yours_only)
                break
    if best is None:
        return None
    _, op, side, other_side, alone = best
    ident = op["identity"]
    same_call = [t["identity"][0] for t in alone if t["identity"][1:3] == ident[1:3]]
    why = one_sided(ident, side, other_side, same_call).removeprefix(f"{ident[0]} at {ident[2]} ")
    return _unmeasured(ident, a, b, "one-sided", why)


def _unmeasured(ident: Any, a: Trace, b: Trace, kind: str, detail: str) -> TraceDivergence:
    """A divergence at op ``ident`` with no error of its own to give (inputs already differ)."""
    return TraceDivergence(
        ident[0],
        ident[2],
        ident[1],
        a.label,
        b.label,
        math.inf,
        math.inf,
        "",
        0.0,
        0.0,
        kind=kind,
        detail=detail,
    )


def _outputs_within(op: Mapping[str, Any], other: Mapping[str, Any], a: Trace, b: Trace) -> bool:
    """Whether each output of ``op`` agrees with ``other``'s within the op's own bound."""
    if len(op["outputs"]) != len(other["outputs"]):
        return False
    for x, y in zip(op["outputs"], other["outputs"], strict=True):
        bound = _bound(other, y, a, b)
        if not _sketch_gap(x, y, bound.rtol, bound.atol)[0]:
            return False
    return True


def compare(a: Trace, b: Trace) -> tuple[TraceDivergence | None, int, int]:
    """(first divergence, ops aligned, ops on one side only) of trace ``b`` against ``a``.

    The first op of ``b`` that parts on its own (its inputs agree within their
    bounds, its output does not); else the first op that ran in one trace
    only; else the first aligned op whose inputs and output already differ
    beyond their bounds, from ops the traces cannot compare.  Only when none
    of these is found do the traces agree.  The counts are those of the whole
    traces, wherever the first divergence is.
    """
    ref = {tuple(op["identity"]): op for op in a.ops}
    common = sum(1 for op in b.ops if tuple(op["identity"]) in ref)
    alone = len(a.ops) + len(b.ops) - 2 * common
    unblamed: dict[str, Any] | None = None
    for op in b.ops:
        other = ref.get(tuple(op["identity"]))
        if other is None or op["identity"][0].startswith(RANDOM):
            continue
        if not (op.get("stable", True) and other.get("stable", True)):
            continue
        inputs_ok = len(op["inputs"]) == len(other["inputs"]) and all(
            _sketch_gap(x, y, *_bound_pair(x, a, b))[0]
            for x, y in zip(op["inputs"], other["inputs"], strict=True)
            if "digest" in x
        )
        if not inputs_ok or len(op["outputs"]) != len(other["outputs"]):
            if unblamed is None and not _outputs_within(op, other, a, b):
                unblamed = op
            continue
        found = _parts(op, other, a, b)
        if found is not None:
            return found, common, alone
    found = _first_alone(a, b)
    if found is not None and unblamed is not None:
        ident = unblamed["identity"]
        found = replace(
            found,
            certificate=f"  downstream, {ident[0]} ({ident[2]}, module "
            f"{ident[1] or '<no module>'}) differs beyond its bound: not blamed, its inputs "
            "already differ",
        )
    elif found is None and unblamed is not None:
        ident = unblamed["identity"]
        found = _unmeasured(
            ident,
            a,
            b,
            "inputs",
            "its inputs already differ beyond their bounds, and so does its output, "
            "though no op before it parts on its own and every op ran in both traces "
            "(the difference comes from ops a trace cannot compare: random ops, "
            "uninitialised memory, or code that ran outside the trace)",
        )
    return found, common, alone


def _parts(
    op: Mapping[str, Any], other: Mapping[str, Any], a: Trace, b: Trace
) -> TraceDivergence | None:
    """The divergence at ``op`` when an output parts beyond its bound, its inputs agreeing."""
    same_inputs = all(
        x.get("digest") == y.get("digest")
        for x, y in zip(op["inputs"], other["inputs"], strict=True)
    )
    for x, y in zip(op["outputs"], other["outputs"], strict=True):
        if not same_inputs and _discrete(y):
            # A discrete result (indices, a mask) of inputs that differ in bits
            # may change at a near-tie; it can only be judged on identical inputs.
            continue
        bound = _bound(other, y, a, b)
        rtol, atol, certificate = bound.rtol, bound.atol, bound.certificate
        if not same_inputs:
            extra = _propagated(op, other)
            atol += extra
            certificate += (
                f"\n  inputs differ in bits (normwise relative difference within their "
                f"bounds): first-order propagation through a sum of k={other.get('k', 1)} "
                f"terms of scale {float(other.get('scale', 1.0)):.3g} adds {extra:.3g} "
                "to atol (replay cannot isolate the op offline)"
            )
        within, err, rel, lower = _sketch_gap(x, y, rtol, atol)
        if not within:
            ident = op["identity"]
            return TraceDivergence(
                ident[0],
                ident[2],
                ident[1],
                a.label,
                b.label,
                err,
                rel,
                certificate + "\n" + NOT_RECORDED,
                rtol,
                atol,
                lower,
                detail=(_differing(x, y) + _int_gap(y, err, lower)) if _discrete(y) else "",
            )
    return None


def _bound_pair(sk: Mapping[str, Any], a: Trace, b: Trace) -> tuple[float, float]:
    bound = pair_bound(
        "input",
        _dtype(sk["dtype"]),
        str(a.header.get("device", "cpu")),
        1,
        1.0,
        [(a.label, a.header.get("flags", {})), (b.label, b.header.get("flags", {}))],
    )
    return bound.rtol, bound.atol


def _files(root: Path) -> dict[str, Path]:
    if root.is_file():
        return {root.name: root}
    if not root.is_dir():
        raise ValueError(f"{root}: no such trace file or directory")
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*.jsonl"))}


def diverge(path_a: Path, path_b: Path, *, allow_unpaired: bool = False) -> tuple[list[str], int]:
    """Compare two traces (files or ``--backends-trace`` directories).

    Files are paired by their path relative to each directory (test and
    configuration).  Returns the report lines and the number of failures: pairs
    that part beyond their bounds, and traces in one directory only (never
    compared, so never passed) unless ``allow_unpaired``.  ``ValueError`` when
    no pair is compared (a wrong path must not read as "agree").
    """
    files_a, files_b = _files(path_a), _files(path_b)
    if path_a.is_file() and path_b.is_file():
        pairs = [(path_a.name, path_a, path_b)]
    else:
        pairs = [(k, files_a[k], files_b[k]) for k in sorted(set(files_a) & set(files_b))]
    lines: list[str] = []
    parted = 0
    for key, fa, fb in pairs:
        ta, tb = Trace.load(fa), Trace.load(fb)
        found, aligned, unmatched = compare(ta, tb)
        head = f"{key}: {aligned} ops aligned, {unmatched} on one side only"
        if found is None:
            lines.append(f"{head}: agree within bounds")
        else:
            parted += 1
            lines.append(f"{head}: {found.summary()}\n{found.certificate}".rstrip("\n"))
    unpaired = set() if path_a.is_file() and path_b.is_file() else set(files_a) ^ set(files_b)
    for key in sorted(unpaired):  # two files given are a pair, whatever their names
        side = path_a if key in files_a else path_b
        verdict = "not compared" if allow_unpaired else "not compared, a failure"
        lines.append(f"{key}: only in {side} ({verdict})")
    if not pairs:
        shown = "; ".join(lines) or "neither holds a trace file"
        raise ValueError(f"no trace files in common, nothing compared ({shown})")
    return lines, parted + (0 if allow_unpaired else len(unpaired))


def trace_file(root: Path, nodeid: str, config_id: str) -> Path:
    """Where a test's trace under a configuration goes."""
    return root / safe_name(nodeid) / f"{safe_name(config_id)}.jsonl"


def header(config_id: str, flags: Mapping[str, object], device: str, nodeid: str) -> dict[str, Any]:
    """What a trace records about its run."""
    return {
        "test": nodeid,
        "config": config_id,
        "flags": {k: v for k, v in flags.items() if isinstance(v, (bool, int, float, str))},
        "device": device,
        "capability": capability(),
        "torch": torch.__version__,
        "env_capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
    }


__all__ = ["Trace", "TraceDivergence", "compare", "diverge", "header", "sketch", "tracing"]
