"""The matrix's settings come from the option resolver and the shared keys, nothing else."""

from __future__ import annotations

import pytest

from pytest_backends import _shared
from pytest_backends.matrix import feature


def test_required_axes_come_from_the_shared_key(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("--backends-matrix=mkldnn")
    assert feature.Settings.from_config(config).axes == ("mkldnn",)
    config.stash[_shared.REQUIRED_AXES_KEY] = ("cpu_capability",)
    settings = feature.Settings.from_config(config)
    assert (settings.enabled, settings.axes) == (True, ("mkldnn", "cpu_capability"))
    # Off, the matrix turns on for the required axes alone.
    off = pytester.parseconfig()
    off.stash[_shared.REQUIRED_AXES_KEY] = ("cpu_capability",)
    settings = feature.Settings.from_config(off)
    assert (settings.enabled, settings.axes) == (True, ("cpu_capability",))


def test_a_config_id_implies_the_matrix_unless_the_command_line_turned_it_off(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nbackends_matrix = off\n")
    implied = feature.Settings.from_config(pytester.parseconfig("--backends-config=mkldnn-off"))
    assert (implied.enabled, implied.axes, implied.select) == (True, None, (("mkldnn-off",),))
    refused = feature.Settings.from_config(
        pytester.parseconfig("--backends-matrix=off", "--backends-config=mkldnn-off")
    )
    assert (refused.enabled, refused.select) == (False, ())


def test_report_paths_resolve_from_where_they_were_given(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nbackends_report = from-ini.json\n")
    sub = pytester.mkdir("sub")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        config = pytester.parseconfig(str(pytester.path), "--backends-html=cli.html")
    settings = feature.Settings.from_config(config)
    assert settings.report_json == config.rootpath / "from-ini.json"
    assert settings.report_html == sub / "cli.html"
    assert settings.sample is None and settings.sample_source == "ini option backends_sample"
