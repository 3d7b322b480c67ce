"""Where two kernel paths part: the first op whose result differs beyond its bound.

:func:`assert_paths_agree` compares configurations in this process;
:mod:`.trace` saves per-op sketches so two processes, machines or torch
versions can be compared offline.  Imports torch; the plugin loads it lazily.
"""

from __future__ import annotations

from pytest_backends.paths.api import (
    Divergence,
    PathsDisagreeError,
    assert_paths_agree,
    first_divergence,
)

__all__ = ["Divergence", "PathsDisagreeError", "assert_paths_agree", "first_divergence"]
