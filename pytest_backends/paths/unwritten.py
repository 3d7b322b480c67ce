"""Replays that read memory an op never wrote as a known value, never as leftover bytes.

Some kernels leave part of an output unwritten (``aten::_ctc_loss``'s
``log_alpha`` beyond each target's length, ``torch.empty``): those elements
hold whatever the allocator's block held before.  Two replays of such an op
can then agree with its recording by chance (the same block came back) while
a third does not, and the op would be blamed for bytes no kernel computed.
Replays therefore run with torch's ``fill_uninitialized_memory`` (which acts
in deterministic mode, with ``warn_only`` so that no op raises): unwritten
elements read NaN (or an integer type's largest value) in every replay, so an
op that leaves memory unwritten never reproduces its recording and is never
blamed.  A configuration that sets one of these flags itself keeps its value.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["FILL_FLAGS", "filled_replay"]

#: The flags a replay runs under unless its configuration sets them.
FILL_FLAGS: Mapping[str, object] = {
    "deterministic_algorithms": True,
    "deterministic_algorithms.warn_only": True,
    "deterministic.fill_uninitialized_memory": True,
}


@contextmanager
def filled_replay(flags: Mapping[str, object]) -> Iterator[None]:
    """Set ``flags`` and, unless they say otherwise, fill unwritten memory; restore on exit."""
    from pytest_backends.flags import override_flags

    with warnings.catch_warnings(), override_flags({**FILL_FLAGS, **flags}):
        warnings.simplefilter("ignore")  # warn_only's "no deterministic implementation"
        yield
