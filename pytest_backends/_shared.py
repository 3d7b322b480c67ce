"""The few names that cross features, and nothing else.

A feature keeps its own stash keys next to its settings.  What is here is
read or written by more than one feature: the configuration an item runs
under, the flags applied around it, the axes some feature requires of the
matrix, the run-wide ``--backends-strict`` and ``--backends-label`` choices,
and the names of the report properties that carry verdicts to the
controller, the report, ``merge`` and JUnit alike.  This module imports no
feature, not even for type checking: the types it needs are protocols.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

_T = TypeVar("_T")
_D = TypeVar("_D")

__all__ = [
    "CENSUS_WRITTEN_KEY",
    "CONFIG_KEY",
    "ITEM_FLAGS_KEY",
    "LABEL_KEY",
    "PROPERTY_BATCH",
    "PROPERTY_CENSUS",
    "PROPERTY_CHECK",
    "PROPERTY_CONFIG",
    "PROPERTY_DIVERGE",
    "PROPERTY_VERIFY_DETAIL",
    "PROPERTY_VERIFY_STATUS",
    "REQUIRED_AXES_KEY",
    "STRICT_KEY",
    "LabelChoice",
    "RunningConfig",
    "Strictness",
    "attach",
    "copy_properties",
    "explicit_label",
    "read",
    "reduces_onednn_precision",
    "stashed",
    "strict",
]


class RunningConfig(Protocol):
    """What every feature may read of the configuration an item runs under."""

    @property
    def id(self) -> str:
        """The configuration's id (``default`` outside the matrix)."""

    @property
    def axes(self) -> Mapping[str, str]:
        """Its value on each axis it names (``axis -> value``)."""

    @property
    def flags(self) -> Mapping[str, Any]:
        """The ``torch.backends`` flags it sets (``name -> value``)."""


class Strictness(Protocol):
    """The ``nothing_selected`` feature's settings, as other features read them."""

    @property
    def strict(self) -> bool:
        """Whether ``--backends-strict`` is on."""


class LabelChoice(Protocol):
    """The label feature's settings, as other features read them."""

    @property
    def explicit(self) -> str | None:
        """The label given on the command line or in the ini file (None: the default)."""


# --- config.stash ----------------------------------------------------------------------------

#: Axes that some feature requires every matrix test to run along (the CPU level
#: workers require ``cpu_capability``); set by the registrar before the matrix resolves.
REQUIRED_AXES_KEY: pytest.StashKey[tuple[str, ...]] = pytest.StashKey()
#: The ``nothing_selected`` feature's settings (``--backends-strict``).
STRICT_KEY: pytest.StashKey[Strictness] = pytest.StashKey()
#: The label feature's settings (``--backends-label``).
LABEL_KEY: pytest.StashKey[LabelChoice] = pytest.StashKey()
#: The census file the determinism check wrote at the end of this session (controller
#: only); the batch-invariance feature adds its section to it.
CENSUS_WRITTEN_KEY: pytest.StashKey[Path] = pytest.StashKey()

#: Why the run fails outside any test's report (a fixture's leak, ops outside a baseline,
#: a census that could not be written): ``(title, message)``, for the reports' problems.
SESSION_FAILURES_KEY: pytest.StashKey[list[tuple[str, str]]] = pytest.StashKey()

# --- item.stash ------------------------------------------------------------------------------

#: The configuration an item runs under (``default`` for a marked test outside the matrix).
CONFIG_KEY: pytest.StashKey[RunningConfig] = pytest.StashKey()
#: Flags to apply around one item's setup, call and teardown (``name -> value``).
#: The matrix puts a config's flags here; the leak guard applies them, checks
#: leaks relative to them and restores them afterwards.
ITEM_FLAGS_KEY: pytest.StashKey[Mapping[str, Any]] = pytest.StashKey()

# --- report properties (``report.user_properties`` names, JUnit ``<property>``) ---------------

