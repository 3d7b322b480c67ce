"""The fingerprint's oracle and its corpus of combined changes, shared by the fingerprint tests.

The oracle is every snapshot row read alone through its own ``read``. The corpus
(hypothesis, derandomized) applies a few changes at once and requires the registry's
fingerprint to give exactly the oracle's plain values, and to equal the baseline's
fingerprint exactly when the oracle equals the baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_backends.flags import FlagRegistry

#: A change: its name, and a callable that makes it and returns its undo.
Change = tuple[str, Callable[[], Callable[[], None]]]


def oracle(reg: FlagRegistry) -> dict[str, object]:
    """Every snapshot row's plain value, each read alone."""
    return {r.name: r.plain(r.read()) for r in reg.snapshot_rows}


def disagreements(
    reg: FlagRegistry, changes: Sequence[Change], *, max_size: int, examples: int = 60
) -> dict[str, int]:
    """Run the corpus; the counts of cases and disagreements (each also fails the test)."""
    baseline_fp, baseline = reg.fingerprint(), oracle(reg)
    assert reg.to_plain(baseline_fp) == baseline
    seen = {"cases": 0, "disagreements": 0}

    picks = st.lists(
        st.sampled_from(range(len(changes))), unique=True, min_size=1, max_size=max_size
    )

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(picks)
    def check(picked: list[int]) -> None:
        names = [changes[i][0] for i in picked]
        undo: list[Callable[[], None]] = []
        try:
            for index in picked:
                undo.append(changes[index][1]())
            fp, truth = reg.fingerprint(), oracle(reg)
            seen["cases"] += 1
            seen["disagreements"] += reg.to_plain(fp) != truth
            assert reg.to_plain(fp) == truth, names
            assert (fp == baseline_fp) == (truth == baseline), names
        finally:
            for step in reversed(undo):
                step()
            reg.restore(baseline)  # e.g. the precision strings a legacy setter wrote
        assert oracle(reg) == baseline
        assert reg.to_plain(reg.fingerprint()) == baseline

    check()
    return seen
