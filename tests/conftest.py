"""Shared test configuration.

pytester moves ``HOME`` for the runs it starts, which would move the native
extension's per-user build cache with it and rebuild the extension in every
subprocess. Pin the cache to this user's real one before that happens.
"""

from __future__ import annotations

import os

from pytest_backends import _native

os.environ.setdefault("PYTEST_BACKENDS_CACHE_DIR", str(_native._cache_root()))
