"""The op census and the baseline of accepted nondeterministic ops, as JSON files.

A census lists every ``(op, device, dtype)`` the determinism harness saw,
with its verdict, the tests that hit it and the torch/CUDA versions. A
baseline lists the nondeterministic ops a suite accepts; the harness fails a
run only for nondeterministic ops that are not in it. Both files are plain
JSON with a ``format`` name and a ``version`` number, written atomically
(temporary file, then ``os.replace``). Reading never evaluates anything: a
broken file gives a :class:`CensusFileError` that names the file and what is
wrong with it.

This module does not import torch; :meth:`Versions.current` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_backends import _files
from pytest_backends._files import atomic_write_text

__all__ = [
    "AUTOGRAD_ONLY",
    "BASELINE_FORMAT",
    "CENSUS_FORMAT",
    "FORMAT_VERSION",
    "VERDICTS",
    "Baseline",
    "BaselineEntry",
    "BaselineVersionWarning",
    "Census",
    "CensusFileError",
    "Key",
    "Versions",
    "add_section",
    "atomic_write_json",
    "device_type",
    "entry_rows",
    "entry_verdicts",
    "evidence",
    "load_baseline",
    "op_family",
    "read_census",
    "read_census_file",
]

CENSUS_FORMAT = "pytest-backends-census"
BASELINE_FORMAT = "pytest-backends-baseline"
#: The schema version written; files with a higher version are refused.
FORMAT_VERSION = 1

#: Verdicts, strongest first; an op's verdict is the strongest observed for it.
#: ``reads_uninitialized``: the op's outputs differed because it read memory that
#: no op wrote (``torch.empty``); a bug in the test, never accepted by a baseline.
VERDICTS = (
    "nondeterministic",
    "reads_uninitialized",
    "raises_under_deterministic_mode",
    "deterministic",
    "inconclusive",
)

#: ``(op, device type, dtype)``, e.g. ``("aten::index_add_", "cuda", "float32")``.
Key = tuple[str, "str | None", "str | None"]

#: Ops the census leaves out: torch's autograd layer completes them itself, so the
#: native hook (above autograd) sees them and a Python dispatch mode (below it) never
#: does. They change autograd metadata and compute no data (``torch.tensor(...)`` and
#: ``torch.as_tensor`` run ``detach_`` on every tensor they make; forward AD's
#: ``make_dual`` and ``unpack_dual`` run the other two), so no verdict is lost.
AUTOGRAD_ONLY = frozenset({"aten::detach_", "aten::_make_dual", "aten::_fw_primal"})


class CensusFileError(Exception):
    """A census or baseline file cannot be read or written; the message names it."""


class BaselineVersionWarning(UserWarning):
    """The baseline was recorded under another torch or CUDA version."""


@dataclass(frozen=True)
class Versions:
    """The torch and CUDA versions a census or baseline belongs to."""

    torch: str
    cuda: str | None

    @classmethod
    def current(cls) -> Versions:
        """The versions of the running torch (imports torch)."""
        import torch

        return cls(str(torch.__version__), torch.version.cuda)

    def describe(self) -> str:
        """``"torch 2.13.0+cpu (CUDA none)"``."""
        return f"torch {self.torch} (CUDA {self.cuda or 'none'})"


def atomic_write_json(
    path: Path, data: Mapping[str, Any], kind: _files.OutputKind | None = None
) -> None:
    """Write ``data`` as JSON to ``path`` atomically (see :func:`atomic_write_text`).

    Readers never see a half-written file; on failure the old file is left
    as it was and :class:`CensusFileError` names the path. With ``kind``, the
    rules of :func:`pytest_backends._files.write_output` apply (only a
    regular file of that kind, or none, is replaced; the mode is kept).
    """
    text = json.dumps(data, indent=2) + "\n"
    try:
        if kind is None:
            atomic_write_text(Path(path), text)
        else:
            _files.write_output(Path(path), text, kind)
    except _files.OutputFileError as exc:
        raise CensusFileError(str(exc)) from None
    except OSError as exc:
        raise CensusFileError(f"cannot write {path}: {exc}") from exc


def _load(path: Path, what: str, expected_format: str) -> dict[str, Any]:
    try:
        data = _files.read_json(Path(path), f"{what} file {path}")
    except _files.FileFormatError as exc:
        raise CensusFileError(str(exc)) from None
    if not isinstance(data, dict):
        raise CensusFileError(
            f"{what} file {path}: expected a JSON object at the top level, "
            f"got {type(data).__name__}"
        )
    fmt = data.get("format")
    if fmt != expected_format:
        other = {
            CENSUS_FORMAT: "a census",
            BASELINE_FORMAT: "a baseline",
            "pytest-backends-report": "a matrix report",
        }.get(str(fmt))
        hint = f" (it is {other} file)" if other else ""
        raise CensusFileError(
            f"{what} file {path}: 'format' must be {expected_format!r}, got {fmt!r}{hint}"
        )
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CensusFileError(
            f"{what} file {path}: 'version' must be a positive integer, got {version!r}"
        )
    if version > FORMAT_VERSION:
        raise CensusFileError(
            f"{what} file {path} has format version {version}, but this pytest-backends "
            f"reads versions up to {FORMAT_VERSION}; upgrade pytest-backends"
        )
    for name in ("torch", "cuda"):
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise CensusFileError(
                f"{what} file {path}: {name!r} must be a string or null, got {value!r}"
            )
    return data


def _optional_str(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise CensusFileError(f"{where} must be a string or null, got {value!r}")


def device_type(device: str | None) -> str | None:
    """``"cuda"`` for ``"cuda:1"``: a baseline entry's device is a device type."""
    return device.split(":", 1)[0] if device else device


