"""The backend matrix: options, expansion of marked tests, and per-item configs.

Data flows one way (DESIGN B):

1. :func:`resolve_settings` turns options and ini keys into a frozen
   :class:`MatrixSettings` (pure parsers, each raising ``pytest.UsageError``).
2. :meth:`MatrixPlugin.pytest_generate_tests` binds each test's
   ``@pytest.mark.backends`` markers and, with ``--backends-matrix``,
   parametrizes the test over the (optionally sampled) product of its axes.
   The list depends only on markers and options, never on the machine, so
   collection is identical everywhere, xdist workers included.
   ``unittest.TestCase`` classes, which pytest never parametrizes, get one
   test method per config instead (:mod:`pytest_backends.matrix.testcase`).
3. :meth:`MatrixPlugin.pytest_collection_modifyitems` runs after every other
   implementation of the hook: items that a conftest or plugin gave a
   ``backends`` marker there are collected again with it (one item per
   config); markers that cannot be honoured are a ``BackendsMarkerWarning``
   naming the test. It then stores each item's
   :class:`~pytest_backends.matrix.configs.BackendConfig` under :data:`CONFIG_KEY`, hands
   its flags to the leak guard (``isolation.ITEM_FLAGS_KEY``), and turns a
   config this machine cannot run into a skip with a precise reason.

Torch is imported only when a marked test is expanded or a feature needs it.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import math
import random
import re
from collections.abc import Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from pytest_backends import _keys, _options, _selected, _shared
from pytest_backends.matrix import availability, markers, testcase
from pytest_backends.matrix import xdist as _xdist
from pytest_backends.matrix.configs import (
    DEFAULT_CONFIG,
    Axis,
    AxisRegistry,
    BackendConfig,
    ConfigError,
    builtin_registry,
)
from pytest_backends.matrix.report import config_in_nodeid

if TYPE_CHECKING:
    from pytest_backends.matrix.availability import Availability

__all__ = [
    "CONFIG_KEY",
    "SETTINGS_KEY",
    "MatrixPlugin",
    "MatrixSettings",
    "configure",
    "parse_config_ids",
    "parse_matrix",
    "parse_sample",
    "parse_seed",
    "parse_verify",
    "sample_configs",
    "use_config",
]

CONFIG_KEY = _keys.CONFIG_KEY
SETTINGS_KEY = _keys.MATRIX_KEY

_MARKER_ERROR_KEY = _keys.MARKER_ERROR_KEY
#: The matrix report's row for tests whose marker is invalid (they fail at setup).
INVALID_MARKER_ID = "invalid-marker"

#: The test-id parameter and fixture that carry the config.
PARAM = "backend_config"
#: The JUnit XML property (``record_property`` style) naming an item's config.
PROPERTY = _keys.PROPERTY_CONFIG

VERIFY_MODES = ("off", "on", "strict")
_ON = ("all", *_options.ON_WORDS)
_OFF = (*_options.OFF_WORDS, "")
_AXIS_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_TOKEN = re.compile(r"[a-z][a-z0-9_]*-[a-z0-9][a-z0-9_.]*\Z")

C = TypeVar("C", bound="tuple[Hashable, ...]")


# --- options (declared in pytest_backends._options) ------------------------------------


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


@dataclass(frozen=True)
class MatrixSettings:
    """Options and ini keys of the matrix, resolved once (command line wins over ini)."""

    enabled: bool = False
    axes: tuple[str, ...] | None = None
    axes_source: str = "--backends-matrix"
    sample: int | None = None
    seed: int | None = None
    seed_given: bool = False
    select: tuple[tuple[str, ...], ...] = ()
    select_source: str = "--backends-config"
    verify: str = "off"
    report_json: Path | None = None
    report_html: Path | None = None

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


def _option(config: pytest.Config, name: str) -> tuple[Any, str, bool]:
    """(value, source name, from the command line?) for option ``name``."""
    raw = _options.lookup(config, name)
    return raw.value, raw.source, raw.from_cli


def _path(config: pytest.Config, name: str) -> Path | None:
    value, _source, from_cli = _option(config, name)
    text = str(value or "").strip()
    if not text:
        return None
    base = config.invocation_params.dir if from_cli else config.rootpath
    return base / text


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


def resolve_settings(config: pytest.Config, required: Sequence[str] = ()) -> MatrixSettings:
    """Resolve every matrix option once (raises ``pytest.UsageError`` on bad input).

    ``required`` are axes another feature needs (``cpu_capability`` for
    ``--backends-cpu-capability``).
    """
    value, axes_source, _ = _option(config, "backends_matrix")
    enabled, axes = parse_matrix(str(value), axes_source)
    raw_ids, select_source, _ = _option(config, "backends_config")
    select = parse_config_ids(list(raw_ids or ()), select_source)
    if select and not enabled and config.getoption("backends_matrix", None) is None:
        # Selecting a config implies the whole matrix (every marked axis), unless the
        # command line turned it off; before required axes, which would narrow it
        # to theirs alone.
        enabled, axes = True, None
    enabled, axes = require_axes(enabled, axes, required)
    if not enabled:
        select = ()
    value, source, _ = _option(config, "backends_sample")
    sample = parse_sample(str(value), source)
    value, source, _ = _option(config, "backends_seed")
    seed = parse_seed(str(value), source)
    seed_given = seed is not None
    workerinput = getattr(config, "workerinput", None)
    if seed is None and workerinput is not None and _xdist.WORKERINPUT_SEED in workerinput:
        seed = int(workerinput[_xdist.WORKERINPUT_SEED])
    if seed is None and sample is not None:
        seed = random.Random().randrange(2**31)
    value, source, _ = _option(config, "backends_verify")
    verify = parse_verify(str(value), source)
    return MatrixSettings(
        enabled=enabled,
        axes=axes,
        axes_source=axes_source,
        sample=sample,
        seed=seed,
        seed_given=seed_given,
        select=select,
        select_source=select_source,
        verify=verify,
        report_json=_path(config, "backends_report"),
        report_html=_path(config, "backends_html"),
    )


# --- expansion ----------------------------------------------------------------------------


#: The most configurations one marked test may expand to without ``--backends-sample``.
MAX_CONFIGS = 4096


def expand(
    selection: Mapping[str, Sequence[str]],
    registry: AxisRegistry,
    settings: MatrixSettings,
    key: str,
) -> list[tuple[tuple[str, str], ...]]:
    """The value combinations a marked test runs over (empty: it runs once, unparametrized).

    ``selection`` is a resolved marker (:func:`markers.resolve`); the command
    line's axes restrict it and ``--backends-sample`` samples it. Raises
    ``ConfigError`` when the product is too large to be meant.
    """
    if settings.axes is not None:
        selection = {a: v for a, v in selection.items() if a in settings.axes}
    if not selection:
        return []
    size = math.prod(len(values) for values in selection.values())
    if size > MAX_CONFIGS and settings.sample is None:
        raise ConfigError(
            f"the marker expands to {size} configurations (more than {MAX_CONFIGS}); "
            "name fewer axes or values, restrict axes with --backends-matrix=AXES, "
            "or sample with --backends-sample=N"
        )
    combos = registry.product(selection)
    if settings.sample is not None and settings.seed is not None:
        combos = sample_configs(combos, settings.sample, settings.seed, key)
    return combos


def sample_configs(combos: Sequence[C], n: int, seed: int, key: str) -> list[C]:
    """A reproducible sample of ``n`` of ``combos`` (each a tuple of hashable choices).

    The same ``(seed, key)`` always picks the same items, in their original
    order.  Picks are greedy for coverage first: each pick adds as many
    not-yet-seen values as possible (ties broken by a seeded shuffle), so with
    ``n`` at least the size of the largest axis every value runs at least once.
    """
    if n >= len(combos):
        return list(combos)
    rng = random.Random(f"{seed}:{key}")
    order = list(range(len(combos)))
    rng.shuffle(order)
    chosen: list[int] = []
    covered: set[object] = set()
    remaining = order[:]
    while len(chosen) < n:
        best = max(remaining, key=lambda i: len(set(combos[i]) - covered))
        if not set(combos[best]) - covered:
            break
        chosen.append(best)
        covered |= set(combos[best])
        remaining.remove(best)
    for i in remaining:
        if len(chosen) >= n:
            break
        chosen.append(i)
    return [combos[i] for i in sorted(chosen)]


def _definition_id(item: pytest.Item) -> str:
    """The node id of the function an item was generated from (without ``[params]``)."""
    name = item.name
    original = getattr(item, "originalname", name)
    return item.nodeid[: len(item.nodeid) - len(name) + len(original)]


#: One marker's arguments: ``(args, kwargs)``.
Mark = tuple[Sequence[object], Mapping[str, object]]


def _marks(node: Any) -> list[Mark]:
    return [(m.args, m.kwargs) for m in node.iter_markers(markers.MARKER)]


def _same(a: object, b: object) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # an object whose == raises or is ambiguous (a tensor)
        return False


def _same_params(old: pytest.Item, new: pytest.Item) -> bool:
    """Whether ``new`` is ``old`` collected again with a config: the same parameter set.

    Parameter sets are matched by identity (their parameter id, which pytest
    makes unique within each parametrization), never by value: two sets whose
    values compare equal (``[[2.0], [2.0]]``) are still two tests.
    """
    old_spec = getattr(old, "callspec", None)
    new_spec = getattr(new, "callspec", None)
    if old_spec is None or new_spec is None:
        return old_spec is None and (new_spec is None or set(new_spec.params) <= {PARAM})
    config = new_spec.params.get(PARAM)
    config_id = config.id if isinstance(config, BackendConfig) else ""
    return _without_config_id(str(new_spec.id), config_id) == str(old_spec.id)


def _without_config_id(param_id: str, config_id: str) -> str:
    """A parameter id without the config's part (``3-mkldnn-off`` -> ``3``)."""
    if not config_id:
        return param_id
    if param_id == config_id:
        return ""
    for candidate in (
        param_id.removesuffix("-" + config_id),
        param_id.removeprefix(config_id + "-"),
        param_id.replace(f"-{config_id}-", "-", 1),
    ):
        if candidate != param_id:
            return candidate
    return param_id


