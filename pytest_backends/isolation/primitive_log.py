"""oneDNN's primitive log, captured during the call of a test under a reduced precision.

Registered by the guard (``isolation.guard``) after collection,
and only when a collected test's flags reduce oneDNN's fp32 precision: other
sessions neither import this module nor pay for its call hook.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from pytest_backends import _shared

__all__ = ["PrimitiveLogPlugin"]


class PrimitiveLogPlugin:
    """Captures oneDNN's primitive log during the call of a test under a reduced precision.

    Registered by the guard after collection, and only when a collected test's
    flags reduce oneDNN's fp32 precision: other sessions pay no call hook for it.
    """

    # trylast: inside pytest's capture wrapper, which points fd 1 at its own file
    # when the call starts; the primitive log must redirect fd 1 after it.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        """Under a reduced oneDNN precision, capture oneDNN's primitive log during the call.

        The tolerance model then bounds each result by the precision of the
        kernel that computed it (``pytest_backends.tolerance.kernel_precision``),
        not by the flag's worst case.  About 0.3 ms a test; only for items whose
        flags set ``fp32_precision`` to ``bf16`` or ``tf32``.
        """
        flags = item.stash.get(_shared.ITEM_FLAGS_KEY, None)
        if not flags or not _shared.reduces_onednn_precision(flags):
            return (yield)
        from pytest_backends import kernels

        if kernels.active_log() is not None:  # --backends-verify or the test captures already
            return (yield)
        log = kernels.PrimitiveLog()
        started = log.start()
        try:
            return (yield)
        finally:
            if started:
                log.stop()
