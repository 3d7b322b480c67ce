"""Backend configurations as data: axes, their values, and ``BackendConfig``.

An *axis* is one dimension of the matrix (``mkldnn``, ``sdpa``, ``device``, ...)
with a fixed, ordered tuple of *values*.  A *configuration* picks one value on
some axes; its id joins one ``<axis>-<value>`` token per axis with ``,``
(``cudnn-off,sdpa-math``), always in the registry's axis order, so ids are
unique, stable and identical on every machine.

What a value *does* is data too: the torch flags it sets (which may depend on
the flags the running torch has, e.g. the ``fp32_precision`` API), the devices
it can run on, and what it needs from the machine.  Whether a configuration can
run *here* is decided by :mod:`pytest_backends.matrix.availability`; that never changes
which configurations exist.

Nothing here imports torch.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_backends.matrix.availability import Availability

__all__ = [
    "BUILTIN_AXES",
    "DEFAULT_ID",
    "Axis",
    "AxisNotInConfig",
    "AxisRegistry",
    "AxisValue",
    "BackendConfig",
    "ConfigError",
    "Need",
    "base_test_id",
    "builtin_registry",
]

#: The id of the configuration that sets nothing (torch's defaults).
DEFAULT_ID = "default"

#: Why a value cannot run on a machine (a reason fragment), or ``None``.
Need = Callable[["Availability"], str | None]

#: The flags a value sets, given the flag names the running torch has.
FlagsSpec = Mapping[str, object] | Callable[[frozenset[str]], Mapping[str, object]]

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_VALUE = re.compile(r"[a-z0-9][a-z0-9_.]*\Z")
DEVICES = ("cpu", "cuda", "mps")


class ConfigError(ValueError):
    """An axis definition or a combination of values is invalid."""


@dataclass(frozen=True)
class AxisValue:
    """One value of an axis.

    ``flags`` is a mapping of flag name to value, or a function of the set of
    flag names the running torch has (so a value can use a new API where it
    exists and a legacy one elsewhere).  ``devices`` lists the devices the value
    acts on (``None``: any); a value limited to one device decides the device of
    a configuration without a ``device`` axis.  ``needs`` are checks of the
    machine, each returning a reason fragment or ``None``; ``needs_flags`` are
    flags that must exist in the running torch; ``requires`` lists
    ``(axis, value)`` pairs that must not be contradicted by the same
    configuration (``mkldnn_precision-bf16`` requires ``mkldnn-on``).
    """

    name: str
    doc: str
    flags: FlagsSpec = field(default_factory=dict, compare=False, hash=False)
    devices: frozenset[str] | None = None
    needs: tuple[Need, ...] = field(default=(), compare=False, hash=False)
    needs_flags: tuple[str, ...] = ()
    requires: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _VALUE.match(self.name):
            raise ConfigError(
                f"invalid axis value name {self.name!r}: use lower-case letters, digits, "
                "'_' and '.', starting with a letter or digit"
            )
        if self.devices is not None:
            unknown = sorted(set(self.devices) - set(DEVICES))
            if unknown:
                raise ConfigError(f"value {self.name!r}: unknown devices {unknown}")

    def resolve_flags(self, available: frozenset[str]) -> Mapping[str, object]:
        """The flags this value sets in a torch that has the ``available`` flags."""
        spec = self.flags
        return spec(available) if callable(spec) else spec


@dataclass(frozen=True)
class Axis:
    """One dimension of the matrix.

    ``id_prefix`` starts every id token of the axis (default: its name).
    ``home`` is the device the axis is about (``"cuda"`` for cuDNN, cuBLAS and
    SDPA, ``"cpu"`` for oneDNN and NNPACK, ``None`` for neither); it is used to
    pick the device of a configuration that has no ``device`` axis.
    ``process_level`` marks an axis that can only change in a new process
    (the CPU capability level); such an axis sets no flags.
    """

    name: str
    values: tuple[AxisValue, ...]
    doc: str
    id_prefix: str = ""
    home: str | None = None
    process_level: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(
                f"invalid axis name {self.name!r}: use lower-case letters, digits and '_', "
                "starting with a letter"
            )
        if not self.id_prefix:
            object.__setattr__(self, "id_prefix", self.name)
        elif not _NAME.match(self.id_prefix):
            raise ConfigError(f"axis {self.name!r}: invalid id_prefix {self.id_prefix!r}")
        object.__setattr__(self, "values", tuple(self.values))
        if not self.values:
            raise ConfigError(f"axis {self.name!r} has no values")
        names = [v.name for v in self.values]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"axis {self.name!r} repeats values {duplicates}")
        if self.home is not None and self.home not in DEVICES:
            raise ConfigError(f"axis {self.name!r}: unknown home device {self.home!r}")

    @property
    def value_names(self) -> tuple[str, ...]:
        """The value names, in order."""
        return tuple(v.name for v in self.values)

    def value(self, name: str) -> AxisValue:
        """The value called ``name``; ``KeyError`` if there is none."""
        for value in self.values:
            if value.name == name:
                return value
        raise KeyError(name)

    def token(self, value: str) -> str:
        """The id token of ``value`` on this axis: ``mkldnn-off``."""
        return f"{self.id_prefix}-{value}"


@dataclass(frozen=True)
class BackendConfig:
    """One backend configuration: a value on each of some axes.

    Frozen and hashable.  ``id`` is the stable, readable id used in test ids
    (``mkldnn-off``, ``cudnn-on,sdpa-math``; ``default`` when no axis is set).
    ``axes`` maps axis name to value, ``flags`` maps torch flag name to the
    value the configuration sets (already adapted to the running torch), and
    ``device`` is the device the test should use (``cpu``, ``cuda`` or ``mps``).
    """

    choices: tuple[tuple[str, str], ...] = ()
    device: str = "cpu"
    tokens: tuple[str, ...] = field(default=(), compare=False)
    flag_items: tuple[tuple[str, object], ...] = field(default=(), compare=False)
    process_axes: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def id(self) -> str:
        """The id: one ``<axis>-<value>`` token per axis, joined with ``,``."""
        return ",".join(self.tokens) or DEFAULT_ID

    @property
    def axes(self) -> Mapping[str, str]:
        """Axis name -> value name (an axis it lacks raises :class:`AxisNotInConfig`)."""
        return MappingProxyType(_Axes(self.id, self.choices))

    @property
    def flags(self) -> Mapping[str, object]:
        """Torch flag name -> value, as applied around the test."""
        return MappingProxyType(dict(self.flag_items))

    @property
    def process_level(self) -> Mapping[str, str]:
        """The choices on process-level axes (e.g. ``{"cpu_capability": "avx2"}``)."""
        return MappingProxyType({a: v for a, v in self.choices if a in self.process_axes})

    def __str__(self) -> str:
        return self.id


def base_test_id(nodeid: str, config_id: str) -> str:
    """The node id without the config's part of the parameter id.

    ``t.py::test_x[3-mkldnn-off]`` with config ``mkldnn-off`` -> ``t.py::test_x[3]``.
    """
    start = nodeid.find("[", nodeid.rfind("::") + 1)
    if config_id == DEFAULT_ID or start < 0 or not nodeid.endswith("]"):
        return nodeid
    head, inner = nodeid[:start], nodeid[start + 1 : -1]
    if inner == config_id:
        return head
    if inner.startswith(config_id + "-"):
        rest = inner[len(config_id) + 1 :]
    elif inner.endswith("-" + config_id):
        rest = inner[: -len(config_id) - 1]
    elif f"-{config_id}-" in inner:
        rest = inner.replace(f"-{config_id}-", "-", 1)
    else:
        return nodeid
    return f"{head}[{rest}]"


class AxisNotInConfig(KeyError):
    """``config.axes[name]`` for an axis the configuration does not have; says what to mark."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _Axes(dict[str, str]):
    def __init__(self, config_id: str, choices: Iterable[tuple[str, str]]) -> None:
        super().__init__(choices)
        self.config_id = config_id

    def __missing__(self, name: str) -> str:
        raise AxisNotInConfig(
            f"{name!r}: the configuration {self.config_id!r} has no {name!r} axis. The test "
            f"runs under it because it is not marked @pytest.mark.backends({name!r}) (add "
            "the marker), or because the matrix is off or restricted to other axes "
            f"(--backends-matrix, --backends-matrix={name})"
        )


