"""Kernel-path verification (``--backends-verify``): did the promised path run?

A flag only *allows* a kernel path; torch still picks kernels per shape, dtype
and device (DESIGN A.5).  So for configs that promise a path, the op names of
the test's call phase are recorded with ``torch.profiler`` and checked against
:data:`PROMISES`, a table of ``config token -> promise``:

* a **hard** promise lists ops that must not run (``mkldnn-off`` must not run
  ``aten::mkldnn_convolution``); a broken one fails the test, saying what was
  requested and what ran;
* a **soft** promise lists ops of which at least one should run
  (``mkldnn-on`` should reach oneDNN).  When none did, the test is reported
  as *not exercised*, naming the path that ran instead; with
  ``--backends-verify=strict`` that is a failure too.

The profiler is used rather than a ``TorchDispatchMode`` because a dispatch
mode only sees the op it intercepts: a conv under a mode shows up as
``aten.convolution`` and never as the ``aten::mkldnn_convolution`` or
``aten::_slow_conv2d_forward`` it dispatches to, while the profiler records
every op the dispatcher runs, nested ones included.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import sys
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_backends import _keys
from pytest_backends.matrix.configs import BackendConfig

__all__ = [
    "PROMISES",
    "ProfilerOpRecorder",
    "Promise",
    "Verdict",
    "VerifyPlugin",
    "evaluate",
]

#: JUnit/report properties written by the verifier.
STATUS_PROPERTY = _keys.PROPERTY_VERIFY_STATUS
DETAIL_PROPERTY = _keys.PROPERTY_VERIFY_DETAIL

# Ops that *implement* a convolution, i.e. that show which path ran.
CONV_IMPLS = (
    "aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "aten::slow_conv3d_forward",
    "aten::slow_conv_dilated2d", "aten::slow_conv_dilated3d", "aten::slow_conv_transpose2d",
    "aten::slow_conv_transpose3d", "aten::_nnpack_spatial_convolution",
    "aten::_conv_depthwise2d", "aten::conv_depthwise3d", "aten::cudnn_convolution*",
    "aten::miopen_convolution*", "mkldnn::_convolution_pointwise*",
)
_SDPA_FLASH = ("aten::_scaled_dot_product_flash_attention*", "aten::_flash_attention_*")
_SDPA_EFFICIENT = ("aten::_scaled_dot_product_efficient_attention*",
                   "aten::_efficient_attention_*")
_SDPA_CUDNN = ("aten::_scaled_dot_product_cudnn_attention*", "aten::_cudnn_attention_*")
_SDPA_MATH = ("aten::_scaled_dot_product_attention_math*",)
_SDPA_OTHER = ("aten::_scaled_dot_product_fused_attention_overrideable*",)
SDPA_IMPLS = _SDPA_FLASH + _SDPA_EFFICIENT + _SDPA_CUDNN + _SDPA_MATH + _SDPA_OTHER


@dataclass(frozen=True)
class Promise:
    """What a config token promises about the kernels that run.

    ``forbid``: op-name patterns (``fnmatch``) that must not run (hard).
    ``expect``: patterns of which at least one should run (soft).
    ``instead``: patterns whose matches show what ran instead of ``expect``.
    ``ignore``: patterns excluded from ``forbid`` (queries such as
    ``aten::cudnn_is_acceptable`` that run on every path).
    ``path`` names the promised path in messages; ``nothing`` says what was
    missing when no op of ``instead`` ran either.  ``devices`` limits the
    promise to configs running on those devices (``None``: all).
    """

    path: str
    forbid: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    instead: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    nothing: str = "no op of that kind ran"
    devices: frozenset[str] | None = None


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


#: config token -> promise.  Extend it (or a copy passed to :class:`VerifyPlugin`)
#: for new axes.
PROMISES: dict[str, Promise] = {
    "mkldnn-off": Promise(
        "no oneDNN kernels",
        forbid=("aten::mkldnn_*", "aten::_mkldnn_*", "aten::to_mkldnn*", "mkldnn::*"),
        ignore=("mkldnn::_is_mkldnn_*",),
    ),
    "mkldnn-on": Promise(
        "oneDNN kernels",
        expect=("aten::mkldnn_*", "mkldnn::_convolution_pointwise*", "mkldnn::_linear_pointwise*"),
        instead=CONV_IMPLS,
        nothing="no convolution ran",
        devices=frozenset({"cpu"}),
    ),
    "nnpack-off": Promise("no NNPACK kernels", forbid=("aten::_nnpack_spatial_convolution*",)),
    "nnpack-on": Promise(
        "NNPACK convolutions",
        expect=("aten::_nnpack_spatial_convolution*",),
        instead=CONV_IMPLS,
        nothing="no convolution ran",
        devices=frozenset({"cpu"}),
    ),
    "cudnn-off": Promise(
        "no cuDNN kernels",
        forbid=("aten::cudnn_*", "aten::_cudnn_*"),
        ignore=("aten::cudnn_is_acceptable", "aten::_cudnn_attention_*"),
    ),
    "cudnn-on": Promise(
        "cuDNN kernels",
        expect=("aten::cudnn_*", "aten::_cudnn_rnn*", "aten::miopen_*"),
        instead=(*CONV_IMPLS, "aten::native_batch_norm", "aten::_thnn_fused_*"),
        ignore=("aten::cudnn_is_acceptable",),
        nothing="no convolution, RNN or batch norm ran",
        devices=frozenset({"cuda"}),
    ),
    "sdpa-math": Promise(
        "the math SDPA kernel",
        forbid=_SDPA_FLASH + _SDPA_EFFICIENT + _SDPA_CUDNN + _SDPA_OTHER,
        expect=_SDPA_MATH,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
    "sdpa-flash": Promise(
        "the flash-attention SDPA kernel",
        forbid=_SDPA_MATH + _SDPA_EFFICIENT + _SDPA_CUDNN + _SDPA_OTHER,
        expect=_SDPA_FLASH,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
    "sdpa-efficient": Promise(
        "the memory-efficient SDPA kernel",
        forbid=_SDPA_MATH + _SDPA_FLASH + _SDPA_CUDNN + _SDPA_OTHER,
        expect=_SDPA_EFFICIENT,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
    "sdpa-cudnn": Promise(
        "the cuDNN SDPA kernel",
        forbid=_SDPA_MATH + _SDPA_FLASH + _SDPA_EFFICIENT + _SDPA_OTHER,
        expect=_SDPA_CUDNN,
        instead=SDPA_IMPLS,
        nothing="no scaled_dot_product_attention ran",
    ),
}


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one test's ops against its config's promises."""

    broken: tuple[str, ...] = ()
    not_exercised: tuple[str, ...] = ()
    exercised: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        """``broken``, ``not exercised`` or ``ok``."""
        if self.broken:
            return "broken"
        return "not exercised" if self.not_exercised else "ok"

    @property
    def detail(self) -> str:
        """The problems (or, when there are none, what was exercised), joined with ``; ``."""
        return "; ".join(self.broken + self.not_exercised or self.exercised)