def op_family(op: str) -> str:
    """``op`` without its in-place suffix: ``aten::index_add_`` -> ``aten::index_add``.

    A baseline entry accepts both forms. They run one kernel, and which one
    runs is torch's choice, not the test's: backward formulas and autograd's
    gradient accumulation take the out-of-place form while a Python dispatch
    mode is active (``isTensorSubclassLike``), so the Python recorder sees
    ``aten::index_add`` where the native one sees ``aten::index_add_``.
    Dunder names (``aten::__iand__``) are kept whole.
    """
    namespace, sep, name = op.rpartition("::")
    if name.endswith("_") and not name.endswith("__") and name.strip("_"):
        name = name[:-1]
    return namespace + sep + name


# --- census -----------------------------------------------------------------


@dataclass
class _Entry:
    counts: dict[str, int] = field(default_factory=dict)
    tests: set[str] = field(default_factory=set)
    nondeterministic_in: set[str] = field(default_factory=set)

    @property
    def verdict(self) -> str:
        for verdict in VERDICTS:
            if self.counts.get(verdict):
                return verdict
        return "inconclusive"


class Census:
    """Verdicts per ``(op, device, dtype)``, accumulated over tests (and xdist workers)."""

    def __init__(self) -> None:
        self._entries: dict[Key, _Entry] = {}
        #: Tests the check could not settle, with the reason ("not checked").
        self.not_checked: dict[str, str] = {}
        #: Tests with parts checked only at their boundary, with what and why.
        self.boundary: dict[str, list[str]] = {}

    def add_check(self, nodeid: str, reason: str | None, boundary: Iterable[str] = ()) -> None:
        """Record one test's check: ``reason`` when it was not checked, and its boundary notes."""
        if reason:
            self.not_checked[nodeid] = reason
        notes = list(boundary)
        if notes:
            self.boundary[nodeid] = notes

    def add_test(self, nodeid: str, verdicts: Mapping[Key, str]) -> None:
        """Record one test's verdict for each op key it hit, but ops in :data:`AUTOGRAD_ONLY`."""
        for key, verdict in verdicts.items():
            if verdict not in VERDICTS:
                raise ValueError(f"unknown verdict {verdict!r}")
            if key[0] in AUTOGRAD_ONLY:
                continue
            entry = self._entries.setdefault(key, _Entry())
            entry.counts[verdict] = entry.counts.get(verdict, 0) + 1
            entry.tests.add(nodeid)
            if verdict == "nondeterministic":
                entry.nondeterministic_in.add(nodeid)

    def __len__(self) -> int:
        return len(self._entries)

    def verdict(self, key: Key) -> str | None:
        """The verdict for ``key``, or None if no test hit it."""
        entry = self._entries.get(key)
        return entry.verdict if entry else None

    def op_keys(self) -> list[Key]:
        """Every key, sorted."""
        return sorted(self._entries, key=_sort_key)

    def nondeterministic(self) -> dict[Key, list[str]]:
        """Nondeterministic keys and the tests in which they were nondeterministic."""
        return {
            key: sorted(self._entries[key].nondeterministic_in)
            for key in self.op_keys()
            if self._entries[key].verdict == "nondeterministic"
        }

    def to_data(self) -> list[dict[str, Any]]:
        """The entries as JSON-ready dicts (also what xdist workers send back)."""
        rows: list[dict[str, Any]] = []
        for key in self.op_keys():
            entry = self._entries[key]
            op, device, dtype = key
            row: dict[str, Any] = {
                "op": op,
                "device": device,
                "dtype": dtype,
                "verdict": entry.verdict,
                "observations": {v: entry.counts[v] for v in VERDICTS if entry.counts.get(v)},
                "tests": sorted(entry.tests),
            }
            if entry.nondeterministic_in:
                row["nondeterministic_in"] = sorted(entry.nondeterministic_in)
            rows.append(row)
        return rows

    def merge_data(self, rows: Iterable[Mapping[str, Any]], source: str = "worker data") -> None:
        """Add entries produced by :meth:`to_data` (for example by an xdist worker)."""
        for i, row in enumerate(rows):
            where = f"{source}: entries[{i}]"
            if not isinstance(row, Mapping):
                raise CensusFileError(f"{where} must be an object, got {row!r}")
            op = row.get("op")
            if not isinstance(op, str) or not op:
                raise CensusFileError(f"{where}: 'op' must be a non-empty string, got {op!r}")
            key: Key = (
                op,
                _optional_str(row.get("device"), f"{where}: 'device'"),
                _optional_str(row.get("dtype"), f"{where}: 'dtype'"),
            )
            counts = row.get("observations", {})
            tests = row.get("tests", [])
            nondet = row.get("nondeterministic_in", [])
            if not isinstance(counts, Mapping) or any(
                v not in VERDICTS or isinstance(n, bool) or not isinstance(n, int)
                for v, n in counts.items()
            ):
                raise CensusFileError(f"{where}: 'observations' must map verdicts to counts")
            if not _str_list(tests) or not _str_list(nondet):
                raise CensusFileError(
                    f"{where}: 'tests' and 'nondeterministic_in' must be lists of strings"
                )
            if op in AUTOGRAD_ONLY:
                continue  # written before they were left out
            entry = self._entries.setdefault(key, _Entry())
            for verdict, n in counts.items():
                entry.counts[verdict] = entry.counts.get(verdict, 0) + n
            entry.tests.update(tests)
            entry.nondeterministic_in.update(nondet)

    def write(
        self,
        path: Path,
        *,
        runs: int,
        versions: Versions,
        label: str | None = None,
        sources: list[dict[str, Any]] | None = None,
    ) -> None:
        """Write the census JSON file atomically.

        ``label`` names the job that wrote it; a merged census lists its inputs
        as ``sources``.
        """
        data: dict[str, Any] = {
            "format": CENSUS_FORMAT,
            "version": FORMAT_VERSION,
            "torch": versions.torch,
            "cuda": versions.cuda,
            "runs": runs,
        }
        if label is not None:
            data["label"] = label
        if sources is not None:
            data["sources"] = sources
        data["entries"] = [{**row, "evidence": evidence(row, runs)} for row in self.to_data()]
        data["not_checked"] = dict(sorted(self.not_checked.items()))
        data["boundary"] = dict(sorted(self.boundary.items()))
        atomic_write_json(path, data, _files.CENSUS)


