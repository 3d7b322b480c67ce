"""Rerun a failed matrix test recorded, under its own and a passing configuration's flags.

Only flag-level differences can be replayed in one process: a sibling
configuration on another device or another process-level axis is skipped.
The test body runs with the failed item's fixtures; each rerun starts from
the same RNG seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from pytest_backends.paths.api import SEED, SKIPPED, ConfigRun, first_divergence
from pytest_backends.paths.branches import path_difference
from pytest_backends.paths.record import PathRecorder, module_tracking

_TRIES = 2


def _recorded(
    item: pytest.Item, config_id: str, flags: Mapping[str, object], device: str
) -> tuple[bool, ConfigRun]:
    from pytest_backends.flags import override_flags

    passed = True
    with torch.random.fork_rng(devices=[]), override_flags(flags), module_tracking() as mods:
        torch.manual_seed(SEED)
        recorder = PathRecorder(mods)
        try:
            with recorder:
                item.runtest()
        except Exception:
            passed = False
    return passed, ConfigRun(config_id, dict(flags), device, [], recorder.records)


def locate(item: pytest.Item, config: Any, siblings: Sequence[Any]) -> str:
    """``the paths part at aten::X (...)`` and its certificate, or ``""`` when not found."""
    own_process = dict(getattr(config, "process_level", {}) or {})
    candidates = [
        s
        for s in siblings
        if s.device == config.device and dict(getattr(s, "process_level", {}) or {}) == own_process
    ][:_TRIES]
    if not candidates:
        return ""
    failed_ok, failing = _recorded(item, config.id, config.flags, config.device)
    if failed_ok:
        return ""  # the failure did not repeat: nothing to compare
    for sibling in candidates:
        ok, passing = _recorded(item, sibling.id, sibling.flags, sibling.device)
        if not ok:
            continue
        divergence = first_divergence(passing, failing)
        if divergence is not None:
            return divergence.describe()
        branch = path_difference(passing, failing, SKIPPED)
        if branch is not None:
            return branch
        if not passing.records and not failing.records:
            return (
                f"no torch op ran under {sibling.id} (passes) or {config.id} (fails): the "
                "failure does not come from a kernel path (a flag read, an exception)"
            )
        return (
            f"every op of {sibling.id} (passes) and {config.id} (fails) agrees within its "
            f"bound ({len(passing.records)} and {len(failing.records)} ops): the difference "
            "built up across ops, or the failure is not numeric (a flag read, a branch)"
        )
    return ""
