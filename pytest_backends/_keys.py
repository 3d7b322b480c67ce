"""Every ``StashKey`` and report property name of the plugin, in one place.

Feature modules read and write state through these keys only, so that a
feature never has to import another feature to find its state (which is how
import circles start).  Nothing here imports torch or a feature module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_backends import _shared

if TYPE_CHECKING:
    from pytest_backends.batch.plugin import BatchSettings
    from pytest_backends.determinism.plugin import DeterminismSettings
    from pytest_backends.isolation import LeakSettings
    from pytest_backends.matrix.configs import BackendConfig

__all__ = [
    "BATCH_KEY",
    "BATCH_ROWS_KEY",
    "BATCH_SPEC_KEY",
    "CHECK_KEY",
    "CONFIG_KEY",
    "DETERMINISM_KEY",
    "DRIFT_KEY",
    "ITEM_FLAGS_KEY",
    "LEAK_KEY",
    "PROPERTY_CONFIG",
    "PROPERTY_VERIFY_DETAIL",
    "PROPERTY_VERIFY_STATUS",
    "REPORT_ATTR_BATCH",
    "REPORT_ATTR_CENSUS",
    "REPORT_ATTR_CHECK",
    "SETUP_ERROR_KEY",
    "SUBTEST_FAILED_KEY",
    "SUBTEST_RERUN_FAILURE_KEY",
    "SUBTEST_RUN_KEY",
    "VERDICTS_KEY",
]

# --- config.stash: settings, resolved once ---------------------------------------------------

#: The resolved ``--backends-leaks`` settings.
LEAK_KEY: pytest.StashKey[LeakSettings] = pytest.StashKey()
#: The resolved determinism settings.
DETERMINISM_KEY: pytest.StashKey[DeterminismSettings] = pytest.StashKey()

# --- item.stash ------------------------------------------------------------------------------

#: The ``BackendConfig`` of an item (``default`` for a marked test outside the matrix).
CONFIG_KEY: pytest.StashKey[BackendConfig] = _shared.CONFIG_KEY  # type: ignore[assignment]
#: Flags to apply around one item's setup, call and teardown (``name -> value``).
#: Features such as the backend matrix put a config's flags here; the leak guard
#: applies them, checks leaks relative to them and restores them afterwards.
ITEM_FLAGS_KEY: pytest.StashKey[Mapping[str, Any]] = _shared.ITEM_FLAGS_KEY
#: Why the leak guard fails an item at setup (a bad marker, flags it could not apply).
SETUP_ERROR_KEY: pytest.StashKey[str] = pytest.StashKey()
#: The determinism verdicts (census rows) of one item, until its report is made.
VERDICTS_KEY: pytest.StashKey[list[dict[str, Any]]] = pytest.StashKey()

# --- report properties (``report.user_properties`` names, JUnit ``<property>``) ---------------

#: The id of the configuration a test ran under.
PROPERTY_CONFIG = "backend_config"
#: The verification status of a test's configuration.
PROPERTY_VERIFY_STATUS = "backends_verify"
#: The verification detail of a test's configuration.
PROPERTY_VERIFY_DETAIL = "backends_verify_detail"
#: Report attribute carrying one test's census rows (plain JSON-ready data).
REPORT_ATTR_CENSUS = "backends_census"
#: The determinism run in progress for an item (0 for the first).
SUBTEST_RUN_KEY: pytest.StashKey[int] = pytest.StashKey()
#: Whether a subtest failed in an item's first determinism run.
SUBTEST_FAILED_KEY: pytest.StashKey[bool] = pytest.StashKey()
#: The exception of a subtest that failed in a later determinism run only.
SUBTEST_RERUN_FAILURE_KEY: pytest.StashKey[BaseException] = pytest.StashKey()
#: One test's determinism check: ``{"check", "reason", "boundary"}``.
CHECK_KEY: pytest.StashKey[dict[str, Any]] = pytest.StashKey()
#: Report attribute carrying that check to the controller.
REPORT_ATTR_CHECK = "backends_determinism_check"
#: A change of the torch state found before an item's setup (made between tests).
DRIFT_KEY: pytest.StashKey[str] = pytest.StashKey()
#: The resolved batch-invariance settings.
BATCH_KEY: pytest.StashKey[BatchSettings] = pytest.StashKey()
#: The bound arguments of an item's ``@pytest.mark.batch_invariant`` marker.
BATCH_SPEC_KEY: pytest.StashKey[dict[str, Any]] = pytest.StashKey()
#: One item's batch-invariance census rows and config, until its report is made.
BATCH_ROWS_KEY: pytest.StashKey[dict[str, Any]] = pytest.StashKey()
#: Report attribute carrying those rows to the controller.
REPORT_ATTR_BATCH = "backends_batch_invariance"