def entry_rows(verdicts: Mapping[Key, str]) -> list[dict[str, Any]]:
    """One test's census entry as it travels on its reports: a row per op key."""
    return [
        {"op": op, "device": device, "dtype": dtype, "verdict": found}
        for (op, device, dtype), found in verdicts.items()
    ]


def entry_verdicts(rows: Iterable[Mapping[str, Any]]) -> dict[Key, str]:
    """The verdicts of one test's census entry, from its rows (see :func:`entry_rows`)."""
    return {(r["op"], r["device"], r["dtype"]): r["verdict"] for r in rows}


def evidence(row: Mapping[str, Any], runs: int) -> str:
    """What a census entry's verdict rests on, in words that do not overstate it.

    ``deterministic`` means only that no test saw the op differ: a race that
    shows now and then (``index_put_(accumulate=True)`` on a million elements
    with two threads) can pass a few runs unseen. So it reads "no difference
    in N runs", never "deterministic".
    """
    counts = row.get("observations") or {}
    verdict = row.get("verdict")
    tests = sum(int(n) for n in counts.values()) if isinstance(counts, Mapping) else 0
    if verdict == "nondeterministic":
        return f"seen to differ from identical inputs in {counts.get(verdict, 0)} test(s)"
    if verdict == "reads_uninitialized":
        return f"read uninitialised memory in {counts.get(verdict, 0)} test(s)"
    if verdict == "raises_under_deterministic_mode":
        return "has no deterministic implementation (torch's deterministic mode alerts)"
    if verdict == "deterministic":
        seen = counts.get("deterministic", tests)
        return f"no difference in {runs} runs (in each of {seen} test(s)); a sample, not a proof"
    return "not compared (seen only after the runs had diverged, or in one run)"


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _sort_key(key: Key) -> tuple[str, str, str]:
    return (key[0], key[1] or "", key[2] or "")


