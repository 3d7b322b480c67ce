"""Reading and writing the plugin's files: never half-written, never someone else's.

Every file the plugin writes (matrix report, HTML grid, census, baseline)
goes through :func:`write_output`, and every JSON file it reads through
:func:`read_json`. The rules live here, once:

* a write goes to a temporary file in the same directory, flushed and renamed
  over the target, so a reader sees the old file or the complete new one;
* only a regular file is ever replaced: a symlink, FIFO, device node or
  directory at the path is refused;
* an existing non-empty file is replaced only when it is the plugin's own
  output of the same kind, recognised by its header (``"format"`` as the first
  member of a JSON file, the generator ``<meta>`` tag in HTML) whatever its
  size, or else by its parsed content when it is small enough to read whole;
* a new file gets the mode the umask gives (``0666 & ~umask``); a rewritten
  file keeps the mode it had;
* reading refuses what is not a regular file, and turns every way JSON can
  be malformed (bad syntax, bad encoding, nesting deep enough to exhaust the
  interpreter's recursion limit, huge numbers) into :class:`FileFormatError`
  naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BASELINE",
    "CENSUS",
    "HTML_GENERATOR",
    "HTML_REPORT",
    "JSON_REPORT",
    "REPORT_FORMAT",
    "FileFormatError",
    "OutputFileError",
    "OutputKind",
    "atomic_write_text",
    "check_output",
    "read_json",
    "read_json_text",
    "write_output",
]

#: The ``format`` name of the matrix JSON report.
REPORT_FORMAT = "pytest-backends-report"
#: The generator name in the ``<meta name="generator">`` tag of the HTML grid.
HTML_GENERATOR = "pytest-backends"
_HTML_META = f'<meta name="generator" content="{HTML_GENERATOR}">'
# Reports written before the format name existed: the exact set of top-level keys.
_LEGACY_REPORT_KEYS = frozenset(
    {"version", "environment", "settings", "configs", "tests", "totals"}
)
_LEGACY_HTML_TITLE = "<title>pytest-backends matrix</title>"
#: The first bytes of an existing file, read to recognise it by its header.
_HEAD_BYTES = 64 << 10
#: Files up to this size are parsed whole when their header alone does not tell
#: (reports written before the ``format`` name, keys reordered by an editor).
_RECOGNISE_LIMIT = 64 << 20
# `{ "format": "<name>"` as the first member of a JSON object, the way the
# plugin writes every JSON file.
_JSON_FORMAT_HEAD = re.compile(r'\A\ufeff?\s*\{\s*"format"\s*:\s*("(?:[^"\\]|\\.)*")')


class FileFormatError(ValueError):
    """A JSON file cannot be read or is malformed; the message names the file."""


class OutputFileError(OSError):
    """An output file cannot (or must not) be written; the message names the path."""


@dataclass(frozen=True)
class OutputKind:
    """What a written file is, and how to recognise an earlier one of the same kind.

    ``header`` looks at the file's first bytes only (any size of file);
    ``recognise`` at the whole text of a file small enough to read whole, and
    only when the header did not already tell.
    """

    label: str
    recognise: Callable[[str], bool]
    header: Callable[[str], bool] = lambda head: False


def _json_header_is(*formats: str) -> Callable[[str], bool]:
    def header(head: str) -> bool:
        match = _JSON_FORMAT_HEAD.match(head)
        if match is None:
            return False
        try:
            return json.loads(match.group(1)) in formats
        except ValueError:
            return False

    return header


def _json_format_is(
    *formats: str, legacy_keys: frozenset[str] | None = None
) -> Callable[[str], bool]:
    def recognise(text: str) -> bool:
        try:
            data = read_json_text(text, "file")
        except FileFormatError:
            return False
        if not isinstance(data, dict):
            return False
        if data.get("format") in formats:
            return True
        return legacy_keys is not None and set(data) == legacy_keys

    return recognise


def _is_own_html(text: str) -> bool:
    head = text[:4096]
    return _HTML_META in head or _LEGACY_HTML_TITLE in head


JSON_REPORT = OutputKind(
    "matrix report",
    _json_format_is(REPORT_FORMAT, legacy_keys=_LEGACY_REPORT_KEYS),
    _json_header_is(REPORT_FORMAT),
)
HTML_REPORT = OutputKind("HTML report", _is_own_html, _is_own_html)
CENSUS = OutputKind(
    "census",
    _json_format_is("pytest-backends-census"),
    _json_header_is("pytest-backends-census"),
)
BASELINE = OutputKind(
    "baseline",
    _json_format_is("pytest-backends-baseline"),
    _json_header_is("pytest-backends-baseline"),
)


# --- reading ------------------------------------------------------------------------------


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not allowed")


def read_json_text(text: str, what: str) -> Any:
    """Parse ``text`` as strict JSON; :class:`FileFormatError` starts with ``what``.

    ``NaN``/``Infinity`` are refused, as is nesting too deep for the parser
    (which would otherwise raise ``RecursionError``).
    """
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise FileFormatError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise FileFormatError(
            f"{what} is not valid JSON: arrays or objects are nested too deeply"
        ) from None
    except (ValueError, TypeError, MemoryError) as exc:
        raise FileFormatError(f"{what} is not valid JSON: {exc}") from None


def read_json(path: Path, what: str) -> Any:
    """Read and parse the JSON file ``path``; every failure is a :class:`FileFormatError`.

    ``what`` names the file in messages (``"baseline file x.json"``). A path
    that is not a regular file (a FIFO would block forever, a directory or
    device is never meant) is refused without opening it.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileFormatError(f"{what} does not exist") from None
    except OSError as exc:
        raise FileFormatError(f"cannot read {what}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileFormatError(f"cannot read {what}: not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"cannot read {what}: not UTF-8 text ({exc.reason})") from None
    except (OSError, MemoryError) as exc:
        raise FileFormatError(f"cannot read {what}: {exc}") from None
    return read_json_text(text, what)


