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
    "DEFAULT_ID",
    "Axis",
    "AxisNotInConfig",
    "AxisRegistry",
    "AxisValue",
    "BackendConfig",
    "ConfigError",
    "Need",
    "base_test_id",
    "unavailable_reason",
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


_DEVICE_NAMES = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}


def unavailable_reason(
    config: BackendConfig, registry: AxisRegistry, avail: Availability
) -> str | None:
    """Why ``config`` cannot run here (a skip reason), or ``None`` if it can.

    The device comes first: a config whose device is missing is skipped for
    that reason alone, naming the value that put it on that device.
    """
    values = [(registry.axis(a), registry.axis(a).value(v)) for a, v in config.choices]
    device = config.device
    if device in ("cuda", "mps"):
        check = avail.missing(device)
        if check is not None:
            cause = next(
                (
                    axis.token(value.name)
                    for axis, value in values
                    if axis.name == "device" or value.devices == frozenset({device})
                ),
                f"device-{device}",
            )
            return f"{cause} {check}"
    reasons: list[str] = []
    for axis, value in values:
        token = axis.token(value.name)
        if value.devices is not None and device not in value.devices:
            where = " and ".join(_DEVICE_NAMES[d] for d in sorted(value.devices))
            reasons.append(
                f"{token} only acts on {where} kernels; this config runs on device-{device}"
            )
            continue
        for other_axis, wanted in value.requires:
            got = config.axes.get(other_axis)
            if got is not None and got != wanted:
                other = registry.axis(other_axis)
                reasons.append(
                    f"{token} needs {other.token(wanted)}; this config has {other.token(got)}"
                )
        for need in value.needs:
            why = need(avail)
            if why is not None:
                reasons.append(f"{token} {why}")
        for name in value.needs_flags:
            why = avail.flag_missing(name)
            if why is not None:
                reasons.append(f"{token} {why}")
    unique = list(dict.fromkeys(reasons))
    return "; ".join(unique) or None