def read_census(path: Path) -> tuple[Versions, Census]:
    """Read a census file written by ``--backends-census``."""
    _data, versions, census = read_census_file(path)
    return versions, census


def read_census_file(path: Path) -> tuple[dict[str, Any], Versions, Census]:
    """Read a census file: its JSON object (label, runs, sources), versions and entries."""
    data = _load(path, "census", CENSUS_FORMAT)
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise CensusFileError(f"census file {path}: 'entries' must be a list")
    census = Census()
    census.merge_data(entries, source=f"census file {path}")
    return data, Versions(str(data.get("torch")), data.get("cuda")), census


# --- baseline ---------------------------------------------------------------

_ENTRY_FIELDS = ("op", "device", "dtype", "note")


@dataclass(frozen=True)
class BaselineEntry:
    """One accepted nondeterministic op. ``dtype=None`` accepts every dtype."""

    op: str
    device: str
    dtype: str | None = None
    note: str | None = None

    def matches(self, key: Key) -> bool:
        """Whether this entry accepts ``(op, device, dtype)`` (``op`` in either form)."""
        op, device, dtype = key
        return (
            (op == self.op or op_family(op) == op_family(self.op))
            and device_type(device or "none") == device_type(self.device)
            and (self.dtype is None or dtype == self.dtype)
        )

    def to_data(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict."""
        row: dict[str, Any] = {"op": self.op, "device": self.device}
        if self.dtype is not None:
            row["dtype"] = self.dtype
        if self.note is not None:
            row["note"] = self.note
        return row


@dataclass(frozen=True)
class Baseline:
    """The accepted nondeterministic ops of a suite, and the versions they were recorded under."""

    entries: tuple[BaselineEntry, ...] = ()
    versions: Versions | None = None

    def accepts(self, key: Key) -> bool:
        """Whether some entry accepts ``key``."""
        return any(entry.matches(key) for entry in self.entries)

    def version_mismatch(self, path: Path, current: Versions) -> str | None:
        """A warning text naming both versions, or None when they agree."""
        if self.versions is None or self.versions == current:
            return None
        return (
            f"baseline {path} was recorded under {self.versions.describe()}, but this run uses "
            f"{current.describe()}; which kernels are nondeterministic can change between "
            "versions. Refresh it with --backends-baseline-update."
        )

    @classmethod
    def load(cls, path: Path) -> Baseline:
        """Read and validate a baseline file."""
        data = _load(path, "baseline", BASELINE_FORMAT)
        rows = data.get("accepted")
        if not isinstance(rows, list):
            raise CensusFileError(f"baseline file {path}: 'accepted' must be a list of objects")
        entries: list[BaselineEntry] = []
        for i, row in enumerate(rows):
            where = f"baseline file {path}: accepted[{i}]"
            if not isinstance(row, dict):
                raise CensusFileError(f"{where} must be an object, got {row!r}")
            unknown = sorted(set(row) - set(_ENTRY_FIELDS))
            if unknown:
                raise CensusFileError(
                    f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; "
                    f"allowed: {', '.join(_ENTRY_FIELDS)}"
                )
            op, device = row.get("op"), row.get("device")
            if not isinstance(op, str) or not op:
                raise CensusFileError(f"{where}: 'op' must be a non-empty string, got {op!r}")
            if not isinstance(device, str) or not device:
                raise CensusFileError(
                    f"{where}: 'device' must be a non-empty string such as 'cuda', got {device!r}"
                )
            entries.append(
                BaselineEntry(
                    op,
                    device,
                    _optional_str(row.get("dtype"), f"{where}: 'dtype'"),
                    _optional_str(row.get("note"), f"{where}: 'note'"),
                )
            )
        versions = Versions(data["torch"], data.get("cuda")) if data.get("torch") else None
        return cls(tuple(entries), versions)

    def updated(self, census: Census) -> Baseline:
        """The baseline after a run: its census's nondeterministic ops are added.

        Every existing entry is kept, with its note: a run may be one shard of
        a suite, and an op that came out deterministic in its tests may be
        nondeterministic in another shard's. Entries are removed only from a
        census of the whole suite (:mod:`pytest_backends.determinism.baseline_refresh`).
        """
        nondet = list(census.nondeterministic())
        kept = list(self.entries)
        added = [
            BaselineEntry(op, device_type(device) or "none", dtype)
            for op, device, dtype in nondet
            if not any(entry.matches((op, device, dtype)) for entry in kept)
        ]
        entries = sorted([*kept, *added], key=lambda e: (e.op, e.device, e.dtype or ""))
        return Baseline(tuple(entries), self.versions)

    def write(self, path: Path, versions: Versions) -> None:
        """Write the baseline JSON file atomically, stamped with ``versions``."""
        atomic_write_json(
            path,
            {
                "format": BASELINE_FORMAT,
                "version": FORMAT_VERSION,
                "torch": versions.torch,
                "cuda": versions.cuda,
                "accepted": [entry.to_data() for entry in self.entries],
            },
            _files.BASELINE,
        )


def add_section(path: Path, name: str, section: Any) -> None:
    """Add (or replace) the top-level ``name`` of the census file at ``path``, atomically.

    Other checks (batch invariance) keep their verdicts in sections of their
    own beside the determinism entries.
    """
    data = _load(path, "census", CENSUS_FORMAT)
    data[name] = section
    atomic_write_json(path, data, _files.CENSUS)


def load_baseline(config: Any, path: Path, update: bool, option: str) -> Baseline:
    """The baseline ``option`` names, read and validated once, when the options resolve.

    A missing file is fine only when ``update`` is to create it; any other
    unreadable file is a usage error naming ``option``. Outside pytest-xdist
    workers, a baseline recorded under other torch or CUDA versions warns.
    """
    import pytest

    from pytest_backends import _xdist

    baseline = Baseline()
    try:
        baseline = Baseline.load(path)
    except CensusFileError as exc:
        missing = not path.exists()
        if not (missing and update):
            hint = f" (create it with {option}-update)" if missing else ""
            raise pytest.UsageError(f"{option}: {exc}{hint}") from None
    if not _xdist.is_worker(config):
        message = baseline.version_mismatch(path, Versions.current())
        if message:
            config.issue_config_time_warning(BaselineVersionWarning(message), stacklevel=2)
    return baseline