def _listed(names: Iterable[str], limit: int = 6) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def promises_for(
    config: BackendConfig, table: Mapping[str, Promise] = PROMISES
) -> list[tuple[str, Promise]]:
    """The ``(token, promise)`` pairs that apply to ``config`` on its device."""
    found = []
    for token in config.tokens:
        promise = table.get(token)
        if promise is not None and (promise.devices is None or config.device in promise.devices):
            found.append((token, promise))
    return found


def evaluate(
    config: BackendConfig, ops: Collection[str], table: Mapping[str, Promise] = PROMISES
) -> Verdict:
    """Check the op names a test ran against the promises of ``config``'s tokens."""
    broken: list[str] = []
    missing: list[str] = []
    exercised: list[str] = []
    for token, promise in promises_for(config, table):
        if promise.forbid:
            bad = [
                o for o in ops if _matches(o, promise.forbid) and not _matches(o, promise.ignore)
            ]
            if bad:
                broken.append(
                    f"{token} promised {promise.path}, but the test ran {_listed(bad)}. "
                    f"The flags of {config.id} were set around the test, so something "
                    "inside it changed them (torch.backends.*.flags(), sdpa_kernel(), "
                    "an assignment)"
                )
        if promise.expect:
            hit = [o for o in ops if _matches(o, promise.expect)]
            if hit:
                exercised.append(f"{token} exercised: {_listed(hit)}")
            else:
                other = [o for o in ops if _matches(o, promise.instead)]
                ran = f"ran {_listed(other)} instead" if other else promise.nothing
                missing.append(f"{token} not exercised: {promise.path} never ran; {ran}")
    return Verdict(tuple(broken), tuple(missing), tuple(exercised))


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Hide the banner lines kineto writes to fd 2 when a profiler starts and stops."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class ProfilerOpRecorder:
    """Records the names of every op the dispatcher runs (``torch.profiler``, CPU side)."""

    _profiler: Any = field(default=None, repr=False)
    error: str | None = None

    def start(self) -> bool:
        """Start recording; ``False`` (with :attr:`error`) if the profiler cannot start."""
        from torch.profiler import ProfilerActivity, profile

        self._profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
        try:
            with _quiet_stderr():
                self._profiler.__enter__()
        except RuntimeError as exc:  # e.g. the test session already runs a profiler
            self._profiler, self.error = None, f"the profiler could not start: {exc}"
            return False
        return True

    def stop(self) -> frozenset[str]:
        """Stop recording and return the op names seen."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return frozenset()
        with _quiet_stderr():
            profiler.__exit__(None, None, None)
        return frozenset(event.name for event in profiler.events())


class VerifyPlugin:
    """Records ops during each matrix item's call phase and checks its promises."""

    def __init__(self, *, strict: bool, table: Mapping[str, Promise] = PROMISES) -> None:
        self.strict = strict
        self.table = table

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        config = item.stash.get(_keys.CONFIG_KEY, None)
        if config is None or not promises_for(config, self.table):
            return (yield)
        recorder = ProfilerOpRecorder()
        if not recorder.start():
            item.user_properties.append((STATUS_PROPERTY, "unverified"))
            item.user_properties.append((DETAIL_PROPERTY, recorder.error or ""))
            return (yield)
        try:
            result = yield
        finally:
            ops = recorder.stop()
        if not ops:
            # A torch.profiler started inside the test takes the session over and
            # leaves this one empty; a test that runs no op at all looks the same.
            item.user_properties.append((STATUS_PROPERTY, "unverified"))
            item.user_properties.append((DETAIL_PROPERTY, (
                "no op was recorded: the test ran no torch op, or started its own "
                "torch.profiler, which takes the profiling session over"
            )))
            return result
        verdict = evaluate(config, ops, self.table)
        item.user_properties.append((STATUS_PROPERTY, verdict.status))
        item.user_properties.append((DETAIL_PROPERTY, verdict.detail))
        if verdict.broken:
            pytest.fail("backends-verify: " + "\n".join(verdict.broken), pytrace=False)
        if self.strict and verdict.not_exercised:
            pytest.fail(
                "backends-verify=strict: " + "\n".join(verdict.not_exercised), pytrace=False
            )
        return result