#: The id of the configuration a test ran under.
PROPERTY_CONFIG = "backend_config"
#: The verification status of a test's configuration.
PROPERTY_VERIFY_STATUS = "backends_verify"
#: The verification detail of a test's configuration.
PROPERTY_VERIFY_DETAIL = "backends_verify_detail"
#: One test's determinism census rows.
PROPERTY_CENSUS = "backends_census"
#: One test's determinism check: ``{"check", "reason", "boundary"}``.
PROPERTY_CHECK = "backends_determinism_check"
#: One test's batch-invariance census rows and config.
PROPERTY_BATCH = "backends_batch_invariance"
#: Where a failing configuration's kernel path parts from a passing one's (one line).
PROPERTY_DIVERGE = "backends_diverge"


def fail_session(config: pytest.Config, title: str, message: str) -> None:
    """Record why the run fails outside any test (listed in the JSON and HTML reports)."""
    failures = config.stash.setdefault(SESSION_FAILURES_KEY, [])
    if (title, message) not in failures:
        failures.append((title, message))


def session_failures(config: pytest.Config) -> list[tuple[str, str]]:
    """What :func:`fail_session` recorded, in order."""
    failures = config.stash.get(SESSION_FAILURES_KEY, None)
    return [] if failures is None else list(failures)


def strict(config: pytest.Config) -> bool:
    """Whether ``--backends-strict`` is on (False before the settings are resolved)."""
    settings = config.stash.get(STRICT_KEY, None)
    return settings is not None and settings.strict


def explicit_label(config: pytest.Config) -> str | None:
    """The label given on the command line or in the ini file (None: use the default)."""
    settings = config.stash.get(LABEL_KEY, None)
    return None if settings is None else settings.explicit


def attach(target: Any, name: str, value: Any) -> None:
    """Attach ``value`` as the property ``name`` (replacing an earlier one): the one writer.

    ``target`` is a test report (that report alone) or an item: pytest copies
    an item's properties onto every report it makes of the item from then on,
    so a verdict attached during the call travels on the call and teardown
    reports (JUnit XML writes a test's properties from its teardown report).
    A string is kept as it is; other plain data (JSON-ready) is stored as JSON
    text, so that JUnit XML's ``<property>`` holds something a program can
    read back. Properties travel with the report from a pytest-xdist worker to
    the controller.
    """
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    target.user_properties = [(n, v) for n, v in target.user_properties if n != name]
    target.user_properties.append((name, text))


def copy_properties(source: Any, target: Any) -> None:
    """Attach every property of ``source`` (an item or a report) to ``target``."""
    for name, text in list(source.user_properties):
        attach(target, name, text)


def read(report: Any, name: str, *, text: bool = False, call: bool = False) -> Any:
    """The property ``name`` that :func:`attach` put on ``report``: the one reader.

    None when absent. ``text``: the text as stored (a config id, a status);
    otherwise the plain data it encodes (None when it is not JSON). ``call``:
    read only a call report (a verdict is counted once per test); a report
    pytest-rerunfailures replaces (outcome ``rerun``) counts for nothing.
    """
    if call and (
        getattr(report, "when", None) != "call" or str(getattr(report, "outcome", "")) == "rerun"
    ):
        return None
    found: str | None = None
    for key, value in getattr(report, "user_properties", ()) or ():
        if key == name:
            found = str(value)
    if found is None or text:
        return found
    try:
        return json.loads(found)
    except ValueError:
        return None


def reduces_onednn_precision(flags: Mapping[str, object]) -> bool:
    """Whether ``flags`` let oneDNN compute fp32 ops in a reduced precision."""
    return any(
        (name == "fp32_precision" or (name.startswith("mkldnn.") and "fp32_precision" in name))
        and value in ("bf16", "tf32")
        for name, value in flags.items()
    )


def stashed(stash: pytest.Stash, key: pytest.StashKey[_T], default: _D) -> _T | _D:
    """``stash.get(key, default)``, without raising and catching ``KeyError`` on a miss.

    For the per-test and per-item reads, where the key is mostly absent.
    """
    return stash[key] if key in stash else default  # noqa: SIM401 (get raises on a miss)
