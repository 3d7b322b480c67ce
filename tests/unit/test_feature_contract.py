"""Every feature meets one contract, and its settings come from the one option resolver.

A feature is a module with ``Settings.from_config``, ``SETTINGS_KEY`` and
``plugins(config, settings)``; the registrar walks them (see
:mod:`pytest_backends._feature`).  Settings are resolved through
:func:`pytest_backends._options.lookup` only, so that an option added to the
table and read in one feature's ``from_config`` reaches that feature with
nothing else touched.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import FrozenInstanceError, dataclass
from typing import Any

import pytest

from pytest_backends import _options, plugin

NAMES = {
    "isolation",
    "capability",
    "matrix",
    "determinism",
    "batch",
    "paths",
    "nothing_selected",
    "label",
    "native_build",
}


def _name(feature: Any) -> str:
    parts = feature.__name__.split(".")
    return parts[-2] if parts[-1] == "feature" else parts[-1]


def test_the_registrar_walks_every_feature_once() -> None:
    names = [_name(feature) for feature in plugin.FEATURES]
    assert sorted(names) == sorted(NAMES)
    keys = [feature.SETTINGS_KEY for feature in plugin.FEATURES]
    assert all(isinstance(key, pytest.StashKey) for key in keys)
    assert len({id(key) for key in keys}) == len(keys), "two features share a settings key"
    for feature in plugin.FEATURES:
        assert callable(feature.plugins) and callable(feature.Settings.from_config)


@contextlib.contextmanager
def _only_through_lookup(config: pytest.Config, seen: list[str]) -> Iterator[None]:
    """``config.getoption``/``getini`` raise unless :func:`_options.lookup` is asking."""
    inside = [0]
    real_lookup = _options.lookup
    real_getoption, real_getini = config.getoption, config.getini

    def lookup(config: pytest.Config, name: str) -> _options.Raw:
        seen.append(name)
        inside[0] += 1
        try:
            return real_lookup(config, name)
        finally:
            inside[0] -= 1

    def guard(real: Any) -> Any:
        def read(name: str, *args: Any, **kwargs: Any) -> Any:
            if not inside[0] and str(name).startswith("backends"):
                raise AssertionError(f"{name} read around the option resolver")
            return real(name, *args, **kwargs)

        return read

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_options, "lookup", lookup)
        mp.setattr(config, "getoption", guard(real_getoption))
        mp.setattr(config, "getini", guard(real_getini))
        yield


@pytest.mark.parametrize("feature", plugin.FEATURES, ids=_name)
def test_settings_are_frozen_and_come_from_the_one_resolver(
    pytester: pytest.Pytester, feature: Any
) -> None:
    pytester.makeini(
        "[pytest]\nbackends_determinism = 2\nbackends_cpu_capability = default\n"
        "backends_matrix = all\nbackends_label = job\n"
    )
    config = pytester.parseconfig()
    seen: list[str] = []
    with _only_through_lookup(config, seen):
        settings = feature.Settings.from_config(config)
    assert isinstance(settings, feature.Settings)
    fields = getattr(settings, "__dataclass_fields__", {})
    if fields:
        with pytest.raises(FrozenInstanceError):
            setattr(settings, next(iter(fields)), None)
    assert all(name in {o.name for o in _options.OPTIONS} for name in seen)


@dataclass(frozen=True)
class _DemoSettings:
    level: int

    @classmethod
    def from_config(cls, config: pytest.Config) -> _DemoSettings:
        raw = _options.lookup(config, "backends_demo_level")
        try:
            return cls(int(raw.text))
        except ValueError:
            raise pytest.UsageError(f"{raw.source}: expected a number, got {raw.text!r}") from None


class _DemoPlugin:
    def __init__(self, settings: _DemoSettings) -> None:
        self.settings = settings

    def pytest_report_header(self) -> str:
        return f"demo level {self.settings.level}"


def _demo_feature() -> types.ModuleType:
    module = types.ModuleType("demo_feature")
    module.Settings = _DemoSettings  # type: ignore[attr-defined]
    module.SETTINGS_KEY = pytest.StashKey[_DemoSettings]()  # type: ignore[attr-defined]
    module.plugins = lambda config, settings: [(_DemoPlugin(settings), "demo")]  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize(
    ("ini", "args", "expected"),
    [
        ("", (), "demo level 3"),
        ("backends_demo_level = 5\n", (), "demo level 5"),
        ("backends_demo_level = 5\n", ("--backends-demo-level=7",), "demo level 7"),
    ],
)
def test_an_option_added_to_the_table_and_one_feature_reaches_it(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ini: str,
    args: tuple[str, ...],
    expected: str,
) -> None:
    option = _options.Option("backends_demo_level", "value", "N", "demo", "demo", default="3")
    monkeypatch.setattr(_options, "OPTIONS", (*_options.OPTIONS, option))
    monkeypatch.setattr(plugin, "FEATURES", (*plugin.FEATURES, _demo_feature()))
    pytester.makeini("[pytest]\n" + ini)
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_inprocess(*args)
    result.stdout.fnmatch_lines([expected])
    assert result.ret == pytest.ExitCode.OK


def test_a_bad_value_of_an_added_option_is_a_usage_error_naming_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    option = _options.Option("backends_demo_level", "value", "N", "demo", "demo", default="3")
    monkeypatch.setattr(_options, "OPTIONS", (*_options.OPTIONS, option))
    monkeypatch.setattr(plugin, "FEATURES", (*plugin.FEATURES, _demo_feature()))
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_inprocess("--backends-demo-level=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--backends-demo-level: expected a number, got 'x'" in result.stderr.str()
