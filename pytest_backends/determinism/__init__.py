"""The determinism harness: assert_reproducible, digests, the op recorder, census and baseline."""

#: Number of runs when none is given (``assert_reproducible`` and ``--backends-determinism``).
#: Kept here, not in :mod:`.api`, so that reading the options imports no harness module.
DEFAULT_RUNS = 5
