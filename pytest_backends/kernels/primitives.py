"""oneDNN's primitive log lines: :class:`Primitive` and :func:`parse_primitive`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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
