"""CPU capability levels: which exist, which this CPU can run, and how to select one.

PyTorch picks the vectorised kernels of its CPU operators (``DEFAULT``,
``AVX2``, ``AVX512`` on x86; ``VSX``, ``ZVECTOR``, ``SVE256`` elsewhere) once,
when torch is imported, from the ``ATEN_CPU_CAPABILITY`` environment variable
or from the CPU it detects.  A level can therefore only be chosen for a fresh
process, before ``import torch``.  This module holds the pure part of that:
the level table, the hardware check, the environment of a level's process and
the verification of the level a process really got.  Running the processes
is :mod:`pytest_backends.capability.plugin`'s job (as pytest-xdist workers).

Torch does not check the hardware: ``ATEN_CPU_CAPABILITY=avx512`` on a CPU
without AVX-512 reports ``AVX512`` and then dies of an illegal instruction
(or worse, does not, on a hypervisor that traps).  So a level is only run when
this module finds the CPU features it needs.

Nothing here imports torch at module level.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "AXIS",
    "FAKE_FEATURES_ENV",
    "LEVELS",
    "NATIVE_ISA",
    "Level",
    "cpu_features",
    "effective_level",
    "level_env",
    "level_id",
    "machine_arch",
    "native_onednn_isa",
    "onednn_isa_of",
    "parse_cpuinfo",
    "parse_levels",
    "supported_levels",
    "unsupported_reason",
    "verify_level",
]

#: The axis name used by ``@pytest.mark.backends(cpu_capability=[...])``.
AXIS = "cpu_capability"

#: Comma-separated feature edits applied on top of the detected CPU features,
#: to simulate another CPU in tests: ``-avx512f`` removes a feature,
#: ``+sve`` or ``sve`` adds one.  Only the hardware check reads it; torch
#: itself still sees the real CPU.
FAKE_FEATURES_ENV = "PYTEST_BACKENDS_FAKE_CPU_FEATURES"

_CPUINFO = Path("/proc/cpuinfo")
_SVE_LENGTH = Path("/proc/sys/abi/sve_default_vector_length")


@dataclass(frozen=True)
class Level:
    """One CPU capability level.

    ``arch`` is the machine architecture the level exists on (``None``: all of
    them), ``reported`` what ``torch.backends.cpu.get_cpu_capability()``
    returns under it, and ``requires`` the CPU features (lower-case, without
    separators, as in ``/proc/cpuinfo`` flags) the kernels of that level use.
    """

    name: str
    arch: str | None
    reported: str
    requires: tuple[str, ...] = ()


#: Every level torch knows, in the order ids are generated.
LEVELS: dict[str, Level] = {
    level.name: level
    for level in (
        Level("default", None, "DEFAULT"),
        # torch's own detection: AVX2 needs avx2 and fma3; AVX512 needs the
        # avx512 F/BW/DQ/VL subsets (and fma3).
        Level("avx2", "x86_64", "AVX2", ("avx2", "fma")),
        Level(
            "avx512",
            "x86_64",
            "AVX512",
            ("avx512f", "avx512bw", "avx512dq", "avx512vl", "fma"),
        ),
        # Power builds always use VSX; s390x needs the vector enhancements
        # facility; SVE256 needs a 256-bit SVE vector length and BF16.
        Level("vsx", "ppc64le", "VSX"),
        Level("zvector", "s390x", "ZVECTOR", ("vxe",)),
        Level("sve256", "aarch64", "SVE256", ("sve", "bf16", "svevl256")),
    )
}

# Library ISA caps per (arch, level), so that oneDNN and MKL do not dispatch to
# a wider ISA than the ATen kernels under test.  oneDNN's x86 floor is SSE4.1.
# ``avx512`` is x86's top ATen level, and it runs oneDNN at this CPU's own ISA
# (``ALL``: uncapped), so the kernels a plain run uses (VNNI, BF16, AMX) are
# part of the matrix: capping it at AVX512_CORE (ATen's F/BW/DQ/VL subset) would
# leave no level running them, and on a CPU with AMX the bf16 paths of fp32
# matmuls and convolutions would go untested.
NATIVE_ISA = "ALL"
_ONEDNN_ISA: dict[tuple[str, str], str] = {
    ("x86_64", "default"): "SSE41",
    ("x86_64", "avx2"): "AVX2",
    ("x86_64", "avx512"): NATIVE_ISA,
    ("aarch64", "default"): "ADVANCED_SIMD",
    ("aarch64", "sve256"): "SVE_256",
}
# What oneDNN's verbose ``info,cpu,isa:`` line says when capped at each ISA (the
# cap is the level's ISA, which the CPU was checked to have before the level ran).
_ONEDNN_ISA_REPORTED: dict[str, str] = {
    "SSE41": "Intel SSE4.1",
    "AVX2": "Intel AVX2",
    "AVX512_CORE": "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions",
}
_MKL_ISA: dict[tuple[str, str], str] = {
    ("x86_64", "default"): "SSE4_2",
    ("x86_64", "avx2"): "AVX2",
    # avx512: not set, MKL runs at this CPU's own ISA like oneDNN
}

_ARCH_ALIASES = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "x86-64": "x86_64",
    "arm64": "aarch64",
    "ppc64el": "ppc64le",
}

# torch.cpu.get_capabilities() spells some features differently.
_FEATURE_ALIASES = {"fma3": "fma"}


def level_id(level: str) -> str:
    """The id fragment of a level, as it appears in test ids: ``cap-avx2``."""
    return f"cap-{level}"


def machine_arch() -> str:
    """The machine architecture, normalised to the names used in :data:`LEVELS`."""
    machine = platform.machine().lower()
    return _ARCH_ALIASES.get(machine, machine)


def _canonical(feature: str) -> str:
    name = feature.strip().lower().replace("_", "").replace("-", "").replace(".", "")
    return _FEATURE_ALIASES.get(name, name)


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The CPU features listed in ``/proc/cpuinfo`` text (x86 ``flags``, Arm/s390x ``features``)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(_canonical(word) for word in value.split())
    return frozenset()


def _torch_features() -> frozenset[str]:
    import torch

    get = getattr(torch.cpu, "get_capabilities", None)
    if get is None:
        return frozenset()
    return frozenset(_canonical(name) for name, value in get().items() if value is True)


def _detected_features() -> frozenset[str]:
    # /proc/cpuinfo first: it is cheap and needs no torch import, and using one
    # source in every process keeps "all" (hence collection) identical.
    try:
        features = parse_cpuinfo(_CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        features = frozenset()
    if not features:
        features = _torch_features()
    try:
        sve_bytes = int(_SVE_LENGTH.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        sve_bytes = 0
    if sve_bytes:
        features |= {f"svevl{sve_bytes * 8}"}
    return features


def apply_fake_features(features: Iterable[str], spec: str) -> frozenset[str]:
    """Apply a :data:`FAKE_FEATURES_ENV` spec such as ``-avx512f,+sve`` to ``features``."""
    result = set(features)
    for token in spec.replace(";", ",").split(","):
        token = token.strip()
        if not token:
            continue
        if token.startswith("-"):
            result.discard(_canonical(token[1:]))
        else:
            result.add(_canonical(token.removeprefix("+")))
    return frozenset(result)


def cpu_features(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """This CPU's features (canonical names), edited by :data:`FAKE_FEATURES_ENV` if set."""
    env = os.environ if environ is None else environ
    features = _detected_features()
    spec = env.get(FAKE_FEATURES_ENV, "")
    return apply_fake_features(features, spec) if spec else features


