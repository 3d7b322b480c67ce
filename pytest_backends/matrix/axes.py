"""The built-in axes: a declarative table of every axis and value the matrix knows.

Each :class:`~pytest_backends.matrix.configs.AxisValue` says which flags it
sets (possibly depending on the flags the running torch has), the devices it
acts on and what it needs from the machine; :doc:`/reference/axes` documents
them.  Plugins add axes with the ``pytest_backends_configurations`` hook
(:func:`pytest_backends.matrix.registry.axis_registry`).  Nothing here
imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pytest_backends.matrix.configs import Axis, AxisRegistry, AxisValue, Need

if TYPE_CHECKING:
    from pytest_backends.matrix.availability import Availability

__all__ = ["BUILTIN_AXES", "builtin_registry"]


_CUDA = frozenset({"cuda"})
_CPU = frozenset({"cpu"})


def _present(available: frozenset[str], mapping: Mapping[str, object]) -> dict[str, object]:
    return {name: value for name, value in mapping.items() if name in available}


def _tf32(on: bool) -> Callable[[frozenset[str]], Mapping[str, object]]:
    def flags(available: frozenset[str]) -> Mapping[str, object]:
        # The fp32_precision strings where they exist: writing the legacy bools
        # after them makes torch raise on the mix of the two APIs.
        if "cuda.matmul.fp32_precision" in available:
            mode = "tf32" if on else "ieee"
            return _present(
                available,
                {
                    "cuda.matmul.fp32_precision": mode,
                    "cudnn.conv.fp32_precision": mode,
                    "cudnn.rnn.fp32_precision": mode,
                },
            )
        return _present(available, {"cuda.matmul.allow_tf32": on, "cudnn.allow_tf32": on})

    return flags


def _mkldnn_precision(mode: str) -> Callable[[frozenset[str]], Mapping[str, object]]:
    def flags(available: frozenset[str]) -> Mapping[str, object]:
        # Per-op strings, not mkldnn.fp32_precision: that one writes the
        # generic (``fp32_precision``) precision too.
        return _present(
            available, {f"mkldnn.{op}.fp32_precision": mode for op in ("matmul", "conv", "rnn")}
        )

    return flags


def _sdpa(kernel: str) -> Callable[[frozenset[str]], Mapping[str, object]]:
    def flags(available: frozenset[str]) -> Mapping[str, object]:
        kernels = ("flash", "mem_efficient", "math", "cudnn", "fa3", "overrideable")
        return _present(available, {f"sdp.{k}": k == kernel for k in kernels})

    return flags


def _deterministic(on: bool) -> Callable[[frozenset[str]], Mapping[str, object]]:
    def flags(available: frozenset[str]) -> Mapping[str, object]:
        wanted: dict[str, object] = {"deterministic_algorithms": on}
        if on:
            wanted["deterministic_algorithms.warn_only"] = False
        wanted["cudnn.deterministic"] = on
        wanted["mkldnn.deterministic"] = on
        return _present(available, wanted)

    return flags


def _needs(check: str) -> Need:
    def need(avail: Availability) -> str | None:
        return avail.missing(check)

    need.__qualname__ = f"needs({check})"
    return need


def _on_off(
    name: str,
    doc: str,
    flag: str | None,
    *,
    on_doc: str,
    off_doc: str,
    on_devices: frozenset[str] | None = None,
    on_needs: tuple[Need, ...] = (),
    on_flags: Callable[[frozenset[str]], Mapping[str, object]] | None = None,
    off_flags: Callable[[frozenset[str]], Mapping[str, object]] | None = None,
    home: str | None = None,
) -> Axis:
    def fixed(value: bool) -> Mapping[str, object]:
        return {flag: value} if flag else {}

    return Axis(
        name,
        (
            AxisValue(
                "on",
                on_doc,
                on_flags or fixed(True),
                devices=on_devices,
                needs=on_needs,
                needs_flags=(flag,) if flag else (),
            ),
            AxisValue(
                "off", off_doc, off_flags or fixed(False), needs_flags=(flag,) if flag else ()
            ),
        ),
        doc,
        home=home,
    )


def _cap_value(level: str, doc: str) -> AxisValue:
    return AxisValue(level, doc, needs=(_needs(f"cpu_capability:{level}"),))


BUILTIN_AXES: tuple[Axis, ...] = (
    _on_off(
        "cudnn",
        "cuDNN kernels for GPU convolutions, RNNs and batch norm",
        "cudnn.enabled",
        on_doc="cuDNN may run (torch's default); needs CUDA with cuDNN",
        off_doc="cuDNN is disabled: torch's native CUDA kernels run instead",
        on_devices=_CUDA,
        on_needs=(_needs("cudnn"),),
        home="cuda",
    ),
    _on_off(
        "cudnn_benchmark",
        "cuDNN autotuning of convolution algorithms",
        "cudnn.benchmark",
        on_doc="cuDNN benchmarks algorithms per input shape and picks the fastest",
        off_doc="cuDNN uses its heuristics (torch's default)",
        on_devices=_CUDA,
        on_needs=(_needs("cudnn"),),
        home="cuda",
    ),
    _on_off(
        "mkldnn",
        "oneDNN (MKL-DNN) kernels for CPU convolutions, RNNs and reduced-precision GEMMs",
        "mkldnn.enabled",
        on_doc="oneDNN may run (torch's default; torch still picks kernels per shape)",
        off_doc="oneDNN is disabled: native CPU kernels (or NNPACK) run instead",
        on_devices=_CPU,
        on_needs=(_needs("mkldnn"),),
        home="cpu",
    ),
    _on_off(
        "nnpack",
        "NNPACK convolutions on the CPU",
        "nnpack.enabled",
        on_doc="NNPACK may run (torch's default; used for batch >= 16 when oneDNN does not "
        "take the conv)",
        off_doc="NNPACK is disabled",
        on_devices=_CPU,
        on_needs=(_needs("nnpack"),),
        home="cpu",
    ),
    _on_off(
        "tf32",
        "TF32 in cuBLAS matmuls and cuDNN convolutions/RNNs",
        None,
        on_doc="fp32 matmuls and convolutions may use TF32 tensor cores (10-bit mantissa inputs)",
        off_doc="full IEEE fp32 (torch's default for matmuls)",
        on_devices=_CUDA,
        on_flags=_tf32(True),
        off_flags=_tf32(False),
        home="cuda",
    ),
    Axis(
        "mkldnn_precision",
        (
            AxisValue("ieee", "full fp32 in oneDNN (torch's default)", _mkldnn_precision("ieee")),
            AxisValue(
                "bf16",
                "oneDNN may compute fp32 matmuls, convolutions and RNNs in bf16",
                _mkldnn_precision("bf16"),
                devices=_CPU,
                needs=(_needs("mkldnn"), _needs("mkldnn_bf16")),
                needs_flags=("mkldnn.matmul.fp32_precision",),
                requires=(("mkldnn", "on"),),
            ),
            AxisValue(
                "tf32",
                "oneDNN may compute fp32 matmuls, convolutions and RNNs in TF32",
                _mkldnn_precision("tf32"),
                devices=_CPU,
                needs=(_needs("mkldnn"), _needs("mkldnn_tf32")),
                needs_flags=("mkldnn.matmul.fp32_precision",),
                requires=(("mkldnn", "on"),),
            ),
        ),
        "reduced-precision fp32 in oneDNN CPU kernels (mkldnn.{matmul,conv,rnn}.fp32_precision)",
        home="cpu",
    ),
    _on_off(
        "rpr",
        "fp16/bf16 reduced-precision reductions in cuBLAS GEMMs",
        None,
        on_doc="cuBLAS may reduce fp16/bf16 GEMMs in reduced precision (torch's default)",
        off_doc="cuBLAS reduces fp16/bf16 GEMMs in fp32",
        on_devices=_CUDA,
        home="cuda",
        on_flags=lambda available: _present(
            available,
            {
                "cuda.matmul.allow_fp16_reduced_precision_reduction": True,
                "cuda.matmul.allow_bf16_reduced_precision_reduction": True,
            },
        ),
        off_flags=lambda available: _present(
            available,
            {
                "cuda.matmul.allow_fp16_reduced_precision_reduction": False,
                "cuda.matmul.allow_bf16_reduced_precision_reduction": False,
            },
        ),
    ),
    Axis(
        "sdpa",
        (
            AxisValue(
                "math",
                "only the math (reference) SDPA kernel",
                _sdpa("math"),
                needs_flags=("sdp.math",),
            ),
            AxisValue(
                "flash",
                "only the flash-attention SDPA kernel (CUDA, and a CPU kernel)",
                _sdpa("flash"),
                devices=frozenset({"cpu", "cuda"}),
                needs_flags=("sdp.flash",),
            ),
            AxisValue(
                "efficient",
                "only the memory-efficient SDPA kernel (CUDA only)",
                _sdpa("mem_efficient"),
                devices=_CUDA,
                needs_flags=("sdp.mem_efficient",),
            ),
            AxisValue(
                "cudnn",
                "only the cuDNN SDPA kernel (CUDA with cuDNN)",
                _sdpa("cudnn"),
                devices=_CUDA,
                needs=(_needs("cudnn"),),
                needs_flags=("sdp.cudnn",),
            ),
        ),
        "which scaled_dot_product_attention kernel may run (exactly one is enabled)",
        home="cuda",
    ),
    _on_off(
        "deterministic",
        "deterministic algorithms",
        None,
        on_doc="torch.use_deterministic_algorithms(True) plus cudnn.deterministic and "
        "mkldnn.deterministic; nondeterministic ops raise",
        off_doc="deterministic mode off (torch's default)",
        on_flags=_deterministic(True),
        off_flags=_deterministic(False),
    ),
    Axis(
        "device",
        (
            AxisValue("cpu", "tensors on the CPU", devices=_CPU),
            AxisValue(
                "cuda", "tensors on the current CUDA device", devices=_CUDA, needs=(_needs("cuda"),)
            ),
            AxisValue(
                "mps",
                "tensors on Apple's Metal (MPS) device",
                devices=frozenset({"mps"}),
                needs=(_needs("mps"),),
            ),
        ),
        "the device the test runs on (the backend_device fixture); sets no flags",
    ),
    Axis(
        "cpu_capability",
        (
            _cap_value("default", "torch's scalar/baseline CPU kernels"),
            _cap_value("avx2", "x86 AVX2 kernels"),
            _cap_value("avx512", "x86 AVX-512 kernels"),
            _cap_value("vsx", "POWER VSX kernels"),
            _cap_value("zvector", "s390x z/Architecture vector kernels"),
            _cap_value("sve256", "Arm SVE kernels, 256-bit vectors"),
        ),
        "the CPU capability level torch's kernels were built for (ATEN_CPU_CAPABILITY); "
        "process-level: fixed when torch is imported, so sets no flags",
        id_prefix="cap",
        process_level=True,
    ),
)


def builtin_registry() -> AxisRegistry:
    """A registry of the built-in axes only."""
    return AxisRegistry(BUILTIN_AXES)
