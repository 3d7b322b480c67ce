"""What ran inside an op: oneDNN's primitive log and CUDA kernel names.

Profiler op names stop at the dispatcher: ``aten::mm`` may be computed by
oneDNN or by a BLAS, in fp32 or in bf16, and a flag only *allows* a path.
Two sources say what really computed an op:

* on the CPU, **oneDNN's primitive log** (``torch.backends.mkldnn.verbose``):
  the C++ library prints one line per executed primitive to file
  descriptor 1, naming its kind, implementation, ISA, data types and
  ``fpmath`` attribute.  :class:`PrimitiveLog` captures it at the fd level
  (pytest's own capture keeps working: whatever else reached fd 1 is passed
  on when the capture ends) and :func:`parse_primitive` reads the lines;
* on CUDA, **the profiler's kernel names**: :func:`classify_cuda_kernel`
  tells TF32, cuDNN, cuBLAS/cuBLASLt and the SDPA kernels apart.

:func:`attribute` assigns each primitive to the op that was running, from
the op events of a ``torch.profiler`` run of the same code.  While a log is
being captured (``--backends-verify``, or :func:`observe` in a test),
:func:`computed_precision` answers "in which precision did the kernels of
this op family compute so far", which the tolerance model uses.

This module does not import torch at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

__all__ = [
    "CudaKernel",
    "OpEvent",
    "Primitive",
    "PrimitiveLog",
    "attribute",
    "classify_cuda_kernel",
    "computed_precision",
    "observe",
    "parse_primitive",
]

# ------------------------------------------------------------------- oneDNN

#: oneDNN data types narrower than fp32, by the name the log uses.
_REDUCED_DTYPES = ("bf16", "f16", "f8_e5m2", "f8_e4m3", "s8", "u8", "s4", "u4")
#: Primitive kinds that only move or convert data.
_DATA_MOVEMENT = ("reorder", "concat", "sum", "shuffle")
#: Primitive kind -> the op family of the tolerance model.
PRIMITIVE_FAMILY = {
    "matmul": "matmul",
    "inner_product": "matmul",
    "gemm": "matmul",
    "convolution": "conv",
    "deconvolution": "conv",
    "rnn": "rnn",
}
# An f32 primitive with attr-fpmath:<mode> computes in <mode> only on an ISA
# that has instructions for it; otherwise oneDNN keeps f32 (the attribute
# *allows* down-conversion).  ISA names as oneDNN prints them in the impl.
_FPMATH_ISA = {
    "bf16": ("bf16", "amx", "avx2_vnni_2", "avx10"),
    "f16": ("fp16", "amx", "avx2_vnni_2", "avx10"),
    "tf32": ("amx",),
}


@dataclass(frozen=True)
class Primitive:
    """One executed oneDNN primitive, as its log line describes it.

    ``impl`` is the implementation (``brg_matmul:avx512_core_bf16``),
    ``isa`` the part after the colon, ``dtypes`` the ``(argument, dtype)``
    pairs of its memory descriptors, ``fpmath`` the ``attr-fpmath`` mode
    (``None`` when not set), ``problem`` the problem descriptor
    (``256x1024:1024x256``).  ``op`` and ``op_shapes`` name the aten op the
    primitive was attributed to (see :func:`attribute`).
    """

    kind: str
    impl: str
    dtypes: tuple[tuple[str, str], ...] = ()
    fpmath: str | None = None
    problem: str = ""
    prop_kind: str = ""
    op: str | None = None
    op_shapes: tuple[tuple[int, ...], ...] = ()
    op_index: int | None = None

    @property
    def isa(self) -> str:
        """The ISA of the implementation (``avx512_core``), or ``""``."""
        return self.impl.partition(":")[2]

    @property
    def family(self) -> str | None:
        """The op family it computes (``matmul``, ``conv``, ``rnn``) or ``None``."""
        return PRIMITIVE_FAMILY.get(self.kind)

    @property
    def computes(self) -> bool:
        """False for primitives that only move data (reorders, concat)."""
        return self.kind not in _DATA_MOVEMENT

    def input_dtypes(self) -> tuple[str, ...]:
        """Data types of the inputs that are multiplied (``src``, ``wei``, ``diff_dst``)."""
        found = tuple(
            dtype
            for name, dtype in self.dtypes
            if name.startswith(("src", "wei", "diff_dst")) and dtype != "undef"
        )
        return found or tuple(d for _, d in self.dtypes if d != "undef")

    @property
    def precision(self) -> str:
        """The precision the kernel computed in: ``f32``, ``bf16``, ``f16``, ``tf32``, ...

        Narrow input types decide it; for f32 inputs an ``fpmath`` mode counts
        only where the ISA can compute in it (``avx512_core`` cannot compute
        bf16, ``avx512_core_bf16`` and ``avx512_core_amx`` can).
        """
        inputs = self.input_dtypes()
        narrow = [d for d in _REDUCED_DTYPES if d in inputs]
        if narrow:
            return narrow[0]
        base = "f64" if "f64" in inputs else "f32"
        if (
            base == "f32"
            and self.fpmath in _FPMATH_ISA
            and any(tag in self.isa for tag in _FPMATH_ISA[self.fpmath])
        ):
            return self.fpmath
        return base

    def describe(self) -> str:
        """``brg_matmul:avx512_core (matmul, f32 with attr-fpmath:bf16) for aten::mm``."""
        inputs = "/".join(dict.fromkeys(self.input_dtypes())) or "?"
        fpmath = f" with attr-fpmath:{self.fpmath}" if self.fpmath else ""
        where = f" for {self.op}" if self.op else ""
        return f"{self.impl} ({self.kind}, {inputs}{fpmath}){where}"


def parse_primitive(line: str) -> Primitive | None:
    """Parse one ``onednn_verbose`` exec line; ``None`` for any other line.

    Reads the current format (``onednn_verbose,v1,primitive,exec,cpu,...``,
    ``src:f32::blocked:ab::f0``) and the one of older oneDNN releases
    (``onednn_verbose,exec,cpu,...``, ``src_f32::blocked:ab:f0``), with or
    without a timestamp field.
    """
    line = line.strip()
    if not line.startswith(("onednn_verbose,", "dnnl_verbose,")):
        return None
    fields = line.split(",")
    try:
        at = fields.index("exec")
    except ValueError:
        return None
    if "graph" in fields[1:at] or len(fields) < at + 8:
        return None
    kind, impl, prop = fields[at + 2], fields[at + 3], fields[at + 4]
    mds, attrs, problem = fields[at + 5], fields[at + 6], fields[at + 8]
    dtypes = []
    for md in mds.split():
        name, _, rest = md.partition(":")
        dtype = rest.partition(":")[0]
        if not dtype:  # old format: src_f32::blocked..., the type after the last "_"
            name, _, dtype = name.rpartition("_")
        if name and dtype:
            dtypes.append((name, dtype))
    fpmath = None
    for attr in attrs.split():
        if attr.startswith("attr-fpmath:"):
            fpmath = attr.split(":")[1] or None
    return Primitive(kind, impl, tuple(dtypes), fpmath, problem, prop)


def parse_primitives(lines: Iterable[str]) -> list[Primitive]:
    """Every exec line of ``lines``, parsed, in order."""
    return [p for p in map(parse_primitive, lines) if p is not None]


def _fflush_c_stdout() -> None:
    """Flush the C library's stdout buffer (oneDNN prints with printf)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


