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
    from pytest_backends.matrix.configs import BackendConfig

__all__ = [
    "CONFIG_KEY",
    "ITEM_FLAGS_KEY",
    "PROPERTY_CONFIG",
    "PROPERTY_VERIFY_DETAIL",
    "PROPERTY_VERIFY_STATUS",
]

# --- item.stash ------------------------------------------------------------------------------

#: The ``BackendConfig`` of an item (``default`` for a marked test outside the matrix).
CONFIG_KEY: pytest.StashKey[BackendConfig] = _shared.CONFIG_KEY  # type: ignore[assignment]
#: Flags to apply around one item's setup, call and teardown (``name -> value``).
#: Features such as the backend matrix put a config's flags here; the leak guard
#: applies them, checks leaks relative to them and restores them afterwards.
ITEM_FLAGS_KEY: pytest.StashKey[Mapping[str, Any]] = _shared.ITEM_FLAGS_KEY

# --- report properties (``report.user_properties`` names, JUnit ``<property>``) ---------------

#: The id of the configuration a test ran under.
PROPERTY_CONFIG = "backend_config"
#: The verification status of a test's configuration.
PROPERTY_VERIFY_STATUS = "backends_verify"
#: The verification detail of a test's configuration.
PROPERTY_VERIFY_DETAIL = "backends_verify_detail"
