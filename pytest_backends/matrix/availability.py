"""What this machine and this torch can run: skip reasons and the report header.

:func:`probe` reads torch's read-only queries once (``torch.cuda.is_available()``,
``torch.backends.*.is_available()``, the CPU capability level and features, the
flags the running torch has) into a frozen :class:`Availability`.
:func:`unavailable_reason` turns a configuration that cannot run here into a
precise skip reason.  Availability never changes which configurations are
collected, only whether they are skipped.

Torch is imported by :func:`probe`, never at module import.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_backends import _shared
from pytest_backends.capability import levels as capability
from pytest_backends.flags import torch_imported as torch_imported

__all__ = [
    "Availability",
    "header_lines",
    "probe",
]


@dataclass(frozen=True)
class Availability:
    """A snapshot of what the running torch on this machine supports."""

    torch_version: str
    cuda_built: str | None = None
    cuda: bool = False
    cuda_devices: tuple[str, ...] = ()
    cudnn: bool = False
    cudnn_version: int | None = None
    cusparselt: bool = False
    mps_built: bool = False
    mps: bool = False
    mkl: bool = False
    mkldnn: bool = False
    nnpack: bool = False
    openmp: bool = False
    opt_einsum: bool = False
    cpu_capability: str = "DEFAULT"
    arch: str = "x86_64"
    cpu_features: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    absent_flags: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def _cuda_reason(self) -> str:
        if self.cuda_built is None:
            build = f"torch {self.torch_version} is a CPU-only build"
        else:
            build = (
                f"torch {self.torch_version} was built for CUDA {self.cuda_built} but sees no GPU"
            )
        return f"needs CUDA: torch.cuda.is_available() is False ({build})"

    def _mps_reason(self) -> str:
        if not self.mps_built:
            return (
                "needs MPS: torch.backends.mps.is_available() is False "
                f"(torch {self.torch_version} was built without MPS)"
            )
        return (
            "needs MPS: torch.backends.mps.is_available() is False "
            "(MPS needs macOS 12.3+ on Apple silicon or an AMD GPU)"
        )

    def missing(self, check: str) -> str | None:
        """Why this machine fails ``check`` (a phrase after the value's token), or ``None``.

        Checks: ``cuda``, ``cudnn``, ``mps``, ``mkldnn``, ``nnpack``,
        ``mkldnn_bf16``, ``mkldnn_tf32`` and ``cpu_capability:<level>``.
        """
        if check == "cuda":
            return None if self.cuda else self._cuda_reason()
        if check == "mps":
            return None if self.mps else self._mps_reason()
        if check == "cudnn":
            if not self.cuda:
                return self._cuda_reason()
            return (
                None
                if self.cudnn
                else ("needs cuDNN: torch.backends.cudnn.is_available() is False")
            )
        if check == "mkldnn":
            return (
                None
                if self.mkldnn
                else ("needs oneDNN: torch.backends.mkldnn.is_available() is False")
            )
        if check == "nnpack":
            return (
                None
                if self.nnpack
                else ("needs NNPACK: torch.backends.nnpack.is_available() is False")
            )
        if check == "mkldnn_bf16":
            return (
                None
                if self._mkldnn_bf16()
                else (
                    "needs a CPU with bf16 support in oneDNN (x86: AVX512BW+VL+DQ or "
                    "AVX-NE-CONVERT; Arm: BF16); "
                    f"this {self.arch} CPU has neither, so the flag would change nothing"
                )
            )
        if check == "mkldnn_tf32":
            if self.arch == "x86_64" and "amxfp16" in self.cpu_features:
                return None
            return (
                "needs a CPU with AMX-FP16 (torch lets oneDNN use TF32 only there); "
                f"this {self.arch} CPU lacks it, so the flag would change nothing"
            )
        if check.startswith("cpu_capability:"):
            return self._capability(check.partition(":")[2])
        raise ValueError(f"unknown availability check {check!r}")

    def _mkldnn_bf16(self) -> bool:
        have = self.cpu_features
        if self.arch == "x86_64":
            return {"avx512bw", "avx512vl", "avx512dq"} <= have or "avxneconvert" in have
        return self.arch == "aarch64" and "bf16" in have

    def _capability(self, level: str) -> str | None:
        info = capability.LEVELS.get(level)
        if info is None:
            return f"is not a CPU capability level torch knows ({', '.join(capability.LEVELS)})"
        hardware = capability.unsupported_reason(level, arch=self.arch, features=self.cpu_features)
        if hardware is not None:
            prefix = f"{capability.level_id(level)}: "
            return "cannot run on this machine: " + hardware.removeprefix(prefix)
        if info.reported == self.cpu_capability:
            return None
        return (
            f"runs in a process of its own (ATEN_CPU_CAPABILITY={level} is read once, when "
            f"torch is imported); this process runs torch's {self.cpu_capability} kernels: "
            f"add --backends-cpu-capability={level} to run it in an xdist worker of that level"
        )

    def flag_missing(self, name: str) -> str | None:
        """Why the running torch lacks flag ``name``, or ``None`` if it has it."""
        if name in self.flags:
            return None
        why = self.absent_flags.get(name, "not in this torch")
        return f"needs flag {name!r}, which torch {self.torch_version} lacks ({why})"


def _bool_call(obj: Any, name: str) -> bool:
    fn = getattr(obj, name, None)
    try:
        return bool(fn()) if fn is not None else False
    except Exception:  # a broken backend query means "not available"
        return False


@functools.lru_cache(maxsize=1)
def probe() -> Availability:
    """Probe the running torch and machine (imports torch; cached per process)."""
    import torch
    import torch.backends.opt_einsum

    from pytest_backends.flags import registry

    cuda = _bool_call(torch.cuda, "is_available")
    devices: tuple[str, ...] = ()
    if cuda:
        devices = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    cudnn = cuda and _bool_call(torch.backends.cudnn, "is_available")
    cusparselt_mod = getattr(torch.backends, "cusparselt", None)
    flags = registry()
    return Availability(
        torch_version=str(torch.__version__),
        cuda_built=getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None),
        cuda=cuda,
        cuda_devices=devices,
        cudnn=cudnn,
        cudnn_version=getattr(torch.backends.cudnn, "version")() if cudnn else None,  # noqa: B009
        cusparselt=_bool_call(cusparselt_mod, "is_available"),
        mps_built=_bool_call(torch.backends.mps, "is_built"),
        mps=_bool_call(torch.backends.mps, "is_available"),
        mkl=_bool_call(torch.backends.mkl, "is_available"),
        mkldnn=_bool_call(torch.backends.mkldnn, "is_available"),
        nnpack=_bool_call(torch.backends.nnpack, "is_available"),
        openmp=_bool_call(torch.backends.openmp, "is_available"),
        opt_einsum=_bool_call(torch.backends.opt_einsum, "is_available"),
        cpu_capability=capability.effective_level(),
        arch=capability.machine_arch(),
        cpu_features=capability.cpu_features(),
        flags=frozenset(flags.names()),
        absent_flags=dict(flags.absent),
    )


def _yes(flag: bool, detail: str = "") -> str:
    return ("yes" + (f" ({detail})" if detail else "")) if flag else "no"


def header_lines(avail: Availability) -> list[str]:
    """The availability lines of the pytest report header."""
    if avail.cuda:
        cuda = _yes(True, f"CUDA {avail.cuda_built}, " + ", ".join(avail.cuda_devices))
    elif avail.cuda_built:
        cuda = f"no (built for CUDA {avail.cuda_built}, no GPU visible)"
    else:
        cuda = "no (CPU-only build)"
    gpu = [
        f"torch {avail.torch_version}",
        f"CUDA: {cuda}",
        f"cuDNN: {_yes(avail.cudnn, str(avail.cudnn_version or ''))}",
        f"cuSPARSELt: {_yes(avail.cusparselt)}",
        f"MPS: {_yes(avail.mps) if avail.mps_built else 'no (not built)'}",
    ]
    cpu = [
        f"CPU capability: {avail.cpu_capability} ({avail.arch})",
        f"MKL: {_yes(avail.mkl)}",
        f"MKL-DNN: {_yes(avail.mkldnn)}",
        f"NNPACK: {_yes(avail.nnpack)}",
        f"OpenMP: {_yes(avail.openmp)}",
        f"opt_einsum: {_yes(avail.opt_einsum)}",
    ]
    return ["backends: " + "; ".join(gpu), "backends: " + "; ".join(cpu)]


HINT = (
    "backends: availability not probed (torch is not imported yet); it is shown with "
    "--backends-matrix or when a collected test carries @pytest.mark.backends"
)


def default_label() -> str:
    """``host/CPU capability/GPU name`` of this process (imports torch)."""
    avail = probe()
    host = socket.gethostname().split(".", 1)[0] or "localhost"
    gpu = avail.cuda_devices[0] if avail.cuda_devices else "cpu"
    return f"{host}/{avail.cpu_capability}/{gpu}"


def run_label(config: pytest.Config) -> str:
    """The label of this run: ``--backends-label`` if given, else :func:`default_label`."""
    explicit = _shared.explicit_label(config)
    return explicit if explicit is not None else default_label()
