"""The option table: every option registered from it, one precedence rule, one off vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_backends import _options, isolation, plugin
from pytest_backends.capability import feature as capability
from pytest_backends.determinism import feature as determinism
from pytest_backends.matrix import feature as matrix

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "options.rst"


def test_every_table_row_is_a_flag_with_an_ini_twin_and_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--help")
    text = result.stdout.str()
    for option in _options.OPTIONS:
        assert option.flag in text, option.flag
        assert f"  {option.ini} " in text or f"  {option.ini}\n" in text, option.ini
        assert f"ini: {option.ini}" in " ".join(text.split()), option.name
        assert option.help and option.ini_help
        assert option.flag == "--" + option.ini.replace("_", "-")
    assert len({option.name for option in _options.OPTIONS}) == len(_options.OPTIONS)


def test_every_table_row_is_in_the_reference_page() -> None:
    page = DOCS.read_text()
    missing = [o.flag for o in _options.OPTIONS if f"``{o.flag}" not in page]
    assert missing == []


@pytest.mark.parametrize(
    ("args", "ini", "expected", "source"),
    [
        ((), "", "fail", "default of --backends-leaks"),
        ((), "backends_leaks = warn", "warn", "ini option backends_leaks"),
        (("--backends-leaks=off",), "backends_leaks = warn", "off", "--backends-leaks"),
    ],
)
def test_command_line_beats_ini_beats_default(
    pytester: pytest.Pytester, args: tuple[str, ...], ini: str, expected: str, source: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    raw = _options.lookup(pytester.parseconfig(*args), "backends_leaks")
    assert (raw.text, raw.source) == (expected, source)
    assert raw.from_cli is bool(args)


def test_list_and_flag_options_resolve_from_either_place(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nbackends_config = mkldnn-off cudnn-on\nbackends_determinism_all = true\n"
    )
    config = pytester.parseconfig()
    assert _options.lookup(config, "backends_config").value == ["mkldnn-off", "cudnn-on"]
    assert _options.lookup(config, "backends_determinism_all").value is True
    cli = pytester.parseconfig("--backends-config=tf32-on", "--backends-config=sdpa-math")
    assert _options.lookup(cli, "backends_config").value == ["tf32-on", "sdpa-math"]
    bare = pytester.parseconfig("--backends-matrix", "--backends-verify")
    assert _options.lookup(bare, "backends_matrix").value == "all"
    assert _options.lookup(bare, "backends_verify").value == "on"


@pytest.mark.parametrize("word", _options.OFF_WORDS)
def test_one_off_vocabulary_for_every_option_that_can_be_off(
    pytester: pytest.Pytester, word: str
) -> None:
    config = pytester.parseconfig(
        f"--backends-matrix={word}",
        f"--backends-verify={word}",
        f"--backends-determinism={word}",
        f"--backends-leaks={word}",
        f"--backends-cpu-capability={word}",
    )
    assert matrix.Settings.from_config(config).enabled is False
    assert matrix.Settings.from_config(config).verify == "off"
    assert determinism.Settings.from_config(config).enabled is False
    assert isolation.Settings.from_config(config).mode == "off"
    assert capability.Settings.from_config(config).levels is None


@pytest.mark.parametrize("word", [*_options.ON_WORDS])
def test_on_words_turn_switchable_options_on(pytester: pytest.Pytester, word: str) -> None:
    config = pytester.parseconfig(f"--backends-matrix={word}", f"--backends-verify={word}")
    settings = matrix.Settings.from_config(config)
    assert (settings.enabled, settings.axes, settings.verify) == (True, None, "on")
    if word.isdigit():
        return  # --backends-determinism=N counts runs
    config = pytester.parseconfig(f"--backends-determinism={word}")
    determinism_settings = determinism.Settings.from_config(config)
    assert determinism_settings.enabled and determinism_settings.runs == 5


def test_is_off_and_is_on_ignore_case_and_spaces() -> None:
    assert _options.is_off(" None ") and _options.is_off("OFF")
    assert not _options.is_off("fail") and not _options.is_off("")
    assert _options.is_on(" Yes") and not _options.is_on("strict")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--backends-leaks=loud",), "--backends-leaks: invalid value 'loud'"),
        (("--backends-verify=maybe",), "--backends-verify: expected one of off, on, strict"),
        (("--backends-cpu-capability=avx9",), "unknown CPU capability level 'avx9'"),
        (("--backends-determinism=1",), "needs at least 2 runs"),
        (("--backends-sample=0",), "--backends-sample: expected a positive integer"),
        (("--backends-matrix=",), "--backends-matrix= was given an empty value"),
        (("--backends-matrix= ",), "--backends-matrix= was given an empty value"),
        (("--backends-config=",), "--backends-config= was given an empty value"),
        (("--backends-leaks=",), "--backends-leaks= was given an empty value"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_settings_are_resolved_once_into_frozen_objects(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("--backends-cpu-capability=default", "--backends-matrix=mkldnn")
    plugin.resolve(config)
    levels = config.stash[capability.SETTINGS_KEY]
    settings = config.stash[matrix.SETTINGS_KEY]
    assert levels.levels == ("default",)
    # The levels require the cpu_capability axis: it joins the restricted list.
    assert settings.axes == ("mkldnn", "cpu_capability")
    with pytest.raises(AttributeError):
        settings.enabled = False  # type: ignore[misc]
    assert config.stash[isolation.SETTINGS_KEY].mode == "fail"
    plugin.resolve(config)
    assert config.stash[matrix.SETTINGS_KEY] is settings, "resolved twice"
