"""The files the plugin writes and reads: only its own, with the right mode, errors named.

Unit tests drive :mod:`pytest_backends._files` directly; the pytester runs
check the promises end to end: a bad path is a usage error before any test
runs, a write that fails at the end makes the exit code non-zero with no
"written" line, and a malformed JSON input is a usage error naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_backends import _files
from pytest_backends.determinism.census import (
    Baseline,
    Census,
    CensusFileError,
    Versions,
    read_census,
)
from pytest_backends.matrix import report as matrix_report
from pytest_backends.matrix.report_html import render_html

pytest_plugins = ["pytester"]

V = Versions("2.13.0+cpu", None)
TEST_FILE = "def test_model():\n    assert 1 + 1 == 2\n"


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _own_report() -> str:
    return matrix_report.render_json([], [], environment=[], settings={})


def _own_html() -> str:
    return render_html([], [], environment=[], verify=False)


def _census_file(path: Path) -> Path:
    Census().write(path, runs=2, versions=V)
    return path


# --- reading JSON -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 3000, "nested too deeply"),
        ('{"a":' * 3000, "nested too deeply"),
        (
            '{"format": "pytest-backends-baseline", "version": 1, "accepted": ['
            + "[" * 5000
            + "]" * 5000
            + "]}",
            "nested too deeply",
        ),
        ("1" * 5000, "not valid JSON"),  # longer than int() converts
        ('{"version": Infinity}', "Infinity is not allowed"),
        ("", "Expecting value at line 1 column 1"),
        (b"\xff\xfe{}", "not UTF-8"),
        ('{"a": 1', "line 1 column"),
    ],
    ids=[
        "deep-array",
        "deep-object",
        "deep-inside",
        "huge-int",
        "infinity",
        "empty",
        "not-utf8",
        "truncated",
    ],
)
def test_malformed_json_is_a_format_error_naming_the_file(
    tmp_path: Path, content: str | bytes, message: str
) -> None:
    path = tmp_path / "baseline.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(_files.FileFormatError, match=message) as info:
        _files.read_json(path, f"baseline file {path}")
    assert str(path) in str(info.value)
    # the census and baseline readers give their own error, naming the file
    with pytest.raises(CensusFileError, match=message):
        Baseline.load(path)
    with pytest.raises(CensusFileError, match=message):
        read_census(path)


def test_reading_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it would block forever
    with pytest.raises(CensusFileError, match="not a regular file"):
        Baseline.load(fifo)
    with pytest.raises(CensusFileError, match="not a regular file"):
        Baseline.load(tmp_path)
    with pytest.raises(CensusFileError, match="does not exist"):
        Baseline.load(tmp_path / "missing.json")


# --- what may be overwritten --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        (_files.JSON_REPORT, _own_report),
        (
            _files.JSON_REPORT,
            lambda: json.dumps(
                dict.fromkeys(
                    ["version", "environment", "settings", "configs", "tests", "totals"], 1
                )
            ),
        ),
        (_files.HTML_REPORT, _own_html),
        (
            _files.HTML_REPORT,
            lambda: (
                "<!DOCTYPE html>\n<html><head><title>pytest-backends matrix</title></head></html>"
            ),
        ),
        (_files.CENSUS, lambda: json.dumps({"format": "pytest-backends-census", "version": 1})),
        (
            _files.BASELINE,
            lambda: json.dumps(
                {"accepted": [], "version": 1, "format": "pytest-backends-baseline"}
            ),
        ),
        (_files.JSON_REPORT, lambda: ""),
    ],
    ids=[
        "report",
        "report-before-format-name",
        "html",
        "html-before-meta",
        "census",
        "baseline-any-key-order",
        "empty-file",
    ],
)
def test_own_outputs_and_empty_files_are_overwritten(
    tmp_path: Path, kind: _files.OutputKind, make: object
) -> None:
    path = tmp_path / "out"
    path.write_text(make())  # type: ignore[operator]
    _files.write_output(path, "new", kind)
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize(
    ("kind", "content"),
    [
        (_files.HTML_REPORT, TEST_FILE),
        (_files.JSON_REPORT, '{"format": "pytest-backends-census", "version": 1}'),
        (_files.JSON_REPORT, '{"results": [1, 2, 3]}'),
        (_files.CENSUS, '{"format": "pytest-backends-baseline", "version": 1}'),
        (_files.BASELINE, "[" * 3000),
        (_files.HTML_REPORT, "<html><title>my page</title></html>"),
    ],
    ids=[
        "test-file-as-html",
        "census-as-report",
        "other-json",
        "baseline-as-census",
        "deep-json",
        "other-html",
    ],
)
def test_foreign_files_are_never_overwritten(
    tmp_path: Path, kind: _files.OutputKind, content: str
) -> None:
    path = tmp_path / "target"
    path.write_text(content)
    with pytest.raises(_files.OutputFileError, match=r"refusing to overwrite .*not a") as info:
        _files.write_output(path, "new", kind)
    assert str(path) in str(info.value)
    assert path.read_text() == content
    assert [p.name for p in tmp_path.iterdir()] == ["target"]


def _special_files(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    target = tmp_path / "precious.json"
    target.write_text(_own_report())
    link = tmp_path / "link.json"
    link.symlink_to(target)
    yield link, "a symbolic link"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    yield dangling, "a symbolic link"
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    yield fifo, "a FIFO"
    directory = tmp_path / "dir.json"
    directory.mkdir()
    yield directory, "a directory"
    node = tmp_path / "null"
    try:  # a private copy of /dev/null's device node; needs root (CAP_MKNOD)
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        return
    yield node, "a character device"


def test_symlinks_fifos_directories_and_devices_are_never_replaced(tmp_path: Path) -> None:
    seen = []
    for path, what in _special_files(tmp_path):
        before = os.lstat(path)
        with pytest.raises(_files.OutputFileError, match=f"it is {what}"):
            _files.write_output(path, _own_report(), _files.JSON_REPORT)
        after = os.lstat(path)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), path
        seen.append(what)
    assert (tmp_path / "precious.json").read_text() == _own_report()
    assert not list(tmp_path.glob(".*.tmp"))
    assert {"a symbolic link", "a FIFO", "a directory"} <= set(seen)


def test_a_directory_that_refuses_new_files_is_named(tmp_path: Path) -> None:
    """``/proc/version`` reads as an empty regular file; only the temporary file beside it fails."""
    if os.getuid() == 0:
        target = Path("/proc/version")
        if not target.is_file():
            pytest.skip("no /proc here")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        target = locked / "report.json"
        locked.chmod(0o500)
    with pytest.raises(_files.OutputFileError) as info:
        _files.write_output(target, _own_report(), _files.JSON_REPORT)
    assert f"cannot write {target}: cannot create a file in {target.parent}" in str(info.value)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_new_files_follow_the_umask_and_rewrites_keep_the_mode(tmp_path: Path, mask: int) -> None:
    path = tmp_path / "census.json"
    with umask(mask):
        _census_file(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
        path.chmod(0o640)
        _census_file(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
        assert read_census(path)[0] == V


def test_census_and_baseline_writers_refuse_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "test_model.py"
    path.write_text(TEST_FILE)
    with pytest.raises(CensusFileError, match="refusing to overwrite"):
        Census().write(path, runs=2, versions=V)
    with pytest.raises(CensusFileError, match="refusing to overwrite"):
        Baseline().write(path, V)
    assert path.read_text() == TEST_FILE


# --- end to end ---------------------------------------------------------------------------


def _assert_clean_usage_error(result: pytest.RunResult, *fragments: str) -> None:
    err = result.stderr.str()
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out + err
    assert "INTERNALERROR" not in out + err and "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_bad_output_paths_are_usage_errors_before_any_test_runs(pytester: pytest.Pytester) -> None:
    test_file = pytester.makepyfile(test_model=TEST_FILE + "    open('ran', 'w').close()\n")
    # the option takes the test file as its value
    result = pytester.runpytest_subprocess("--backends-html", "test_model.py")
    _assert_clean_usage_error(result, "--backends-html", "test_model.py", "refusing to overwrite")
    assert test_file.read_text().startswith(TEST_FILE)
    (pytester.path / "target.json").write_text(_own_report())
    (pytester.path / "link.json").symlink_to(pytester.path / "target.json")
    result = pytester.runpytest_subprocess("--backends-matrix", "--backends-report=link.json")
    _assert_clean_usage_error(result, "--backends-report", "symbolic link")
    result = pytester.runpytest_subprocess("--backends-census=test_model.py")
    _assert_clean_usage_error(result, "--backends-census", "test_model.py")
    assert test_file.read_text().startswith(TEST_FILE)
    assert not (pytester.path / "ran").exists()
    assert (pytester.path / "link.json").is_symlink()


def test_deeply_nested_baseline_is_a_usage_error_naming_the_file(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    (pytester.path / "deep.json").write_text("[" * 3000)
    result = pytester.runpytest_subprocess("--backends-baseline=deep.json")
    _assert_clean_usage_error(result, "--backends-baseline", "deep.json", "nested too deeply")


FAILED_WRITE_SUITE = """
import os, pytest, torch