# --- writing ------------------------------------------------------------------------------


def _describe_type(mode: int) -> str | None:
    """What a non-regular file is, or None for a regular file."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_output(path: Path, kind: OutputKind) -> os.stat_result | None:
    """Raise :class:`OutputFileError` unless ``path`` may be written as a ``kind`` file.

    Returns the existing file's ``lstat`` (None when there is none). Allowed:
    no file, an empty regular file, or a regular file this plugin wrote as
    the same kind of output.
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    what = _describe_type(st.st_mode)
    if what is not None:
        raise OutputFileError(
            f"refusing to write the {kind.label} to {path}: it is {what}; "
            "name a regular file instead"
        )
    if st.st_size == 0:
        return st
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(_HEAD_BYTES)
            # Never parse a truncated body: the whole file, or the header alone.
            known = kind.header(head) or (
                st.st_size <= _RECOGNISE_LIMIT and kind.recognise(head + f.read())
            )
    except OSError as exc:
        raise OutputFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not known:
        raise OutputFileError(
            f"refusing to overwrite {path}: it exists and is not a {kind.label} written by "
            "pytest-backends (did the option take a test file as its value?); "
            "name another file or delete this one"
        )
    return st


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory.

    The temporary file is flushed to disk and renamed over ``path`` with
    ``os.replace``, so a reader (or a run interrupted at any point) sees
    either the previous file or the complete new one. The new file gets
    ``mode``, or ``0666`` less the umask. Raises ``OSError``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = 0o666 & ~_umask()
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(tmp, flags, 0o600)
        except FileExistsError:
            continue
        break
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_output(path: Path, text: str, kind: OutputKind) -> None:
    """Write one of the plugin's output files, following the rules of this module.

    Raises :class:`OutputFileError` (an ``OSError``) naming the path when the
    file must not or cannot be written; the previous file is then untouched.
    """
    path = Path(path)
    existing = check_output(path, kind)
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else None
    try:
        atomic_write_text(path, text, mode)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.filename is not None and Path(exc.filename).name.startswith(f".{path.name}."):
            # the temporary file beside it: the directory refused a new file
            why = f"cannot create a file in {path.parent} ({why})"
        raise OutputFileError(f"cannot write {path}: {why}") from None
