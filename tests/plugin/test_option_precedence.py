"""The options as a user meets them: command line over ini over default, one off vocabulary,
usage errors naming the option, the job label in every output, and ``--backends-strict``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_backends import _options, isolation
from pytest_backends.capability import feature as capability
from pytest_backends.determinism import feature as determinism
from pytest_backends.determinism.api import DEFAULT_RUNS
from pytest_backends.matrix import feature as matrix

SUITE = """
import pytest
import torch


@pytest.mark.backends("mkldnn")
def test_marked(backend_config):
    assert backend_config.id


def test_leaks():
    torch.backends.cudnn.benchmark = True
"""

# Every feature turned on from the ini file, each in a way the run shows.
INI = """[pytest]
backends_leaks = warn
backends_matrix = mkldnn
backends_report = ini-report.json
backends_html = ini.html
backends_label = ini-label
backends_census = ini-census.json
backends_determinism = 3
backends_determinism_all = true
"""

COMMON = ("-v", "-p", "no:randomly", "-p", "no:cacheprovider")
LEAK = "test_suite.py::test_leaks left torch backend flags changed:"


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # The torch-ops digest needs no native build cache (which other processes may hold locked).
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _samples(option: _options.Option) -> tuple[Any, str, Any, list[str], Any]:
    """(default value, ini text, ini value, command line, command-line value) for ``option``."""
    if option.kind == "flag":
        return False, "true", True, [option.flag], True
    if option.kind == "list":
        cli = [f"{option.flag}=from-cli"]
        return [], "from-ini other-ini", ["from-ini", "other-ini"], cli, ["from-cli"]
    return option.default, "from-ini", "from-ini", [f"{option.flag}=from-cli"], "from-cli"


@pytest.mark.parametrize("option", _options.OPTIONS, ids=lambda o: o.flag)
def test_every_option_takes_the_command_line_over_the_ini_over_the_default(
    pytester: pytest.Pytester, option: _options.Option
) -> None:
    default, ini_text, ini_value, cli, cli_value = _samples(option)
    unset = _options.lookup(pytester.parseconfig(), option.name)
    assert unset.value == default and not unset.from_cli
    if option.default:
        assert unset.source == f"default of {option.flag}"

    pytester.makeini(f"[pytest]\n{option.ini} = {ini_text}\n")
    ini = _options.lookup(pytester.parseconfig(), option.name)
    assert (ini.value, ini.source, ini.from_cli) == (ini_value, f"ini option {option.ini}", False)

    if option.kind == "flag":  # a switch set false in the ini file, on on the command line
        pytester.makeini(f"[pytest]\n{option.ini} = false\n")
    both = _options.lookup(pytester.parseconfig(*cli), option.name)
    assert (both.value, both.source, both.from_cli) == (cli_value, option.flag, True)
    if option.kind == "optional":
        bare = _options.lookup(pytester.parseconfig(option.flag), option.name)
        assert bare.value == option.const


def test_the_ini_file_turns_every_feature_on_with_paths_from_the_rootdir(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite.makeini(INI)
    sub = suite.mkdir("sub")
    monkeypatch.chdir(sub)
    result = suite.runpytest_subprocess(*COMMON, "..")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=3, warnings=1)
    out = result.stdout.str()
    assert "backends matrix: axes: mkldnn" in out
    result.stdout.fnmatch_lines(
        ["*test_marked?mkldnn-on? PASSED*", "*test_marked?mkldnn-off? PASSED*"]
    )
    result.stdout.fnmatch_lines(
        ["*BackendsLeakWarning: " + LEAK, "*cudnn.benchmark: False -> True"]
    )
    assert "0 op keys (op, device, dtype) recorded over 3 runs" in out
    assert "3 test(s) checked" in out

    # Relative ini paths are resolved against the rootdir, not the current directory.
    assert list(sub.iterdir()) == []
    report = _load(suite.path / "ini-report.json")
    assert report["label"] == "ini-label"
    assert {t["config"] for t in report["tests"]} == {"mkldnn-on", "mkldnn-off"}
    assert "label: ini-label" in (suite.path / "ini.html").read_text(encoding="utf-8")
    census = _load(suite.path / "ini-census.json")
    assert (census["label"], census["runs"]) == ("ini-label", 3)


def test_the_command_line_beats_the_ini_file_with_paths_from_the_cwd(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite.makeini(INI)
    sub = suite.mkdir("sub")
    monkeypatch.chdir(sub)
    result = suite.runpytest_subprocess(
        *COMMON,
        "--backends-leaks=fail",
        "--backends-matrix=off",
        "--backends-report=cli-report.json",
        "--backends-label=cli-label",
        "--backends-determinism=off",
        "..",
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaks*", LEAK])
    result.stdout.fnmatch_lines(["*test_suite.py::test_marked PASSED*"])
    out = result.stdout.str()
    assert "mkldnn-on" not in out and "recorded over" not in out

    # The command line's report path is relative to the current directory; the ini
    # file's HTML path still applies and carries the command line's label.
    report = _load(sub / "cli-report.json")
    assert report["label"] == "cli-label"
    assert [t["config"] for t in report["tests"]] == ["default"]
    assert "label: cli-label" in (suite.path / "ini.html").read_text(encoding="utf-8")
    assert not (suite.path / "ini-report.json").exists()
    assert not (suite.path / "ini-census.json").exists()


def test_defaults_guard_leaks_and_leave_the_matrix_and_the_check_off(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest_subprocess(*COMMON)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaks*", LEAK])
    result.stdout.fnmatch_lines(["*test_suite.py::test_marked PASSED*"])
    out = result.stdout.str()
    assert "backends matrix: axes" not in out and "recorded over" not in out
    assert "report written" not in out
    assert [*suite.path.rglob("*.json"), *suite.path.rglob("*.html")] == []


def test_off_words_in_the_ini_file_turn_each_feature_off(suite: pytest.Pytester) -> None:
    suite.makeini(
        "[pytest]\n"
        "backends_leaks = none\n"
        "backends_matrix = no\n"
        "backends_verify = false\n"
        "backends_determinism = 0\n"
        "backends_cpu_capability = off\n"
        "backends_determinism_all = off\n"
        "backends_strict = 0\n"
    )
    result = suite.runpytest_subprocess(*COMMON)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_suite.py::test_marked PASSED*"])
    out = result.stdout.str()
    assert "BackendsLeakWarning" not in out and "left torch backend flags" not in out
    assert "mkldnn-on" not in out and "recorded over" not in out
    assert "[gw0]" not in out and "not exercised" not in out


@pytest.mark.parametrize("word", [*_options.OFF_WORDS, "None", "OFF"])
def test_every_option_that_can_be_off_takes_each_off_word_from_the_ini(
    pytester: pytest.Pytester, word: str
) -> None:
    keys = ("leaks", "matrix", "verify", "determinism", "cpu_capability")
    ini = "".join(f"backends_{key} = {word}\n" for key in keys)
    pytester.makeini(f"[pytest]\n{ini}backends_census = census.json\n")
    config = pytester.parseconfig()
    settings = matrix.Settings.from_config(config)
    assert (settings.enabled, settings.verify) == (False, "off")
    assert isolation.Settings.from_config(config).mode == "off"
    assert capability.Settings.from_config(config).levels is None
    # A census still turns the check on: only the command line's off overrides it.
    checked = determinism.Settings.from_config(config)
    assert checked.enabled and checked.runs == DEFAULT_RUNS
    cli_off = pytester.parseconfig(f"--backends-determinism={word}")
    assert determinism.Settings.from_config(cli_off).enabled is False


def test_every_switch_takes_none_as_off_in_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    switches = [o.ini for o in _options.OPTIONS if o.kind == "flag"]
    assert "backends_strict" in switches and "backends_determinism_all" in switches
    pytester.makeini("[pytest]\n" + "".join(f"{key} = none\n" for key in switches))
    result = pytester.runpytest_inprocess("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(("word", "on"), [("y", True), ("t", True), ("n", False), ("f", False)])
def test_a_switch_keeps_accepting_pytests_own_bool_spellings(
    pytester: pytest.Pytester, word: str, on: bool
) -> None:
    pytester.makeini(f"[pytest]\nbackends_determinism_all = {word}\nbackends_strict = {word}\n")
    config = pytester.parseconfig()
    assert _options.lookup(config, "backends_determinism_all").value is on
    assert _options.lookup(config, "backends_strict").value is on


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("ini", "backends_leaks = loud", "ini option backends_leaks: invalid value 'loud'; choose"),
        ("ini", "backends_matrix = mkl dnn", "ini option backends_matrix: 'mkl dnn' is not an"),
        ("cli", "--backends-matrix=nosuchaxis", "--backends-matrix: unknown axis 'nosuchaxis'"),
        ("ini", "backends_sample = many", "ini option backends_sample: expected a positive"),
        ("cli", "--backends-seed=-3", "--backends-seed: expected a non-negative integer"),
        ("ini", "backends_config = mkldnn_off!", "ini option backends_config: 'mkldnn_off!' is"),
        ("ini", "backends_verify = maybe", "ini option backends_verify: expected one of off"),
        ("ini", "backends_cpu_capability = avx9", "unknown CPU capability level 'avx9'; choose"),
        ("ini", "backends_determinism = 1", "ini option backends_determinism: the determinism"),
        ("cli", "--backends-determinism=many", "Write --backends-determinism=N: a bare"),
        ("ini", "backends_determinism_all = maybe", "ini option backends_determinism_all: exp"),
        ("cli", "--backends-baseline-update", "name the file to write with --backends-baseline"),
        ("cli", "--backends-label= ", "--backends-label= was given an empty value"),
        ("ini", "backends_strict = maybe", "ini option backends_strict: expected on or off"),
        (
            "ini",
            "backends_determinism = 2\nbackends_determinism_repeatable = maybe",
            "ini option backends_determinism_repeatable: expected on or off",
        ),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_option_before_any_test(
    pytester: pytest.Pytester, where: str, value: str, message: str
) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    if where == "ini":
        pytester.makeini(f"[pytest]\n{value}\n")
    result = pytester.runpytest_inprocess("-p", "no:randomly", *([value] if where == "cli" else []))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert message in err
    assert "INTERNALERROR" not in err + result.stdout.str()
    assert "passed" not in result.stdout.str(), "tests ran before the bad value was reported"


def test_strict_on_the_command_line_fails_a_run_whose_option_selected_nothing(
    suite: pytest.Pytester,
) -> None:
    suite.makeini("[pytest]\nbackends_strict = false\nbackends_leaks = off\n")
    result = suite.runpytest_subprocess(*COMMON, "--backends-strict", "--backends-matrix=cudnn")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*backends: options that selected no test*",
            "--backends-matrix selected no test: no collected test is marked "
            "@pytest.mark.backends with axes cudnn",
            "--backends-strict: the run fails because of the above "
            "(exit code 4, or 1 where tests failed too)",
        ]
    )


def test_strict_exit_code_is_4_when_a_config_selection_selects_nothing(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest_subprocess(
        *COMMON, "--backends-strict", "--backends-config=cudnn-on", "-k", "test_marked"
    )
    result.stdout.fnmatch_lines(
        [
            "--backends-config selected no test: no collected test is marked "
            "@pytest.mark.backends with the cudnn axis (--backends-config narrows only the "
            "tests marked with the axes it names; the others ran as without it)",
            "--backends-strict: the run fails because of the above "
            "(exit code 4, or 1 where tests failed too)",
        ]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.parametrize(
    "options",
    [
        ["--backends-report=same.out", "--backends-html=same.out"],
        ["--backends-report=same.out", "--backends-census=same.out"],
        ["--backends-baseline=same.out", "--backends-census=same.out"],
        ["--backends-batch-baseline=same.out", "--backends-html=same.out"],
    ],
)
def test_two_options_naming_one_written_file_are_a_usage_error(
    pytester: pytest.Pytester, options: list[str]
) -> None:
    """Refused before any test runs, so nothing is overwritten and no run is wasted."""
    pytester.makepyfile("def test_x():\n    pass\n")
    if "baseline" in options[0]:
        (pytester.path / "same.out").write_text(
            '{"format": "pytest-backends-baseline", "version": 1, "accepted": []}'
        )
    before = (
        (pytester.path / "same.out").read_bytes() if (pytester.path / "same.out").exists() else None
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = next(x for x in result.stderr.lines if "name the same file" in x)
    assert all(o.split("=")[0] + " " in line + " " for o in options), line
    assert line.rstrip().endswith("same.out: give each its own file"), line
    after = (
        (pytester.path / "same.out").read_bytes() if (pytester.path / "same.out").exists() else None
    )
    assert after == before