@pytest.mark.backends("mkldnn")
def test_matrix(backend_config):
    assert torch.ones(2).sum() == 2

def test_takes_over_the_outputs():
    # another tool claims the report and census paths while the suite runs
    with open("r.json", "w") as f:
        f.write("user data\\n")
    os.mkdir("census.json")
"""


@pytest.mark.parametrize("extra", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_failed_write_fails_the_run_and_is_not_reported_written(
    pytester: pytest.Pytester, extra: list[str]
) -> None:
    pytester.makepyfile(test_outputs=FAILED_WRITE_SUITE)
    mask = os.umask(0o022)
    os.umask(mask)
    # the census is written by the same controller code either way: once is enough
    census = [] if extra else ["--backends-census=census.json"]
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "--backends-matrix",
        "--backends-report=r.json",
        "--backends-html=r.html",
        *census,
        *extra,
    )
    out = result.stdout.str()
    assert "INTERNALERROR" not in out + result.stderr.str()
    assert result.parseoutcomes().get("passed") == 3, out[-3000:]
    assert "failed" not in result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    assert (pytester.path / "r.json").read_text() == "user data\n"
    assert (pytester.path / "census.json").is_dir()
    lines = result.outlines
    assert any(
        "matrix report was not written" in line
        and "r.json" in line
        and "refusing to overwrite" in line
        for line in lines
    ), out[-3000:]
    if census:
        assert any(
            "--backends-census" in line and "census.json" in line and "a directory" in line
            for line in lines
        ), out[-3000:]
    for line in lines:
        if "written to" in line or "updated:" in line:
            assert "r.json" not in line and "census.json" not in line, line
    # the HTML report, which could be written, was; with the umask's mode
    html = pytester.path / "r.html"
    assert "report written to" in out and str(html) in out
    assert stat.S_IMODE(html.stat().st_mode) == 0o666 & ~mask
    assert "Traceback" not in out
    # and it says the run failed, and why: never greener than the exit code
    page = html.read_text()
    assert "exit status 1 (tests failed)" in page
    assert "the matrix report was not written" in page and "r.json" in page


def test_a_failed_html_write_is_in_the_json_report_written_before_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_outputs=FAILED_WRITE_SUITE.replace('"r.json"', '"r.html"').replace(
            'os.mkdir("census.json")', "pass"
        )
    )
    result = pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "--backends-matrix",
        "--backends-report=r.json",
        "--backends-html=r.html",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    assert (pytester.path / "r.html").read_text() == "user data\n"
    session = json.loads((pytester.path / "r.json").read_text())["session"]
    assert session["exitstatus"] == 1 and session["exit"] == "tests failed"
    assert session["outcomes"] == {"passed": 3}
    [problem] = session["problems"]
    assert problem["nodeid"] == "(session)"
    assert "the matrix report was not written" in problem["message"]
    assert "r.html" in problem["message"]


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "report.json"
    path.write_text(_own_report())

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.os, "replace", full_disk)
    with pytest.raises(_files.OutputFileError, match="No space left") as info:
        _files.write_output(path, "new", _files.JSON_REPORT)
    assert str(path) in str(info.value)
    assert path.read_text() == _own_report()
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_missing_directories_are_created_and_the_umask_read_without_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = open

    def no_proc(file: object, *args: object, **kwargs: object) -> object:
        if str(file).startswith("/proc/"):
            raise FileNotFoundError(file)
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_proc)
    path = tmp_path / "a" / "b" / "grid.html"
    with umask(0o027):
        _files.write_output(path, _own_html(), _files.HTML_REPORT)
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
        assert _files.check_output(path, _files.HTML_REPORT) is not None
        _files.write_output(path, _own_html(), _files.HTML_REPORT)  # its own output again