class MatrixPlugin:
    """Expands marked tests and attaches configs to items."""

    def __init__(self, config: pytest.Config, settings: MatrixSettings) -> None:
        self.config = config
        self.settings = settings
        self._registry: AxisRegistry | None = None
        self._availability: Availability | None = None
        self._configs: dict[tuple[tuple[str, str], ...], BackendConfig] = {}
        self._reasons: dict[BackendConfig, str | None] = {}
        self._selections: dict[str, dict[str, tuple[str, ...]]] = {}
        self._errors: dict[str, str] = {}
        self._select: tuple[frozenset[tuple[str, str]], ...] = ()
        self._select_axes: set[str] = set()
        # Items a --backends-config group selected (the empty-selection check).
        self._matched = 0
        self._header_shown = False
        # Markers of each test when it was expanded (None: it had none then).
        self._seen: dict[str, list[Mark]] = {}
        # Markers of each definition when the matrix expanded it (checked after all hooks).
        self._definition_marks: dict[str, list[Mark]] = {}
        # Markers a re-collection must use (markers added by hooks), by test.
        self._pending: dict[str, list[Mark]] = {}
        # TestCase config items: node id -> (test's node id, config).
        self._named: dict[str, tuple[str, BackendConfig]] = {}
        # TestCase matrix subclass -> the user's class.
        self._bases: dict[type, type] = {}
        # Node ids given with a config id: (file, test without [...]) -> wanted "::" tails.
        self._wanted: dict[tuple[Path, str], set[str]] = {}
        #: Node ids of the items that markers added by hooks expanded.
        self.late: list[str] = []
        #: Every item collected in this process, deselected ones included: node id ->
        #: config id (empty: no config). ``pytest-backends merge`` checks coverage with it.
        self.collected: dict[str, str] = {}

    # registry and machine ------------------------------------------------------------------

    def registry(self) -> AxisRegistry:
        """Built-in axes plus those from ``pytest_backends_configurations`` (built once)."""
        if self._registry is None:
            registry = builtin_registry()
            results = self.config.hook.pytest_backends_configurations(config=self.config)
            try:
                for result in results:
                    if isinstance(result, Axis):
                        result = [result]
                    if result:
                        registry = registry.extended(result)
            except ConfigError as exc:
                raise pytest.UsageError(f"pytest_backends_configurations: {exc}") from None
            self._registry = registry
        return self._registry

    def availability(self) -> Availability:
        """What this machine can run (imports torch on first use)."""
        if self._availability is None:
            self._availability = availability.probe()
        return self._availability

    def build(self, choices: tuple[tuple[str, str], ...]) -> BackendConfig:
        """The config for ``choices`` (cached; raises ``ConfigError`` on conflicting flags)."""
        config = self._configs.get(choices)
        if config is None:
            avail = self.availability()
            config = self.registry().make(
                choices, available_flags=avail.flags, cuda_available=avail.cuda
            )
            self._configs[choices] = config
        return config

    def reason(self, config: BackendConfig) -> str | None:
        """Why ``config`` cannot run here (cached), or ``None``."""
        if not config.choices:
            return None
        if config not in self._reasons:
            self._reasons[config] = availability.unavailable_reason(
                config, self.registry(), self.availability()
            )
        return self._reasons[config]

    # hooks ---------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        registry = self.registry()
        if self.settings.axes:
            check_axes(self.settings.axes, registry, self.settings.axes_source)
        self._select = check_config_ids(self.settings.select, registry, self.settings.select_source)
        self._select_axes = {axis for group in self._select for axis, _ in group}

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        lines: list[str] = []
        if self.settings.enabled or availability.torch_imported():
            lines += availability.header_lines(self.availability())
            self._header_shown = True
        else:
            lines.append(availability.HINT)
        if self.settings.enabled:
            lines.append(self.settings.describe())
        return lines

    def _resolve(self, defid: str, marks: Sequence[Mark]) -> list[BackendConfig]:
        """Resolve one test's markers; its configs (empty: it runs once, unparametrized).

        Records the resolved selection (or the marker's error) under ``defid``.
        """
        self._seen[defid] = list(marks)
        try:
            selection = markers.resolve(marks, self.registry())
        except markers.MarkerError as exc:
            self._errors[defid] = f"invalid @pytest.mark.backends on {defid}: {exc}"
            return []
        self._selections[defid] = selection
        if not self.settings.enabled:
            return []
        try:
            combos = expand(selection, self.registry(), self.settings, defid)
            return [self.build(c) for c in combos]
        except ConfigError as exc:
            self._errors[defid] = f"invalid backend configuration for {defid}: {exc}"
            self._selections.pop(defid)
            return []

    @pytest.hookimpl(wrapper=True)
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> Generator[None, None, None]:
        """Warn when a later ``pytest_generate_tests`` adds markers the matrix missed."""
        defid = metafunc.definition.nodeid
        yield
        before = self._definition_marks.pop(defid, [])
        if _marks(metafunc.definition) != before:
            metafunc.definition.warn(
                markers.BackendsMarkerWarning(
                    f"@pytest.mark.backends on {defid} is not expanded: a pytest_generate_tests "
                    "hook added it after the matrix had expanded the test. Give that hook "
                    "@pytest.hookimpl(tryfirst=True), or add the marker in "
                    "pytest_collection_modifyitems"
                )
            )

    @pytest.hookimpl(specname="pytest_generate_tests")
    def pytest_generate_tests_matrix(self, metafunc: pytest.Metafunc) -> None:
        defid = metafunc.definition.nodeid
        self._definition_marks[defid] = _marks(metafunc.definition)
        marks = self._pending.pop(defid, None) or self._definition_marks[defid]
        if not marks:
            return
        configs = self._resolve(defid, marks)
        if not configs:
            return
        if PARAM not in metafunc.fixturenames:
            metafunc.fixturenames.append(PARAM)
        metafunc.parametrize(PARAM, configs, ids=[c.id for c in configs])

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(
        self, collector: pytest.Collector, name: str, obj: object
    ) -> Generator[None, Any, Any]:
        result = yield
        if isinstance(result, pytest.Class) and testcase.is_testcase(obj) and result.obj is obj:
            self._expand_testcase(result)
        return result

    def _expand_testcase(self, node: pytest.Class) -> None:
        """Give each marked method of a ``TestCase`` class one test per config."""
        cls = node.obj
        expanded: dict[str, list[str]] = {}
        for name in testcase.unittest_names(cls):
            defid = f"{node.nodeid}::{name}"
            marks = self._pending.pop(defid, None) or testcase.method_marks(cls, name, node)
            if not marks:
                continue
            configs = self._resolve(defid, marks)
            if not configs:
                continue
            if not testcase.expandable(cls, name):
                self._errors[defid] = (
                    f"{defid}: @pytest.mark.backends needs a plain test method on a "
                    "unittest.TestCase (this one is a staticmethod, classmethod or other "
                    "descriptor); make it a method, or move the test to a function"
                )
                continue
            names = testcase.config_names(name, [c.id for c in configs])
            expanded[name] = names
            for config_name, backend in zip(names, configs):
                self._named[f"{node.nodeid}::{config_name}"] = (defid, backend)
        if expanded:
            node.obj = testcase.matrix_subclass(cls, expanded)
            self._bases[node.obj] = cls

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> Generator[None, None, None]:
        # After every other implementation: markers that conftests and plugins add
        # in their own pytest_collection_modifyitems are expanded here.
        yield
        items[:] = self._expand_late(items)
        self._narrow_to_node_ids(items)
        self._check_misspelt(items)
        self._attach(config, items)

    def _check_misspelt(self, items: list[pytest.Item]) -> None:
        """A marker whose name is close to ``backends`` but not registered: did you mean it?"""
        registered = {
            line.split(":")[0].split("(")[0].strip() for line in self.config.getini("markers")
        }
        warned: set[str] = set()
        for item in items:
            defid = self._defid(item)
            if defid in warned:
                continue
            for mark in item.iter_markers():
                if mark.name == markers.MARKER or mark.name in registered:
                    continue
                if difflib.get_close_matches(mark.name, [markers.MARKER], n=1, cutoff=0.75):
                    warned.add(defid)
                    message = (
                        f"@pytest.mark.{mark.name} on {defid} is not a pytest-backends marker: "
                        f"did you mean @pytest.mark.{markers.MARKER}?"
                    )
                    if _shared.strict(self.config):
                        self._errors.setdefault(defid, message + " (--backends-strict)")
                    else:
                        item.warn(markers.BackendsMarkerWarning(message))
                    break

    # markers added by hooks ------------------------------------------------------------------

    def _defid(self, item: pytest.Item) -> str:
        named = self._named.get(item.nodeid)
        return named[0] if named is not None else _definition_id(item)

    def _expand_late(self, items: list[pytest.Item]) -> list[pytest.Item]:
        """The items, with those whose ``backends`` markers a hook added expanded now."""
        late: dict[str, tuple[str, list[Mark]]] = {}
        groups: dict[tuple[str, str], dict[str, list[Mark]]] = {}
        expanded = dict(self._seen)  # as they were before this hook resolves late markers
        for item in items:
            marks = _marks(item)
            defid = self._defid(item)
            seen = expanded.get(defid)
            if not marks or marks == seen or defid in self._errors:
                continue
            if seen:
                if all(any(_same(m, s) for s in seen) for m in marks):
                    # Fewer markers than at expansion (a plugin added one to the
                    # definition only): nothing was added after the matrix ran.
                    continue
                self._late_warning(
                    item,
                    (
                        "its markers changed after the matrix expanded it, so the added ones "
                        "are ignored. Put every backends marker on the test (decorator, class "
                        "or module pytestmark), or add them all in the same hook"
                    ),
                )
                continue
            if not isinstance(item, pytest.Function) or not isinstance(
                item.parent, (pytest.Module, pytest.Class)
            ):
                self._late_warning(
                    item,
                    (
                        "only Python test functions and unittest.TestCase methods can be "
                        "expanded; mark a Python test instead"
                    ),
                )
                continue
            if not self._resolve(defid, marks):
                continue  # invalid, matrix off, or no axis left: runs once, as marked
            key = self._group(item, defid, marks)
            groups.setdefault(key, {})[defid] = marks
            late[item.nodeid] = (defid, marks)
        if not late:
            return items
        made: dict[tuple[str, str], list[pytest.Item]] = {}
        for key, pending in groups.items():
            self._pending.update(pending)
            try:
                made[key] = self._collect_again(
                    next(i for i in items if i.nodeid in late and late[i.nodeid][0] in pending)
                )
            finally:
                for defid in pending:
                    self._pending.pop(defid, None)
        out: list[pytest.Item] = []
        for item in items:
            if item.nodeid not in late:
                out.append(item)
                continue
            defid, marks = late[item.nodeid]
            key = self._group(item, defid, marks)
            fresh = [
                new for new in made[key] if self._defid(new) == defid and _same_params(item, new)
            ]
            if not fresh:
                self._late_warning(item, "collecting the test again gave no item for it")
                out.append(item)
                continue
            added = [m for m in item.own_markers if m not in fresh[0].own_markers]
            for new in fresh:
                # As Node.add_marker does, without re-checking the mark's registration.
                new.own_markers.extend(added)
                new.keywords.update((mark.name, mark) for mark in added)
                new.user_properties.extend(item.user_properties)
            self.late.append(item.nodeid)
            out.extend(fresh)
            if len(fresh) > 1:
                # The collected count ("collected N items") counts the items that run.
                self.config.hook.pytest_collectreport(
                    report=pytest.CollectReport(item.nodeid, "passed", None, [*fresh[1:]])
                )
        return out

    def expand_hook_markers(self, items: list[pytest.Item]) -> None:
        """Expand the markers that hooks run before this one added.

        Called from the registrar's ``pytest_collection_modifyitems``, which runs
        after conftest implementations and before pytest's own ``-k``, ``-m`` and
        ``--deselect``, so these select among the expanded items. Markers added
        later still expand in the wrapper at the end of the hook.
        """
        items[:] = self._expand_late(items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """Let a node id name a config that a hook adds (``test_x[mkldnn-off]``).

        Such an item does not exist while pytest collects; the argument is
        collected without its ``[...]`` and narrowed to the named item once the
        matrix has expanded the test.
        """
        args = session.config.args
        plain = set(args)
        for i, arg in enumerate(args):
            head, sep, tail = arg.partition("::")
            start = tail.find("[", tail.rfind("::") + 1) if sep else -1
            if start < 0 or not tail.endswith("]"):
                continue
            if config_in_nodeid(arg, self.registry().parse_id) is None:
                continue
            base = f"{head}::{tail[:start]}"
            if base in plain:
                continue  # the whole test is asked for too
            args[i] = base
            path = (session.config.invocation_params.dir / head).resolve()
            self._wanted.setdefault((path, tail[:start]), set()).add(tail)

    def _narrow_to_node_ids(self, items: list[pytest.Item]) -> None:
        """Keep, of the tests named with a config id, only the items named."""
        if not self._wanted:
            return
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            tail = item.nodeid.partition("::")[2]
            start = tail.find("[", tail.rfind("::") + 1)
            base = tail[:start] if start >= 0 else tail
            wanted = self._wanted.get((Path(item.path).resolve(), base))
            (dropped if wanted is not None and tail not in wanted else kept).append(item)
        if dropped:
            self.config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def _group(self, item: pytest.Item, defid: str, marks: list[Mark]) -> tuple[str, str]:
        """What one re-collection covers: a function's items, or a whole TestCase class."""
        if item.nodeid in self._named or testcase.is_testcase(getattr(item, "cls", None)):
            return ("class", str(getattr(item.parent, "nodeid", "")))
        return (defid, repr(marks))

    def _late_warning(self, item: pytest.Item, why: str) -> None:
        message = f"@pytest.mark.backends on {item.nodeid} is not expanded: {why}"
        if _shared.strict(self.config):
            self._errors[self._defid(item)] = message + " (--backends-strict)"
        else:
            item.warn(markers.BackendsMarkerWarning(message))

    def _collect_again(self, item: pytest.Item) -> list[pytest.Item]:
        """The items pytest makes for ``item``'s test (or class) now that markers are pending.

        Goes through the public ``pytest_pycollect_makeitem`` hook, so parametrization,
        ids and fixtures are pytest's own, and :meth:`pytest_generate_tests` (or, for a
        ``TestCase``, :meth:`_expand_testcase`) sees the pending markers.
        """
        assert isinstance(item, pytest.Function)
        parent = item.parent
        assert isinstance(parent, (pytest.Module, pytest.Class))
        if item.nodeid in self._named or testcase.is_testcase(item.cls):
            above = parent.parent
            assert isinstance(above, (pytest.Module, pytest.Class))
            cls = self._bases.get(parent.obj, parent.obj)
            made = above.ihook.pytest_pycollect_makeitem(collector=above, name=parent.name, obj=cls)
            if not isinstance(made, pytest.Class):
                return []
            return [new for new in made.collect() if isinstance(new, pytest.Item)]
        raw = inspect.getattr_static(parent.obj, item.originalname)
        made = parent.ihook.pytest_pycollect_makeitem(
            collector=parent, name=item.originalname, obj=raw
        )
        made = made if isinstance(made, list) else [made] if made is not None else []
        return [new for new in made if isinstance(new, pytest.Item)]

    # configs on items ------------------------------------------------------------------------

    def _attach(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Store each item's config, hand its flags to the leak guard, skip what cannot run."""
        if not self._selections and not self._errors and not self._select:
            return
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            named = self._named.get(item.nodeid)
            defid = named[0] if named is not None else _definition_id(item)
            error = self._errors.get(defid)
            if error is not None:
                item.stash[_MARKER_ERROR_KEY] = error
                # In the matrix report too, so a failed run never reads as all green there.
                item.user_properties.append((PROPERTY, INVALID_MARKER_ID))
                kept.append(item)
                continue
            if defid not in self._selections:
                kept.append(item)  # --backends-config narrows marked tests only
                continue
            if named is not None:
                backend = named[1]
            else:
                callspec = getattr(item, "callspec", None)
                params = callspec.params if callspec is not None else {}
                backend = params.get(PARAM, DEFAULT_CONFIG)
            if not isinstance(backend, BackendConfig):
                backend = DEFAULT_CONFIG
            if self._select:
                marked = {*self._selections[defid], *backend.axes}
                if marked & self._select_axes:
                    if not any(g <= set(backend.choices) for g in self._select):
                        dropped.append(item)
                        continue
                    self._matched += 1
            kept.append(item)
            item.stash[CONFIG_KEY] = backend
            item.user_properties.append((PROPERTY, backend.id))
            why = self.reason(backend)
            if why is not None:
                item.add_marker(pytest.mark.skip(reason=why))
            elif backend.flags:
                item.stash[_keys.ITEM_FLAGS_KEY] = backend.flags
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def _config_id(self, item: pytest.Item) -> str:
        backend = item.stash.get(CONFIG_KEY, None)
        if backend is None:
            named = self._named.get(item.nodeid)
            callspec = getattr(item, "callspec", None)
            params = callspec.params if callspec is not None else {}
            backend = named[1] if named is not None else params.get(PARAM)
        return backend.id if isinstance(backend, BackendConfig) and backend.choices else ""

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        for item in items:
            self.collected[item.nodeid] = self._config_id(item)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            self.collected[item.nodeid] = self._config_id(item)
        self._record_selection(session)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if session.config.get_verbosity() < 0:
            # Quiet runs (``--co -q``) still say which markers are wrong.
            for message in self._errors.values():
                reporter.write_line(f"ERROR {message}", red=True)
            return
        if self._selections and not self._header_shown and not session.config.option.no_header:
            for line in availability.header_lines(self.availability()):
                reporter.write_line(line)
            self._header_shown = True
        for message in self._errors.values():
            reporter.write_line(f"ERROR {message}", red=True)
        if self.late:
            reporter.write_line(
                f"backends: {len(self.late)} test(s) marked by hooks expanded into their "
                "configs after collection"
            )

    def _record_selection(self, session: pytest.Session) -> None:
        """How many items the matrix and the verifier act on (for the empty-selection check)."""
        configs = [
            c for item in session.items if (c := item.stash.get(CONFIG_KEY, DEFAULT_CONFIG)).choices
        ]
        if self.settings.enabled and self.settings.select:
            _selected.record(
                self.config, self.settings.select_source, self._matched, self._select_hint()
            )
        elif self.settings.enabled:
            axes = f"axes {', '.join(self.settings.axes)}" if self.settings.axes else "any axis"
            _selected.record(
                self.config,
                self.settings.axes_source,
                len(configs),
                f"no collected test is marked @pytest.mark.backends with {axes}",
            )
        self._record_verify(configs)

    def _select_hint(self) -> str:
        """Why ``--backends-config`` selected no item: the first cause that applies."""
        marked = {axis for sel in self._selections.values() for axis in sel}
        wanted = sorted(self._select_axes)
        if self.settings.axes is not None:
            off = [axis for axis in wanted if axis not in self.settings.axes]
            if off:
                return (
                    f"it names the {', '.join(off)} axis, which the matrix does not expand "
                    f"here ({self.settings.axes_source} expands "
                    f"{', '.join(self.settings.axes)}); add the axis there"
                )
        if not marked & self._select_axes:
            return (
                f"no collected test is marked @pytest.mark.backends with the "
                f"{', '.join(wanted)} axis (--backends-config narrows only the tests marked "
                "with the axes it names; the others ran as without it)"
            )
        return (
            "no configuration of a test marked with the "
            f"{', '.join(sorted(marked & self._select_axes))} axis contains every token of "
            "a group; check the ids against the test ids of --backends-matrix --collect-only"
        )

    def _record_verify(self, configs: list[BackendConfig]) -> None:
        if self.settings.verify != "off":
            from pytest_backends.matrix.verify import promises_for

            checked = sum(1 for c in configs if promises_for(c))
            _selected.record(
                self.config,
                "--backends-verify",
                checked,
                (
                    "no item runs a configuration whose kernel path can be checked; verification "
                    "needs --backends-matrix and tests marked with the mkldnn, nnpack, cudnn or "
                    "sdpa axis"
                ),
            )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[_xdist.WORKEROUTPUT_COLLECTED] = dict(self.collected)
        # ``--collect-only`` runs no setup, where invalid markers fail their tests: the
        # session fails as for a collection error instead.
        if (
            self._errors
            and session.config.option.collectonly
            and session.exitstatus == pytest.ExitCode.OK
        ):
            session.exitstatus = pytest.ExitCode.INTERRUPTED

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        error = item.stash.get(_MARKER_ERROR_KEY, None)
        if error is not None:
            pytest.fail(error, pytrace=False)


# --- fixtures and helpers -----------------------------------------------------------------


def config_for(node: pytest.Item) -> BackendConfig:
    """The config of an item: its matrix config, or ``default`` (torch's defaults)."""
    return node.stash.get(CONFIG_KEY, DEFAULT_CONFIG)


def device_for(config: BackendConfig) -> Any:
    """A ``torch.device`` for the config's device."""
    import torch

    return torch.device(config.device)


@contextlib.contextmanager
def use_config(
    config: BackendConfig, *, registry: AxisRegistry | None = None
) -> Iterator[BackendConfig]:
    """Apply a config's flags for the ``with`` block, then restore every flag.

    For hypothesis tests that draw a config per example
    (:func:`pytest_backends.strategies.backend_configs`): function-scoped
    fixtures such as ``backend_config`` wrap the whole test, not each example,
    so apply the drawn config inside the test body.  A config this machine
    cannot run calls ``pytest.skip`` with the reason.  ``registry`` is needed
    only for configs with axes that are not built in.
    """
    from pytest_backends.flags import override_flags

    registry = registry or builtin_registry()
    unknown = [axis for axis, _ in config.choices if axis not in registry]
    if unknown:
        raise ValueError(
            f"config {config.id!r} uses axes {unknown} that the registry does not know; "
            "pass registry= the registry that defines them"
        )
    if config.choices:
        why = availability.unavailable_reason(config, registry, availability.probe())
        if why is not None:
            pytest.skip(why)
    with override_flags(config.flags):
        yield config


# --- registration -------------------------------------------------------------------------


def _check_outputs(settings: MatrixSettings) -> None:
    """Refuse, before any test runs, report paths that would be refused at the end."""
    from pytest_backends import _files

    for flag, path, kind in (
        ("--backends-report", settings.report_json, _files.JSON_REPORT),
        ("--backends-html", settings.report_html, _files.HTML_REPORT),
    ):
        if path is not None:
            try:
                _files.check_output(path, kind)
            except _files.OutputFileError as exc:
                raise pytest.UsageError(f"{flag}: {exc}") from None


def _check_ignored(config: pytest.Config, settings: MatrixSettings) -> None:
    """Say when an option does nothing in this run (an error under ``--backends-strict``)."""
    if settings.sample is None or settings.enabled:
        return
    _, source, _ = _option(config, "backends_sample")
    message = (
        f"{source} does nothing without the matrix: sampling picks configurations of the "
        "matrix, which is off; add --backends-matrix (or --backends-config)"
    )
    if _shared.strict(config):
        raise pytest.UsageError(message + " (--backends-strict)")
    config.issue_config_time_warning(pytest.PytestConfigWarning(message), stacklevel=2)


def configure(config: pytest.Config, settings: MatrixSettings) -> list[tuple[object, str]]:
    """The matrix, verification, report and xdist plugins ``settings`` need (not registered)."""
    plugins: list[tuple[object, str]] = []
    if not hasattr(config, "workerinput"):
        _check_outputs(settings)
        _check_ignored(config, settings)
    plugin = MatrixPlugin(config, settings)
    plugins.append((plugin, "backends-matrix"))
    is_worker = hasattr(config, "workerinput")
    if settings.verify != "off":
        from pytest_backends.matrix.verify_cost import CostSummary, TimedVerifyPlugin

        plugins.append((TimedVerifyPlugin(strict=settings.verify == "strict"), "backends-verify"))
        if not is_worker:
            plugins.append((CostSummary(), "backends-verify-cost"))
    if not is_worker and (settings.enabled or settings.report_json or settings.report_html):
        from pytest_backends.matrix.report import ReportPlugin

        plugins.append((ReportPlugin(config, settings, plugin), "backends-report"))
    if is_worker:
        from pytest_backends.matrix.environment import WorkerEnvironment

        plugins.append((WorkerEnvironment(config), "backends-environment"))
    if not is_worker and config.pluginmanager.hasplugin("xdist"):
        plugins.append((_xdist.XdistHooks(settings), "backends-xdist"))
    return plugins
