"""Make this process forget what it decided about the native extension (tests only)."""

from __future__ import annotations

from pytest_backends import _native


def forget_decision() -> None:
    """The next ``_native.load()`` decides afresh: built, loaded or unavailable."""
    _native._state.tried = False
    _native._state.module = None
    _native._state.reason = None