def unsupported_reason(
    level: str, *, arch: str | None = None, features: frozenset[str] | None = None
) -> str | None:
    """Why this machine cannot run ``level``, naming the missing feature; ``None`` if it can."""
    info = LEVELS[level]
    arch = machine_arch() if arch is None else arch
    if info.arch is not None and info.arch != arch:
        return f"{level_id(level)}: {level} is a CPU level of {info.arch}, this machine is {arch}"
    if not info.requires:
        return None
    have = cpu_features() if features is None else features
    missing = [feature for feature in info.requires if feature not in have]
    if not missing:
        return None
    faked = f" ({FAKE_FEATURES_ENV} is set)" if os.environ.get(FAKE_FEATURES_ENV) else ""
    return (
        f"{level_id(level)}: this CPU lacks {', '.join(missing)}{faked}; "
        f"ATEN_CPU_CAPABILITY={level} needs {', '.join(info.requires)}"
    )


def supported_levels(
    *, arch: str | None = None, features: frozenset[str] | None = None
) -> tuple[str, ...]:
    """The levels this machine can run, in :data:`LEVELS` order (the meaning of ``all``)."""
    arch = machine_arch() if arch is None else arch
    have = cpu_features() if features is None else features
    return tuple(
        name for name in LEVELS if unsupported_reason(name, arch=arch, features=have) is None
    )


