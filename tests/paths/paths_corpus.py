"""The settings the paths corpora share, and their closing count check.

``PATHS_CORPUS_EXAMPLES`` raises the example count (``make bench``), and
``PYTEST_BACKENDS_CORPUS_SEEDED=1`` with ``--hypothesis-seed`` draws other
examples than CI's.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("PATHS_CORPUS_EXAMPLES", "25"))
# ``PYTEST_BACKENDS_CORPUS_SEEDED=1`` (with ``--hypothesis-seed``): other examples than CI's.
DERANDOMIZE = os.environ.get("PYTEST_BACKENDS_CORPUS_SEEDED") != "1"

#: The decorator of a corpus test: its examples, derandomized unless seeded, no deadline.
corpus = settings(
    max_examples=EXAMPLES,
    derandomize=DERANDOMIZE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def check_counts(name: str, counts: dict[str, int], total: str, found: str) -> None:
    """Print a corpus's counts; none may disagree with its oracle, and some must find something.

    Run after the corpus (file order); skipped where the corpus did not run.
    """
    if counts[total] == 0:
        pytest.skip("the corpus did not run in this session")
    print(f"{name} corpus: {counts}")
    assert counts["disagreements"] == 0
    assert counts[found] > 0