#: The configuration with no axes: torch's defaults, on the CPU.
DEFAULT_CONFIG = BackendConfig()


class AxisRegistry:
    """The known axes, in id order, and the factory of configurations.

    Immutable once built; :meth:`extended` returns a new registry with axes or
    values added (by plugins through ``pytest_backends_configurations``).
    """

    def __init__(self, axes: Iterable[Axis]) -> None:
        self._axes: dict[str, Axis] = {}
        prefixes: dict[str, str] = {}
        for axis in axes:
            if axis.name in self._axes:
                raise ConfigError(f"axis {axis.name!r} is defined twice")
            if axis.id_prefix in prefixes:
                raise ConfigError(
                    f"axes {prefixes[axis.id_prefix]!r} and {axis.name!r} share the id "
                    f"prefix {axis.id_prefix!r}"
                )
            prefixes[axis.id_prefix] = axis.name
            self._axes[axis.name] = axis
        self._order = {name: i for i, name in enumerate(self._axes)}
        self._by_prefix = {axis.id_prefix: axis for axis in self._axes.values()}

    def __iter__(self) -> Iterator[Axis]:
        return iter(self._axes.values())

    def __contains__(self, name: object) -> bool:
        return name in self._axes

    def __len__(self) -> int:
        return len(self._axes)

    @property
    def names(self) -> tuple[str, ...]:
        """Axis names in id order."""
        return tuple(self._axes)

    def axis(self, name: str) -> Axis:
        """The axis called ``name``; ``KeyError`` if unknown."""
        return self._axes[name]

    def extended(self, additions: Iterable[Axis]) -> AxisRegistry:
        """A registry with ``additions``: new axes go last; a known name adds values."""
        axes = dict(self._axes)
        for add in additions:
            if not isinstance(add, Axis):
                raise ConfigError(
                    f"pytest_backends_configurations must return Axis objects, got {add!r}"
                )
            old = axes.get(add.name)
            if old is None:
                axes[add.name] = add
                continue
            clash = sorted(set(old.value_names) & set(add.value_names))
            if clash:
                raise ConfigError(f"axis {add.name!r} already has values {clash}")
            axes[add.name] = Axis(
                old.name,
                old.values + add.values,
                old.doc,
                old.id_prefix,
                old.home,
                old.process_level,
            )
        return AxisRegistry(axes.values())

    def canonical(self, choices: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """Validate ``choices`` and put them in id order (axes, then nothing else)."""
        for name, value in choices.items():
            axis = self._axes.get(name)
            if axis is None:
                raise ConfigError(f"unknown axis {name!r}")
            if value not in axis.value_names:
                raise ConfigError(f"axis {name!r} has no value {value!r}")
        return tuple(sorted(choices.items(), key=lambda kv: self._order[kv[0]]))

    def product(self, selection: Mapping[str, Sequence[str]]) -> list[tuple[tuple[str, str], ...]]:
        """Every combination of the selected values, in stable id order.

        Axes are taken in registry order and values in their axis's order,
        whatever order ``selection`` lists them in.
        """
        axes = [name for name in self._axes if name in selection]
        unknown = sorted(set(selection) - set(axes))
        if unknown:
            raise ConfigError(f"unknown axes {unknown}")
        columns = []
        for name in axes:
            wanted = set(selection[name])
            columns.append([(name, v) for v in self._axes[name].value_names if v in wanted])
        return [tuple(combo) for combo in itertools.product(*columns)]

    def sort_key(self, choices: Iterable[tuple[str, str]]) -> tuple[tuple[int, int], ...]:
        """A key that sorts configurations in id order."""
        key = []
        for name, value in choices:
            axis = self._axes[name]
            key.append((self._order[name], axis.value_names.index(value)))
        return tuple(key)

    def parse_token(self, token: str) -> tuple[str, str]:
        """``mkldnn-off`` -> ``("mkldnn", "off")``; ``ConfigError`` if it names nothing."""
        prefix, sep, value = token.partition("-")
        axis = self._by_prefix.get(prefix)
        if not sep or axis is None or value not in axis.value_names:
            raise ConfigError(f"{token!r} is not a configuration token")
        return axis.name, value

    def parse_id(self, config_id: str) -> tuple[tuple[str, str], ...]:
        """The choices of a configuration id (``default`` has none)."""
        if config_id == DEFAULT_ID:
            return ()
        pairs = [self.parse_token(t) for t in config_id.split(",")]
        if len({a for a, _ in pairs}) != len(pairs):
            raise ConfigError(f"{config_id!r} names an axis twice")
        return self.canonical(dict(pairs))

    def all_tokens(self) -> list[str]:
        """Every valid id token, in order (for error messages)."""
        return [axis.token(v) for axis in self for v in axis.value_names]

    def make(
        self,
        choices: Mapping[str, str] | Sequence[tuple[str, str]],
        *,
        available_flags: frozenset[str],
        cuda_available: bool,
    ) -> BackendConfig:
        """Build the configuration for ``choices``.

        ``available_flags`` (the flag names of the running torch) decide which
        flags each value sets; ``cuda_available`` only decides the device of a
        configuration that has no ``device`` axis and no value that fixes one.
        Two values that set the same flag differently are a ``ConfigError``.
        """
        pairs = self.canonical(dict(choices))
        values = [(self._axes[a], self._axes[a].value(v)) for a, v in pairs]
        flags: dict[str, object] = {}
        owner: dict[str, str] = {}
        for axis, value in values:
            for name, setting in value.resolve_flags(available_flags).items():
                token = axis.token(value.name)
                if name in flags and flags[name] != setting:
                    raise ConfigError(
                        f"{owner[name]} and {token} set flag {name!r} to different values "
                        f"({flags[name]!r} and {setting!r})"
                    )
                flags[name] = setting
                owner[name] = token
        return BackendConfig(
            choices=pairs,
            device=self._device(values, cuda_available),
            tokens=tuple(axis.token(value.name) for axis, value in values),
            flag_items=tuple(flags.items()),
            process_axes=frozenset(a.name for a, _ in values if a.process_level),
        )

    @staticmethod
    def _device(values: Sequence[tuple[Axis, AxisValue]], cuda_available: bool) -> str:
        for axis, value in values:
            if axis.name == "device":
                return value.name
        for _axis, value in values:
            if value.devices is not None and len(value.devices) == 1:
                return next(iter(value.devices))
        homes = {axis.home for axis, _ in values} - {None}
        if cuda_available and homes == {"cuda"}:
            return "cuda"
        return "cpu"


# --- the built-in axes --------------------------------------------------------------------

_CUDA = frozenset({"cuda"})
_CPU = frozenset({"cpu"})


def _present(available: frozenset[str], mapping: Mapping[str, object]) -> dict[str, object]:
    return {name: value for name, value in mapping.items() if name in available}


def _tf32(on: bool) -> Callable[[frozenset[str]], Mapping[str, object]]:
    def flags(available: frozenset[str]) -> Mapping[str, object]:
        # The fp32_precision strings where they exist: writing the legacy bools
        # after them makes torch raise on the mix (DESIGN A.2.1).
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
        # generic precision too (DESIGN A.2.3).
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
