"""Fixtures for the matrix tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def run(pytester: pytest.Pytester) -> Callable[..., pytest.RunResult]:
    """Run pytest in a subprocess (torch state is process-global) without random order."""

    def runner(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args)

    return runner
