"""Values torch gives a switch itself, on first use: the process's state, not a test's change.

torch sets some switches lazily, in C++, the first time it needs them. On a
GPU of compute capability 9.x or 10.x with cuDNN 9.9 or later, the first
scaled-dot-product attention call routed on CUDA puts cuDNN attention first
in ``sdp.priority_order``, once per process, whatever the order was. The test
that happens to make that call has changed nothing: reporting it is a false
leak, and restoring the old order would take cuDNN attention off the front
for every later test, which a run without the plugin would not do.

The guard adopts such a change as the process's own state (its between-tests
reference and the session baseline), once per switch, and only where torch
itself would have made it: the value is exactly torch's, and the machine is
one on which torch makes that change. Anything else is a change like any
other.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["FirstUse", "cudnn_attention_first", "prefers_cudnn_attention"]

SDP_ORDER = "sdp.priority_order"
# The backends torch's first SDPA call on such a GPU puts first, in this order.
_CUDNN_FIRST = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
_FALSE = {"0", "false", "off", "no", "n"}
_TRUE = {"1", "true", "on", "yes", "y"}


def _env(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


def prefers_cudnn_attention(torch: Any) -> bool:
    """Whether torch's first SDPA call on CUDA puts cuDNN attention first on this machine.

    Only true once CUDA is initialised (the call that makes the change runs on
    CUDA), on a device of compute capability 9.0, 9.3, 10.0 or 10.3 with
    cuDNN 9.9 or later, and unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` (or an
    older torch's ``TORCH_CUDNN_SDPA_PREFERRED=0``) turns the preference off.
    """
    if _env("TORCH_CUDNN_SDPA_DEPRIORITIZED") or _env("TORCH_CUDNN_SDPA_PREFERRED") is False:
        return False
    try:
        if not torch.cuda.is_initialized():
            return False
        major, minor = torch.cuda.get_device_capability()
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # no CUDA runtime after all: torch makes no such change
        return False
    return major in (9, 10) and minor in (0, 3) and version is not None and version >= 90900


def cudnn_attention_first(torch: Any, before: object) -> list[int] | None:
    """``before`` with its first four entries set as torch sets them (None: not an order)."""
    members = getattr(getattr(torch, "_C", None), "_SDPBackend", None)
    if not isinstance(before, list) or len(before) < len(_CUDNN_FIRST) or members is None:
        return None
    try:
        first = [int(members.__members__[name]) for name in _CUDNN_FIRST]
    except KeyError:
        return None
    return first + list(before[len(first) :])


class FirstUse:
    """The switches whose first-use change torch already made in this process."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def claim(self, delta: Mapping[str, tuple[object, object]]) -> dict[str, object]:
        """``{name: value}`` of the changes in ``delta`` that are torch's own first-use setting.

        Each switch is claimed at most once per process: torch makes the
        change once, so a later change of the same kind is somebody else's.
        """
        if SDP_ORDER not in delta or SDP_ORDER in self.taken:
            return {}
        torch = sys.modules.get("torch")
        before, after = delta[SDP_ORDER]
        if torch is None or after != cudnn_attention_first(torch, before):
            return {}
        if not prefers_cudnn_attention(torch):
            return {}
        self.taken.add(SDP_ORDER)
        return {SDP_ORDER: after}


#: The process's record: torch's lazy settings are made once per process.
FIRST_USE = FirstUse()