def parse_levels(value: str, source: str) -> tuple[str, ...]:
    """Parse ``default,avx2,avx512`` or ``all``; a bad name is a :class:`pytest.UsageError`.

    ``source`` names the option or ini key for the error message.  Duplicates
    are dropped, the order given is kept.  ``all`` expands to
    :func:`supported_levels`, so only levels this CPU can run.
    """
    names = [part.strip().lower() for part in value.split(",") if part.strip()]
    if not names:
        raise pytest.UsageError(
            f"{source}: expected a comma-separated list of CPU capability levels "
            f"({', '.join(LEVELS)}) or 'all', got {value!r}"
        )
    result: list[str] = []
    for name in names:
        expanded = supported_levels() if name == "all" else (name,)
        for level in expanded:
            if level not in LEVELS:
                raise pytest.UsageError(
                    f"{source}: unknown CPU capability level {name!r}; "
                    f"choose from {', '.join(LEVELS)} or 'all'"
                )
            if level not in result:
                result.append(level)
    return tuple(result)


def level_env(level: str, arch: str | None = None) -> dict[str, str]:
    """The environment variables that select ``level`` for a new process.

    ``ATEN_CPU_CAPABILITY`` picks torch's kernels; ``ONEDNN_MAX_CPU_ISA`` and
    ``MKL_ENABLE_INSTRUCTIONS`` cap oneDNN and MKL at the same ISA where those
    libraries have a matching setting.  They override any value inherited
    from the parent environment.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown CPU capability level {level!r}")
    arch = machine_arch() if arch is None else arch
    env = {"ATEN_CPU_CAPABILITY": level}
    onednn = _ONEDNN_ISA.get((arch, level))
    if onednn is not None:
        env["ONEDNN_MAX_CPU_ISA"] = onednn
    mkl = _MKL_ISA.get((arch, level))
    if mkl is not None:
        env["MKL_ENABLE_INSTRUCTIONS"] = mkl
    return env


# oneDNN's x86 ISA names, widest first, with the CPU features each needs
# (/proc/cpuinfo names, canonical): what an uncapped oneDNN dispatches to.
_ONEDNN_X86_ISAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AVX10_1_512_AMX_FP16", ("amxtile", "amxbf16", "amxint8", "amxfp16", "avx512fp16")),
    ("AVX10_1_512_AMX", ("amxtile", "amxbf16", "amxint8", "avx512fp16")),
    ("AVX512_CORE_AMX", ("amxtile", "amxbf16", "amxint8", "avx512bf16")),
    ("AVX10_1_512", ("avx512fp16", "avx512bf16", "avx512vnni")),
    ("AVX512_CORE_BF16", ("avx512bf16", "avx512vnni")),
    ("AVX512_CORE_VNNI", ("avx512vnni",)),
    ("AVX512_CORE", ("avx512f", "avx512bw", "avx512dq", "avx512vl")),
    ("AVX2_VNNI_2", ("avx2", "avxvnni", "avxvnniint8", "avxneconvert", "avxifma")),
    ("AVX2_VNNI", ("avx2", "avxvnni")),
    ("AVX2", ("avx2",)),
    ("SSE41", ()),
)


def native_onednn_isa(features: frozenset[str] | None = None) -> str:
    """The oneDNN ISA an uncapped oneDNN dispatches to on a CPU with ``features`` (x86)."""
    have = cpu_features() if features is None else features
    for name, needs in _ONEDNN_X86_ISAS:
        if all(feature in have for feature in needs):
            return name
    return "SSE41"


def onednn_isa_of(
    level: str, *, arch: str | None = None, features: frozenset[str] | None = None
) -> str | None:
    """The oneDNN ISA ``level``'s processes run, for the header (``None``: not capped).

    ``"AVX2"`` for a capped level; for x86's top level, which is not capped,
    the ISA this CPU's oneDNN dispatches to, e.g. ``"AVX10_1_512_AMX (this
    CPU's own)"``.
    """
    arch = machine_arch() if arch is None else arch
    cap = _ONEDNN_ISA.get((arch, level))
    if cap == NATIVE_ISA:
        return f"{native_onednn_isa(features)} (this CPU's own)"
    return cap


def effective_level() -> str:
    """``torch.backends.cpu.get_cpu_capability()``, normalised (``Z VECTOR`` -> ``ZVECTOR``)."""
    import torch.backends.cpu

    return str(torch.backends.cpu.get_cpu_capability()).replace(" ", "").upper()


def verify_level(level: str, actual: str | None = None) -> str | None:
    """A message if this process does not run ``level``'s kernels; ``None`` if it does.

    ``actual`` defaults to :func:`effective_level` (which imports torch).
    """
    expected = LEVELS[level].reported
    got = effective_level() if actual is None else actual.replace(" ", "").upper()
    if got == expected:
        return None
    return (
        f"{level_id(level)}: the process started for CPU capability level {level!r} "
        f"runs torch's {got} kernels, not {expected} "
        f"(torch.backends.cpu.get_cpu_capability() returned {got!r} with "
        f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '<unset>')}); "
        "none of this level's tests were run on the wrong kernels"
    )


@functools.cache
def onednn_isa() -> str | None:
    """The ISA oneDNN says it dispatches to (its verbose ``isa:`` line); None if unreadable.

    One small oneDNN primitive runs with the primitive log captured (see
    :class:`pytest_backends.kernels.PrimitiveLog`). oneDNN prints the line once
    per process, with its first logged primitive, so the answer is read once
    (in a fresh worker, before its first test) and kept.
    """
    import torch

    from pytest_backends import kernels

    log = kernels.PrimitiveLog()
    if not log.start():
        return None
    try:
        x = torch.ones(1, 8, 4, 4)
        w = torch.ones(8, 8, 1, 1)
        torch.ops.aten.mkldnn_convolution(x, w, None, [0, 0], [1, 1], [1, 1], 1)
    except (RuntimeError, AttributeError):
        return None
    finally:
        log.stop()
    return parse_onednn_isa(log.text())


def parse_onednn_isa(text: str) -> str | None:
    """The ISA named by oneDNN's ``info,cpu,isa:`` log line in ``text``, if any."""
    for line in text.splitlines():
        fields = line.split(",", 4)
        if len(fields) == 5 and fields[2:4] == ["info", "cpu"] and fields[4].startswith("isa:"):
            return fields[4][4:].strip()
        if len(fields) >= 4 and fields[1:3] == ["info", "cpu"] and fields[3].startswith("isa:"):
            return line.split("isa:", 1)[1].strip()  # logs without the version field
    return None


