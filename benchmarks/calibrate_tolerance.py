"""Calibrate the tolerance model of ``pytest_backends.tolerance`` against measured errors.

For every precision mode available on this machine, and several ops, shapes
and reduction lengths ``k``, this runs seeded random trials, measures the
error of each result against a float64 reference computed from the same
inputs, and checks the model's bound:

* (a) it is never exceeded (0 violations), and
* (b) it is not loose by more than 10x: the worst trial uses at least a tenth
  of the allowed error (``bound/worst <= 10``).

A flag only allows a path; whether the path ran depends on the hardware and
the shape.  The bound follows the kernel, as in tests: for each case the op
runs once under oneDNN's primitive log (``pytest_backends.kernels.observe``)
and ``tolerance_for`` reads the precision the primitive that computed a result
of that shape computed in (on a CPU without AMX, ``fp32_precision="bf16"``
runs an f32 kernel, and the bound is the fp32 one; on a CPU with AMX some
shapes take the bf16 kernel and others stay in f32), else a probe of the same
shape.  Each trial of a flagged mode is also run on the mode's
baseline path and compared bitwise.  Every row is held to (a) and (b),
except a row whose bound assumed the reduced-precision path when no trial
took it (a path that did not run cannot be calibrated).

The report starts with the CPU model and the features that decide the
oneDNN paths (AMX, AVX512-BF16, AVX512-FP16).

Usage::

    python benchmarks/calibrate_tolerance.py [--trials 1000] [--out FILE]
        [--modes "fp32 ieee,fp32 oneDNN bf16"] [--cases "mm ,mv "]

Exit status 1 when a check fails.  The output for this project's CPU machine
is kept in ``benchmarks/results/calibration-cpu.txt``; on a CUDA machine the
TF32 and reduced-precision modes are calibrated as well.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_backends.flags import override_flags
from pytest_backends.kernels import observe
from pytest_backends.tolerance import Tolerance, tolerance_for

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, also for tests
from bench_machine import cpu_flags, cpu_model

LOOSENESS_LIMIT = 10.0
# A flagged mode whose output never differed from its baseline in this many
# trials of a case has no effect on it; the case stops there.
NO_EFFECT_TRIALS = 100


@dataclass(frozen=True)
class Mode:
    """A precision mode: the dtype of the inputs and the flags that select the path."""

    name: str
    device: str
    dtype: torch.dtype
    flags: Mapping[str, object]
    # flags of the path this mode is compared with bitwise, or None when the
    # mode always differs by construction (a reduced-precision dtype)
    baseline: Mapping[str, object] | None = None
    # rounds fp32 inputs the way the mode's reduced-precision path does, to
    # tell that path apart from a different fp32 kernel the flag picked
    emulate: Callable[[torch.Tensor], torch.Tensor] | None = None
    # op families this mode is calibrated on (None: all)
    ops: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Case:
    """An op on one shape: builds seeded inputs and computes the result."""

    name: str
    op: str
    k: int
    make: Callable[[torch.Generator, str], tuple[torch.Tensor, ...]]
    run: Callable[..., torch.Tensor]
    scale: float = 1.0
    # False where the data exercises a worst-case term that random data of
    # this kind stays far below (reported, not held to the 10x check)
    tight: bool = True
    # the input dtypes this case is calibrated in (None: every mode's)
    dtypes: tuple[torch.dtype, ...] | None = None


@dataclass
class Row:
    """The measurements of one (mode, case)."""

    mode: str
    case: str
    op: str
    k: int
    trials: int = 0
    effect: int = 0  # trials where the mode's output differed bitwise from its baseline path
    reduced: int = 0  # trials where the output matched the emulated reduced-precision path
    max_abs: float = 0.0
    max_rel: float = 0.0  # normwise: ||err|| / ||ref||
    worst_use: float = 0.0  # max over elements of |err| / (atol + rtol |ref|)
    violations: int = 0
    rtol: float = 0.0
    atol: float = 0.0
    skipped: str = ""
    baseline: bool = False
    emulated: bool = False
    tight: bool = True
    stopped: bool = False
    # the precision the bound assumed, and what decided it ("f32 log", "bf16 probe")
    bound: str = "-"
    bound_reduced: bool = False
    kernel: str = ""

    @property
    def ran(self) -> bool:
        """Whether the path the bound was made for ran in at least one trial."""
        if not self.baseline or not self.bound_reduced:
            return True
        return (self.reduced if self.emulated else self.effect) > 0

    @property
    def looseness(self) -> float:
        """``bound / worst observed error`` (inf when no error was seen)."""
        return math.inf if self.worst_use == 0 else 1.0 / self.worst_use


def _randn(*shape: int) -> Callable[[torch.Generator, str], torch.Tensor]:
    def make(gen: torch.Generator, device: str) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    return make


def _pair(
    first: Callable[[torch.Generator, str], torch.Tensor],
    second: Callable[[torch.Generator, str], torch.Tensor],
) -> Callable[[torch.Generator, str], tuple[torch.Tensor, ...]]:
    return lambda gen, device: (first(gen, device), second(gen, device))


def _uniform(*shape: int) -> Callable[[torch.Generator, str], torch.Tensor]:
    def make(gen: torch.Generator, device: str) -> torch.Tensor:
        return torch.rand(*shape, generator=gen).to(device)

    return make


def _constant(*shape: int) -> Callable[[torch.Generator, str], torch.Tensor]:
    def make(gen: torch.Generator, device: str) -> torch.Tensor:
        value = 0.5 + 0.5 * torch.rand((), generator=gen)
        return value.expand(*shape).contiguous().to(device)

    return make


def _qkv(
    b: int, h: int, lq: int, lk: int, d: int
) -> Callable[[torch.Generator, str], tuple[torch.Tensor, ...]]:
    def make(gen: torch.Generator, device: str) -> tuple[torch.Tensor, ...]:
        shapes = ((b, h, lq, d), (b, h, lk, d), (b, h, lk, d))
        return tuple(torch.randn(*shape, generator=gen).to(device) for shape in shapes)

    return make


def _attention(kernel: SDPBackend) -> Callable[..., torch.Tensor]:
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v)

    return run


def _recurrent(
    cell: type[nn.RNNBase], batch: int, steps: int, size: int
) -> tuple[Callable[[torch.Generator, str], tuple[torch.Tensor, ...]], Callable[..., torch.Tensor]]:
    """Seeded inputs and weights (PyTorch's default initialisation) and the cell's output."""
    module = cell(size, size, batch_first=True)
    names = [name for name, _ in module.named_parameters()]
    shapes = [p.shape for p in module.parameters()]
    bound = size**-0.5

    def make(gen: torch.Generator, device: str) -> tuple[torch.Tensor, ...]:
        x = torch.randn(batch, steps, size, generator=gen)
        weights = [(2 * torch.rand(shape, generator=gen) - 1) * bound for shape in shapes]
        return tuple(t.to(device) for t in (x, *weights))

    def run(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        out = functional_call(module.to(x.device), dict(zip(names, weights)), (x,))
        return out[0]

    return make, run


def round_mantissa(bits: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Round finite fp32 values to ``bits`` explicit mantissa bits (nearest, ties to even)."""
    drop = 23 - bits

    def emulate(t: torch.Tensor) -> torch.Tensor:
        raw = t.float().contiguous().view(torch.int32)
        bias = ((raw >> drop) & 1) + ((1 << (drop - 1)) - 1)
        rounded = (raw + bias) & ~((1 << drop) - 1)
        return rounded.view(torch.float32)

    return emulate


def cases() -> list[Case]:
    """The ops and shapes calibrated: GEMMs over a range of k, and convolutions."""
    out: list[Case] = []
    # 64x8, 16x4096 and 4x1024 are shapes oneDNN keeps in f32 on a CPU with AMX
    # under fp32_precision="bf16" while 64x256 computes in bf16 there
    for m, k, n in (
        (64, 8, 64),
        (64, 64, 64),
        (64, 256, 64),
        (32, 1024, 32),
        (16, 4096, 16),
        (4, 1024, 4),
    ):
        out.append(
            Case(
                f"mm {m}x{k}@{k}x{n}", "matmul", k, _pair(_randn(m, k), _randn(k, n)), torch.matmul
            )
        )
    # a matrix-vector product: no oneDNN bf16 path on the AMX machine
    out.append(
        Case("mv 64x256@256", "matmul", 256, _pair(_randn(64, 256), _randn(256)), torch.matmul)
    )
    out.append(
        Case(
            "bmm 4x32x512@512x32",
            "matmul",
            512,
            _pair(_randn(4, 32, 512), _randn(4, 512, 32)),
            torch.bmm,
        )
    )
    out.append(
        Case(
            "linear 32x768, 64x768",
            "matmul",
            768,
            _pair(_randn(32, 768), _randn(64, 768)),
            F.linear,
        )
    )
    # same-sign terms: every rounding error pushes the same way, which the
    # relative part of the bound must cover; rms(a_i b_i) = 1/3 for U[0, 1)
    out.append(
        Case(
            "mm U[0,1) 64x256@256x64",
            "matmul",
            256,
            _pair(_uniform(64, 256), _uniform(256, 64)),
            torch.matmul,
            scale=1 / 3,
            tight=False,
        )
    )
    # constant inputs: every rounding error points the same way, the case the
    # worst-case relative terms are for
    for k in (64, 1024):
        out.append(
            Case(
                f"mm const 64x{k}@{k}x64",
                "matmul",
                k,
                _pair(_constant(64, k), _constant(k, 64)),
                torch.matmul,
            )
        )
    for (n, cin, h, w), (cout, kh) in (
        ((2, 3, 16, 16), (8, 3)),
        ((2, 16, 12, 12), (16, 3)),
        ((1, 64, 10, 10), (32, 3)),
        ((1, 128, 8, 8), (16, 5)),
        ((2, 64, 12, 12), (16, 7)),
    ):
        k = cin * kh * kh
        out.append(
            Case(
                f"conv {n}x{cin}x{h}x{w} k{kh}x{kh}",
                "conv",
                k,
                _pair(_randn(n, cin, h, w), _randn(cout, cin, kh, kh)),
                F.conv2d,
            )
        )
    # fp16/bf16 attention: the fused kernel rounds the probabilities before P @ V
    # (k = the head dimension, as tests pass it; scale 1 = rms of v)
    half = (torch.bfloat16, torch.float16)
    for (b, h, lq, lk, d), name, kernel in (
        ((2, 4, 16, 16, 32), "flash", SDPBackend.FLASH_ATTENTION),
        ((1, 2, 128, 512, 64), "flash", SDPBackend.FLASH_ATTENTION),
        ((2, 4, 64, 64, 32), "math", SDPBackend.MATH),
    ):
        make = _qkv(b, h, lq, lk, d)
        out.append(
            Case(
                f"sdpa {name} {b}x{h}x{lq}x{lk} d{d}",
                "sdpa",
                d,
                make,
                _attention(kernel),
                dtypes=half,
            )
        )
    # fp16/bf16 recurrent cells round their state every step; the bound is the
    # saturated error of the roughest cells (GRU, tanh RNN: h up to 1).  An LSTM's
    # h = o tanh(c) is about half as large, and oneDNN's LSTM keeps c in f32, so
    # its error stays near a tenth of the bound (reported, not held to 10x)
    for cell, steps, tight in (
        (nn.LSTM, 1, False),
        (nn.LSTM, 32, False),
        (nn.GRU, 32, True),
        (nn.RNN, 32, True),
    ):
        make, run = _recurrent(cell, 8, steps, 32)
        name = f"rnn {cell.__name__.lower()} 8x{steps}x32"
        out.append(Case(name, "rnn", 64, make, run, tight=tight, dtypes=half))
    return out


def modes(device: str) -> list[Mode]:
    """The precision modes that exist on ``device`` in the running torch."""
    f32 = torch.float32
    if device == "cpu":
        ieee = {"mkldnn.matmul.fp32_precision": "ieee", "mkldnn.conv.fp32_precision": "ieee"}
        return [
            Mode("fp32 ieee", device, f32, ieee),
            Mode(
                "fp32 oneDNN bf16",
                device,
                f32,
                {"mkldnn.matmul.fp32_precision": "bf16", "mkldnn.conv.fp32_precision": "bf16"},
                baseline=ieee,
                emulate=round_mantissa(7),
            ),
            Mode(
                "fp32 oneDNN tf32",
                device,
                f32,
                {"mkldnn.matmul.fp32_precision": "tf32", "mkldnn.conv.fp32_precision": "tf32"},
                baseline=ieee,
                emulate=round_mantissa(10),
            ),
            # matmuls do not go through oneDNN in fp32 either: only convs change path
            Mode("fp32 oneDNN off", device, f32, {"mkldnn.enabled": False}, ops=("conv",)),
            Mode("bf16", device, torch.bfloat16, {}),
            Mode("fp16", device, torch.float16, {}),
        ]
    ieee = {"cuda.matmul.fp32_precision": "ieee", "cudnn.conv.fp32_precision": "ieee"}
    no_rpr = {
        "cuda.matmul.allow_fp16_reduced_precision_reduction": False,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": False,
    }
    rpr = {name: True for name in no_rpr}
    return [
        Mode("cuda fp32 ieee", device, f32, ieee),
        Mode(
            "cuda fp32 tf32",
            device,
            f32,
            {"cuda.matmul.fp32_precision": "tf32", "cudnn.conv.fp32_precision": "tf32"},
            baseline=ieee,
            emulate=round_mantissa(10),
        ),
        Mode("cuda bf16 no RPR", device, torch.bfloat16, no_rpr),
        Mode("cuda bf16 RPR", device, torch.bfloat16, rpr, baseline=no_rpr),
        Mode("cuda fp16 no RPR", device, torch.float16, no_rpr),
        Mode("cuda fp16 RPR", device, torch.float16, rpr, baseline=no_rpr),
        Mode(
            "cuda fp16 fp16-accumulation",
            device,
            torch.float16,
            {**no_rpr, "cuda.matmul.allow_fp16_accumulation": True},
            baseline=no_rpr,
        ),
    ]


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def calibrate_case(mode: Mode, case: Case, trials: int, seed: int) -> Row:
    """Run ``trials`` seeded trials of ``case`` in ``mode``."""
    row = Row(
        mode.name,
        case.name,
        case.op,
        case.k,
        baseline=mode.baseline is not None,
        emulated=mode.emulate is not None,
        tight=case.tight,
    )
    with override_flags(mode.flags):
        tol = _kernel_tolerance(mode, case, row, seed * 100_003)
        row.rtol, row.atol = tol.rtol, tol.atol
        for trial in range(trials):
            if not _trial(mode, case, tol, row, seed * 100_003 + trial):
                break
            if (
                row.baseline
                and row.bound_reduced
                and row.trials == NO_EFFECT_TRIALS
                and row.effect == 0
            ):
                row.stopped = True  # the flag picks the same kernel: more trials add nothing
                break
    return row


def _kernel_tolerance(mode: Mode, case: Case, row: Row, seed: int) -> Tolerance:
    """The bound for the kernel this case runs: computed inside oneDNN's primitive log."""
    gen = torch.Generator().manual_seed(seed)
    inputs = tuple(t.to(mode.dtype) for t in case.make(gen, mode.device))
    with observe() as log:
        shape: tuple[int, ...] | None = None
        with contextlib.suppress(RuntimeError):  # _trial reports it
            shape = tuple(case.run(*inputs).shape)
        # as assert_close does: the bound follows the kernel of this result's shape
        tol = tolerance_for(
            mode.dtype, device=mode.device, op=case.op, k=case.k, scale=case.scale, shape=shape
        )
        primitives = [p for p in log.primitives() if p.family]
    row.kernel = ", ".join(dict.fromkeys(f"{p.impl} {p.precision}" for p in primitives))
    row.bound_reduced = any(line.startswith("inputs rounded") for line in tol.path) or (
        mode.dtype != torch.float32
    )
    if tol.precision_source:
        short = {"primitive log": "log", "probe": "probe", "worst case": "worst"}
        precision = "rdc" if row.bound_reduced else "f32"
        for line in tol.path:
            if line.startswith("inputs rounded to "):
                precision = line.split()[3]
        row.bound = f"{precision} {short.get(tol.precision_source, tol.precision_source)}"
    return tol


def _trial(mode: Mode, case: Case, tol: Tolerance, row: Row, seed: int) -> bool:
    """One seeded trial under the mode's flags (already applied); False to stop."""
    gen = torch.Generator().manual_seed(seed)
    inputs = tuple(t.to(mode.dtype) for t in case.make(gen, mode.device))
    try:
        out = case.run(*inputs)
    except RuntimeError as exc:  # e.g. an op without a kernel for this dtype
        row.skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        return False
    ref = case.run(*(t.double() for t in inputs))
    if mode.baseline is not None:
        with override_flags(mode.baseline):
            base = case.run(*inputs)
        differs = not _bitwise_equal(out, base)
        row.effect += differs
        if differs and mode.emulate is not None:
            emulated = case.run(*(mode.emulate(t).double() for t in inputs))
            closer = (out.double() - emulated).norm() < (out.double() - ref).norm()
            row.reduced += bool(closer)
    err = (out.double() - ref).abs()
    row.trials += 1
    row.max_abs = max(row.max_abs, float(err.max()))
    row.max_rel = max(row.max_rel, float(err.norm() / ref.norm()))
    use = float((err / (tol.atol + tol.rtol * ref.abs())).max())
    row.worst_use = max(row.worst_use, use)
    row.violations += use > 1.0
    return True


def run_calibration(
    trials: int = 1000,
    device: str = "cpu",
    mode_names: Sequence[str] | None = None,
    case_names: Sequence[str] | None = None,
    progress: bool = False,
) -> list[Row]:
    """Calibrate every (mode, case) on ``device``; names filter by prefix."""
    rows: list[Row] = []
    for mode in modes(device):
        if mode_names is not None and not any(mode.name.startswith(p) for p in mode_names):
            continue
        if progress:
            print(f"calibrating {mode.name} ...", file=sys.stderr, flush=True)
        for index, case in enumerate(cases()):
            if case_names is not None and not any(case.name.startswith(p) for p in case_names):
                continue
            if mode.ops is not None and case.op not in mode.ops:
                continue
            if case.dtypes is not None and mode.dtype not in case.dtypes:
                continue
            rows.append(calibrate_case(mode, case, trials, seed=index))
    return rows


def failures(rows: Sequence[Row]) -> list[str]:
    """The checks that failed: any violation, or a bound looser than 10x where the path ran."""
    problems = []
    for row in rows:
        if row.skipped:
            continue
        if row.violations:
            problems.append(f"{row.mode} / {row.case}: {row.violations} violations")
        if row.ran and row.tight and row.looseness > LOOSENESS_LIMIT:
            problems.append(f"{row.mode} / {row.case}: bound {row.looseness:.1f}x the worst error")
    return problems


def _fmt(x: float) -> str:
    return f"{x:.2e}" if x else "0"


def cpu_line() -> str:
    """The CPU model and the features that decide oneDNN's reduced-precision paths."""
    model, flags = cpu_model(), set(cpu_flags())
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is not None:
        have = caps()
        model = str(have.get("cpu_name") or model) if model in ("?", "x86_64", "") else model
        flags |= {name for name, on in have.items() if on is True}

    def yes(*names: str) -> str:
        return "yes" if any(n in flags for n in names) else "no"

    return (
        f"cpu: {model}; AMX: {yes('amx_bf16', 'amx_tile')} (amx_fp16: {yes('amx_fp16')}), "
        f"AVX512-BF16: {yes('avx512_bf16')}, AVX512-FP16: {yes('avx512_fp16')}"
    )


def report(rows: Sequence[Row], seconds: float, trials: int) -> Iterator[str]:
    """The text report: one line per (mode, case), then a summary per mode."""
    yield "pytest_backends tolerance calibration"
    yield (
        f"torch {torch.__version__}, {platform.machine()}, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads"
    )
    if torch.cuda.is_available():
        yield f"cuda device: {torch.cuda.get_device_name()}"
    yield cpu_line()
    yield (
        f"{trials} seeded trials per (mode, case); error against a float64 reference "
        "from the same inputs;"
    )
    yield (
        "use = max |err| / (atol + rtol |ref|) over all elements and trials "
        "(>1 is a violation); loose = 1/use; max rel is normwise, ||err|| / ||ref||"
    )
    yield (
        "differs = trials whose output differed bitwise from the baseline (ieee) path; "
        "reduced = trials whose output matched"
    )
    yield (
        "the emulated reduced-precision path (inputs rounded) better than the exact "
        "result; '-' = not applicable"
    )
    yield (
        "loose marked * : a worst-case term that this random data stays below; "
        "reported, not held to the 10x check"
    )
    yield (
        f"differs marked ! : the output never differed in the first {NO_EFFECT_TRIALS} "
        "trials (no effect), so the case stopped there"
    )
    yield (
        "bound = the precision the bound assumed and what told it: log = oneDNN's "
        "primitive log of the case's own shape, probe = the one-time probe of that shape; "
        "kernels = what the log showed"
    )
    yield ""
    header = (
        f"{'mode':<17} {'case':<25} {'k':>5} {'differs':>9} {'reduced':>9} "
        f"{'max abs':>9} {'max rel':>9} {'rtol':>9} {'atol':>9} {'use':>6} "
        f"{'loose':>7} {'viol':>4} {'bound':>10}  kernels"
    )
    yield header
    yield "-" * len(header)
    for row in rows:
        if row.skipped:
            yield f"{row.mode:<17} {row.case:<25} {row.k:>5}  skipped: {row.skipped}"
            continue
        differs = f"{row.effect}/{row.trials}{'!' if row.stopped else ''}" if row.baseline else "-"
        reduced = f"{row.reduced}/{row.trials}" if row.emulated else "-"
        loose = f"{row.looseness:.1f}" if row.ran else "n/a"
        if row.ran and not row.tight:
            loose += "*"
        yield (
            f"{row.mode:<17} {row.case:<25} {row.k:>5} {differs:>9} {reduced:>9} "
            f"{_fmt(row.max_abs):>9} {_fmt(row.max_rel):>9} {_fmt(row.rtol):>9} "
            f"{_fmt(row.atol):>9} {row.worst_use:>6.3f} {loose:>7} {row.violations:>4} "
            f"{row.bound:>10}  {row.kernel or '-'}"
        )
    yield ""
    yield "summary per mode:"
    for name in dict.fromkeys(r.mode for r in rows):
        mine = [r for r in rows if r.mode == name and not r.skipped]
        if not mine:
            yield f"  {name}: skipped"
            continue
        ran = [r for r in mine if r.ran]
        total = sum(r.trials for r in mine)
        viol = sum(r.violations for r in mine)
        line = f"  {name}: {total} trials, {viol} violations"
        if not ran:
            line += (
                "; the bound assumed the reduced-precision path and no case took it: "
                "nothing to calibrate here"
            )
        else:
            worst = max(ran, key=lambda r: r.worst_use)
            loosest = max((r for r in ran if r.tight), key=lambda r: r.looseness, default=worst)
            line += (
                f"; worst case uses {worst.worst_use:.2f} of the bound ({worst.case}); "
                f"loosest case {loosest.looseness:.1f}x ({loosest.case})"
            )
            idle = [r.case for r in mine if not r.ran]
            if idle:
                line += f"; the reduced-precision path did not run for: {', '.join(idle)}"
            kinds = sorted({r.bound for r in mine if r.bound != "-"})
            if kinds:
                line += f"; bounds: {', '.join(kinds)}"
        yield line
    problems = failures(rows)
    yield ""
    yield f"result: {'FAIL' if problems else 'PASS'} ({seconds:.0f} s)"
    for problem in problems:
        yield f"  {problem}"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--modes", default=None, help="comma-separated mode name prefixes (default: all)"
    )
    parser.add_argument(
        "--cases", default=None, help="comma-separated case name prefixes (default: all)"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = run_calibration(
        args.trials,
        args.device,
        mode_names=args.modes.split(",") if args.modes else None,
        case_names=args.cases.split(",") if args.cases else None,
        progress=True,
    )
    text = "\n".join(report(rows, time.perf_counter() - start, args.trials))
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 1 if failures(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