def _mkldnn_available() -> bool:
    import torch

    return bool(torch._C._has_mkldnn)


def _set_verbose(level: int) -> bool:
    import torch

    setter = getattr(getattr(torch._C, "_verbose", None), "mkldnn_set_verbose", None)
    if setter is None or not _mkldnn_available():
        return False
    return bool(setter(level))


def _user_verbose_level() -> int:
    """The level ``ONEDNN_VERBOSE``/``DNNL_VERBOSE`` asked for (0 when unset)."""
    for name in ("ONEDNN_VERBOSE", "DNNL_VERBOSE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
        if value:
            return 1
    return 0


@dataclass
class PrimitiveLog:
    """Captures oneDNN's primitive log (fd 1) between :meth:`start` and :meth:`stop`.

    :meth:`start` points file descriptor 1 at a temporary file and turns the
    log on; :meth:`stop` turns it off, points fd 1 back at what it was
    (pytest's capture file, or the terminal) and passes on every line that
    was not oneDNN's (lines of oneDNN too when the user asked for them with
    ``ONEDNN_VERBOSE``).  :meth:`primitives` reads what was logged so far,
    also while capturing.
    """

    error: str | None = None
    _file: IO[bytes] | None = field(default=None, repr=False)
    _saved_fd: int | None = field(default=None, repr=False)
    _token: contextvars.Token[PrimitiveLog | None] | None = field(default=None, repr=False)
    _text: str | None = field(default=None, repr=False)

    def start(self) -> bool:
        """Start capturing; ``False`` (with :attr:`error`) where it cannot."""
        try:
            if not _mkldnn_available():
                self.error = "torch was built without oneDNN"
                return False
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            _fflush_c_stdout()
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
            self._saved_fd = os.dup(1)
            os.dup2(self._file.fileno(), 1)
        except (OSError, ValueError) as exc:
            self._close()
            self.error = f"file descriptor 1 could not be redirected: {exc}"
            return False
        if not _set_verbose(1):
            self.stop()
            self.error = "oneDNN refused to turn its primitive log on"
            return False
        self._token = _ACTIVE.set(self)
        return True

    def _read(self) -> str:
        if self._text is not None:
            return self._text
        if self._file is None:
            return ""
        _fflush_c_stdout()
        size = os.fstat(self._file.fileno()).st_size
        return os.pread(self._file.fileno(), size, 0).decode("utf-8", "replace")

    def text(self) -> str:
        """Everything oneDNN logged so far (all of it once stopped), info lines included."""
        return self._read()

    def primitives(self) -> list[Primitive]:
        """The primitives executed so far."""
        return parse_primitives(self._read().splitlines())

    def stop(self) -> list[Primitive]:
        """Stop capturing, restore fd 1, pass other output on; return the primitives."""
        if self._token is not None:
            with contextlib.suppress(ValueError):
                _ACTIVE.reset(self._token)
            self._token = None
        if self._file is None:
            return parse_primitives((self._text or "").splitlines())
        _set_verbose(_user_verbose_level())
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        text = self._read()
        self._text = text
        self._close()
        keep_onednn = _user_verbose_level() > 0
        passed = [
            line
            for line in text.splitlines(keepends=True)
            if keep_onednn or not line.startswith(("onednn_verbose,", "dnnl_verbose,"))
        ]
        if passed:
            with contextlib.suppress(OSError):
                os.write(1, "".join(passed).encode())
        return parse_primitives(text.splitlines())

    def _close(self) -> None:
        if self._saved_fd is not None:
            _fflush_c_stdout()
            os.dup2(self._saved_fd, 1)
            os.close(self._saved_fd)
            self._saved_fd = None
        if self._file is not None:
            self._file.close()
            self._file = None


_ACTIVE: contextvars.ContextVar[PrimitiveLog | None] = contextvars.ContextVar(
    "pytest_backends_primitive_log", default=None
)


def active_log() -> PrimitiveLog | None:
    """The primitive log being captured now, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def observe() -> Iterator[PrimitiveLog]:
    """Capture oneDNN's primitive log around a block (tolerances then follow it).

    ::

        with pytest_backends.kernels.observe() as log:
            out = a @ b
            assert_close(out, reference(torch.matmul, a, b), op="matmul", k=1024)
        print([p.describe() for p in log.primitives()])

    Does nothing but yield an empty log where oneDNN is missing or fd 1
    cannot be redirected (``log.error`` says why).
    """
    log = PrimitiveLog()
    started = log.start()
    try:
        yield log
    finally:
        if started:
            log.stop()


#: The profiler scope internal probes run in; kernel-path verification ignores it.
PROBE_SCOPE = "pytest_backends::tolerance_probe"


@contextlib.contextmanager
def paused_log() -> Iterator[None]:
    """Keep oneDNN's primitives out of the active log for the block (internal probes)."""
    if active_log() is None:
        yield
        return
    _set_verbose(0)
    try:
        yield
    finally:
        _set_verbose(1)


def computed_precision(
    family: str, fpmath: str, result: Sequence[int] | None = None, k: int | None = None
) -> tuple[str, Primitive] | None:
    """How the f32 kernels of ``family`` with ``attr-fpmath:<fpmath>`` computed so far.

    Reads the active log (``None`` when nothing is captured or no such
    primitive ran yet).  Returns ``(precision, primitive)`` where the
    primitive is one that computed in the reduced precision if any did,
    else the last one seen.  With ``result`` (the shape of the op's result)
    and ``k`` (its reduction length), only primitives that computed a result
    of that shape count (:func:`computes_shape`): oneDNN picks the kernel
    per shape, so another shape's primitive says nothing about this one.
    """
    log = active_log()
    if log is None:
        return None
    seen = [
        p
        for p in log.primitives()
        if p.family == family
        and p.fpmath == fpmath
        and "f32" in p.input_dtypes()
        and (result is None or computes_shape(p, result, k))
    ]
    if not seen:
        return None
    reduced = [p for p in seen if p.precision != "f32"]
    chosen = reduced[0] if reduced else seen[-1]
    return chosen.precision, chosen


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


# ------------------------------------------------------------------- CUDA


@dataclass(frozen=True)
class CudaKernel:
    """What a CUDA kernel name says about the library and precision that ran.

    ``library``: ``cublas``, ``cublasLt``, ``cudnn``, ``cutlass``, ``flash``
    (FlashAttention), ``mem_efficient`` (xFormers/CUTLASS memory-efficient
    attention), ``cudnn_attention``, ``triton``, ``aten`` (a native
    ``at::native`` kernel) or ``other``.  ``role``: ``gemm``, ``conv``,
    ``sdpa``, ``rnn`` or ``other``.  ``precision``: ``tf32``, ``f32``,
    ``f16``, ``bf16``, ``f8``, ``f64``, ``int8`` or ``None`` where the name
    does not tell.
    """

    name: str
    library: str
    role: str
    precision: str | None

    @property
    def tf32(self) -> bool:
        """True when the kernel computes fp32 data with TF32 tensor cores."""
        return self.precision == "tf32"


# Ordered rules: the first match decides.  Built from kernel names in public
# profiler traces (torch.profiler tables, Nsight Systems, cuBLAS/CUTLASS/cuDNN
# issue threads): see tests/unit/test_cuda_kernel_names.py for the list.
_LIBRARY_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("cudnn_attention", "sdpa", re.compile(r"cudnn.*(sdpa|fmha|flash_[fb]prop)", re.I)),
    ("flash", "sdpa", re.compile(r"pytorch_flash::|flash_fwd|flash_bwd|flash_attn", re.I)),
    (
        "mem_efficient",
        "sdpa",
        re.compile(
            r"fmha_cutlass[FB]|PyTorchMemEffAttention|AttentionKernel<|AttentionBackwardKernel<|"
            r"mem_efficient|efficient_attention",
            re.I,
        ),
    ),
    ("triton", "other", re.compile(r"^triton_|triton", re.I)),
    (
        "cudnn",
        "rnn",
        re.compile(r"RNN_|rnn::|elemWiseRNNcell|LSTM_|GRU_|persist.*(lstm|gru)", re.I),
    ),
    (
        "cudnn",
        "conv",
        re.compile(
            r"cudnn|_xmma_(fprop|dgrad|wgrad)|implicit_convolve|implicit_gemm|winograd|"
            r"precomputed_convolve|fft2d|conv2d_grouped|convolve_",
            re.I,
        ),
    ),
    ("cublasLt", "gemm", re.compile(r"^nvjet|cublasLt|splitKreduce|_cublaslt", re.I)),
    ("cutlass", "gemm", re.compile(r"cutlass.*gemm|cutlass3x_|cutlass_\d+_(tensorop|simt)", re.I)),
    (
        "cublas",
        "gemm",
        re.compile(
            r"xmma_gemm|_cublas$|[a-z]gemm|gemm[A-Z_]|gemv|gemmk1|gemmSN|dot_kernel|"
            r"(volta|turing|ampere|ada|hopper|maxwell|sm\d+)_.*gemm",
            re.I,
        ),
    ),
)
_PRECISION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("tf32", re.compile(r"tf32|tensorop_s1688gemm_\d|tensorop_s1688gemm_(nn|nt|tn|tt)", re.I)),
    ("bf16", re.compile(r"bf16|bfloat16", re.I)),
    ("f16", re.compile(r"fp16|f16|half|h884|h1688|h16816|hgemm|_hsh_", re.I)),
    ("f8", re.compile(r"e4m3|e5m2|fp8|f8f8", re.I)),
    ("int8", re.compile(r"int8|i8816|i8832|imma|_s8_|s8s8", re.I)),
    ("f64", re.compile(r"dgemm|double|f64|d884|dmma|dgrad2d_alg\d_\d<double", re.I)),
    (
        "f32",
        re.compile(
            r"sgemm|scudnn|<float|float,|f32f32_f32|simt_s|_f32_|gemv2T_kernel_val"
            r"<int, int, float",
            re.I,
        ),
    ),
)