def verify_onednn(level: str, actual: str | None = None, arch: str | None = None) -> str | None:
    """A message if oneDNN in this process is not capped at ``level``'s ISA; else None.

    ``actual`` defaults to :func:`onednn_isa`. Where the level sets no oneDNN
    cap, or oneDNN's ISA cannot be read (a build without oneDNN, a log
    already printed), there is nothing to check and the answer is None.
    """
    cap = _ONEDNN_ISA.get((machine_arch() if arch is None else arch, level))
    if cap == NATIVE_ISA:
        inherited = os.environ.get("ONEDNN_MAX_CPU_ISA", NATIVE_ISA).strip().upper()
        if inherited in (NATIVE_ISA, ""):
            return None
        return (
            f"{level_id(level)}: the process started for CPU capability level {level!r} "
            f"caps oneDNN at ONEDNN_MAX_CPU_ISA={inherited}, but this level runs oneDNN at "
            "this CPU's own ISA (ONEDNN_MAX_CPU_ISA=ALL); none of this level's tests were "
            "run on the wrong kernels"
        )
    expected = _ONEDNN_ISA_REPORTED.get(cap or "")
    if expected is None:
        return None
    got = onednn_isa() if actual is None else actual
    if got is None or got == expected:
        return None
    return (
        f"{level_id(level)}: the process started for CPU capability level {level!r} "
        f"runs oneDNN's {got!r} kernels, not {expected!r} "
        f"(ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '<unset>')}; oneDNN reads "
        "it once, when it first runs: set it before the process starts); none of this "
        "level's tests were run on the wrong kernels"
    )
