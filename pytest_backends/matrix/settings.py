"""The matrix's settings: its options parsed once into a frozen :class:`MatrixSettings`.

Every option goes through :func:`pytest_backends._options.lookup` (command
line over ini file over default) and a pure parser here that raises
:class:`pytest.UsageError` naming the option.  Names that need the axis
registry (``--backends-matrix=AXES``, ``--backends-config=ID``) are only
checked for syntax here; :func:`check_axes` and :func:`check_config_ids`
check them against the registry once it is built, at session start.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_backends import _options, _shared, _xdist
from pytest_backends.matrix.configs import AxisRegistry, ConfigError

__all__ = [
    "SEED_CHANNEL",
    "SETTINGS_KEY",
    "VERIFY_MODES",
    "MatrixSettings",
    "check_axes",
    "check_config_ids",
    "parse_config_ids",
    "parse_matrix",
    "parse_sample",
    "parse_seed",
    "parse_verify",
    "require_axes",
]

VERIFY_MODES = ("off", "on", "strict")
_ON = ("all", *_options.ON_WORDS)
_OFF = (*_options.OFF_WORDS, "")
_AXIS_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_TOKEN = re.compile(r"[a-z][a-z0-9_]*-[a-z0-9][a-z0-9_.]*\Z")
#: What the xdist controller sends each worker: the sampling seed it resolved.
SEED_CHANNEL = _xdist.channel("seed")


def _path_hint(value: str) -> str:
    looks_like_path = "/" in value or "\\" in value or "::" in value or value.endswith(".py")
    if looks_like_path or Path(value).exists():
        return (
            f" ({value!r} looks like a path: write the option as --OPTION=VALUE, or put "
            "it after the paths)"
        )
    return ""


def parse_matrix(value: str, source: str) -> tuple[bool, tuple[str, ...] | None]:
    """``all``/``on`` -> all marked axes; ``off`` -> disabled; ``a,b`` -> only those axes.

    Returns ``(enabled, axes)``; ``axes`` is ``None`` for "every axis a marker names".
    Names are only checked for syntax here; :func:`check_axes` checks them
    against the registry.
    """
    text = value.strip().lower()
    if text in _OFF:
        return False, None
    if text in _ON:
        return True, None
    names = [part.strip() for part in text.split(",")]
    bad = [n for n in names if not _AXIS_NAME.match(n)]
    if bad:
        raise pytest.UsageError(
            f"{source}: {bad[0]!r} is not an axis name; expected 'all', 'off' or a "
            f"comma-separated list of axes{_path_hint(value).replace('OPTION', 'backends-matrix')}"
        )
    return True, tuple(dict.fromkeys(names))


def check_axes(axes: Sequence[str], registry: AxisRegistry, source: str) -> None:
    """Raise ``UsageError`` naming the valid axes if ``axes`` has an unknown one."""
    for name in axes:
        if name not in registry:
            raise pytest.UsageError(
                f"{source}: unknown axis {name!r}; valid axes: {', '.join(registry.names)}"
            )


def parse_sample(value: str, source: str) -> int | None:
    """A positive number of configurations per test, or ``None`` (empty: no sampling)."""
    text = value.strip()
    if not text:
        return None
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise pytest.UsageError(f"{source}: expected a positive integer, got {value!r}")
    return number


def parse_seed(value: str, source: str) -> int | None:
    """A non-negative integer seed, or ``None`` (empty: pick one at random)."""
    text = value.strip()
    if not text:
        return None
    try:
        seed = int(text, 0)
    except ValueError:
        seed = -1
    if seed < 0:
        raise pytest.UsageError(f"{source}: expected a non-negative integer, got {value!r}")
    return seed


def parse_config_ids(values: Sequence[str], source: str) -> tuple[tuple[str, ...], ...]:
    """Split configuration ids into tokens; each id selects items whose config has all of them."""
    groups: list[tuple[str, ...]] = []
    for value in values:
        tokens = tuple(t.strip() for t in value.strip().split(","))
        bad = [t for t in tokens if not _TOKEN.match(t)]
        if bad:
            raise pytest.UsageError(
                f"{source}: {bad[0]!r} is not a configuration token like 'mkldnn-off'; "
                f"expected ids such as 'mkldnn-off' or 'cudnn-on,sdpa-math'"
            )
        groups.append(tokens)
    return tuple(groups)


def check_config_ids(
    groups: Sequence[Sequence[str]], registry: AxisRegistry, source: str
) -> tuple[frozenset[tuple[str, str]], ...]:
    """Resolve token groups against the registry; ``UsageError`` lists the valid tokens."""
    resolved = []
    for tokens in groups:
        pairs = []
        for token in tokens:
            try:
                pairs.append(registry.parse_token(token))
            except ConfigError:
                raise pytest.UsageError(
                    f"{source}: unknown configuration token {token!r}; valid tokens: "
                    f"{', '.join(registry.all_tokens())}"
                ) from None
        axes = [axis for axis, _ in pairs]
        twice = sorted({axis for axis in axes if axes.count(axis) > 1})
        if twice:
            raise pytest.UsageError(
                f"{source}: {','.join(tokens)!r} names axis {twice[0]!r} twice, but a "
                "configuration has one value per axis; to select several configurations "
                "give several groups (repeat the option, or separate groups with spaces in "
                "the ini file)"
            )
        resolved.append(frozenset(pairs))
    return tuple(resolved)


def parse_verify(value: str, source: str) -> str:
    """``on``, ``strict`` or ``off``."""
    text = value.strip().lower()
    if text == "":
        return "off"
    if _options.is_on(text):
        return "on"
    if _options.is_off(text):
        return "off"
    if text == "strict":
        return "strict"
    raise pytest.UsageError(
        f"{source}: expected one of {', '.join(VERIFY_MODES)}, got {value!r}"
        + _path_hint(value).replace("OPTION", "backends-verify")
    )


def require_axes(
    enabled: bool, axes: tuple[str, ...] | None, required: Sequence[str]
) -> tuple[bool, tuple[str, ...] | None]:
    """``(enabled, axes)`` once another feature requires ``required`` axes.

    Required axes turn the matrix on for themselves alone when it is off, and
    join a restricted ``--backends-matrix=a,b`` list.
    """
    if not required:
        return enabled, axes
    if not enabled:
        return True, tuple(required)
    if axes is not None:
        return True, tuple(dict.fromkeys((*axes, *required)))
    return enabled, axes


def _path(raw: _options.Raw, config: pytest.Config) -> Path | None:
    """The output path an option names (command line: from the invocation directory)."""
    text = raw.text.strip()
    if not text:
        return None
    base = config.invocation_params.dir if raw.from_cli else config.rootpath
    return base / text


@dataclass(frozen=True)
class MatrixSettings:
    """Options and ini keys of the matrix, resolved once (command line wins over ini)."""

    enabled: bool = False
    axes: tuple[str, ...] | None = None
    axes_source: str = "--backends-matrix"
    sample: int | None = None
    sample_source: str = "--backends-sample"
    seed: int | None = None
    seed_given: bool = False
    select: tuple[tuple[str, ...], ...] = ()
    select_source: str = "--backends-config"
    verify: str = "off"
    report_json: Path | None = None
    report_html: Path | None = None

    @classmethod
    def from_config(cls, config: pytest.Config) -> MatrixSettings:
        """Resolve every matrix option (raises ``pytest.UsageError`` on bad input).

        Axes another feature requires (``cpu_capability`` for
        ``--backends-cpu-capability``) come from
        :data:`pytest_backends._shared.REQUIRED_AXES_KEY`; a pytest-xdist
        worker samples with the seed its controller sent.
        """
        matrix = _options.lookup(config, "backends_matrix")
        enabled, axes = parse_matrix(matrix.text, matrix.source)
        ids = _options.lookup(config, "backends_config")
        select = parse_config_ids(list(ids.value or ()), ids.source)
        if select and not enabled and not matrix.from_cli:
            # Selecting a config implies the whole matrix (every marked axis), unless the
            # command line turned it off; before required axes, which would narrow it
            # to theirs alone.
            enabled, axes = True, None
        required = config.stash.get(_shared.REQUIRED_AXES_KEY, ())
        enabled, axes = require_axes(enabled, axes, required)
        if not enabled:
            select = ()
        raw = _options.lookup(config, "backends_sample")
        sample, sample_source = parse_sample(raw.text, raw.source), raw.source
        raw = _options.lookup(config, "backends_seed")
        seed = parse_seed(raw.text, raw.source)
        seed_given = seed is not None
        sent = _xdist.received(config, SEED_CHANNEL)
        if seed is None and sent is not None:
            seed = int(sent)
        if seed is None and sample is not None:
            seed = random.Random().randrange(2**31)
        raw = _options.lookup(config, "backends_verify")
        return cls(
            enabled=enabled,
            axes=axes,
            axes_source=matrix.source,
            sample=sample,
            sample_source=sample_source,
            seed=seed,
            seed_given=seed_given,
            select=select,
            select_source=ids.source,
            verify=parse_verify(raw.text, raw.source),
            report_json=_path(_options.lookup(config, "backends_report"), config),
            report_html=_path(_options.lookup(config, "backends_html"), config),
        )

    def select_hint(self, marked: set[str], wanted: set[str]) -> str:
        """Why ``--backends-config`` selected no item: the first cause that applies.

        ``marked``: the axes of the collected tests' markers; ``wanted``: the
        axes the selected configuration ids name.
        """
        names = sorted(wanted)
        if self.axes is not None:
            off = [axis for axis in names if axis not in self.axes]
            if off:
                return (
                    f"it names the {', '.join(off)} axis, which the matrix does not expand "
                    f"here ({self.axes_source} expands "
                    f"{', '.join(self.axes)}); add the axis there"
                )
        if not marked & wanted:
            return (
                f"no collected test is marked @pytest.mark.backends with the "
                f"{', '.join(names)} axis (--backends-config narrows only the tests marked "
                "with the axes it names; the others ran as without it)"
            )
        return (
            "no configuration of a test marked with the "
            f"{', '.join(sorted(marked & wanted))} axis contains every token of "
            "a group; check the ids against the test ids of --backends-matrix --collect-only"
        )

    def describe(self) -> str:
        """One header line summarising the matrix settings."""
        parts = ["axes: " + (", ".join(self.axes) if self.axes else "all marked axes")]
        if self.sample:
            parts.append(
                f"sample {self.sample} per test, seed {self.seed}"
                + ("" if self.seed_given else f" (--backends-seed={self.seed} reproduces it)")
            )
        if self.select:
            parts.append("only " + " | ".join(",".join(g) for g in self.select))
        if self.verify != "off":
            parts.append(f"verify: {self.verify}")
        return "backends matrix: " + "; ".join(parts)


#: Where the registrar stores the matrix settings.
SETTINGS_KEY: pytest.StashKey[MatrixSettings] = pytest.StashKey()