def classify_cuda_kernel(name: str) -> CudaKernel:
    """Read a CUDA kernel name from a profiler trace (``torch.profiler``, nsys).

    Examples from public traces::

        ampere_sgemm_128x64_nn                                  cublas   gemm f32
        sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize...       cublas   gemm tf32
        cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4    cutlass  gemm tf32
        nvjet_tst_128x24_64x11_2x1_v_bz_TNT                     cublasLt gemm
        sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_...   cudnn    conv tf32
        void pytorch_flash::flash_fwd_kernel<...>               flash    sdpa
        fmha_cutlassF_f16_aligned_64x64_rf_sm80(...)            mem_efficient sdpa f16

    A kernel the rules do not know is ``aten``/``other``; its precision is
    ``None`` where the name does not tell (cuBLASLt's ``nvjet`` names).
    """
    library, role = "aten", "other"
    for lib, kind, pattern in _LIBRARY_RULES:
        if pattern.search(name):
            library, role = lib, kind
            break
    if library == "aten" and re.search(r"\bat::native::|at::native::", name) is None:
        library = "other"
    precision = None
    for mode, pattern in _PRECISION_RULES:
        if pattern.search(name):
            precision = mode
            break
    return CudaKernel(name, library, role, precision)


def cuda_kernel_summary(names: Iterable[str]) -> dict[str, list[CudaKernel]]:
    """Group kernel names by library (``cublas``, ``cudnn``, ``flash``, ...)."""
    groups: dict[str, list[CudaKernel]] = {}
    for name in names:
        kernel = classify_cuda_kernel(name)
        groups.setdefault(kernel.library, []).append(kernel)
    return groups
