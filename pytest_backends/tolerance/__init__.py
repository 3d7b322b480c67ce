"""Numeric tolerances derived from the dtype, the device and the active precision flags.

A result computed on a reduced-precision path (TF32, oneDNN bf16, fp16/bf16
GEMMs with reduced-precision reductions or fp16 accumulation) differs from
the exact result by an amount that depends on which flags let that path run
and on the reduction length ``k``.  :func:`tolerance_for` turns those inputs
into an elementwise bound ``|actual - expected| <= atol + rtol * |expected|``
and :func:`assert_close` applies it.  The model and its calibration are
described in ``docs/explanation/tolerance.rst``; the constants below were
checked by ``benchmarks/calibrate_tolerance.py``.

The package is split by job: :mod:`.model` (vocabulary, constants,
:class:`Tolerance`), :mod:`.view` (the flags as the model reads them),
:mod:`.kernel` (:func:`kernel_precision` and its probes), :mod:`.paths` (the
precision paths flags allow), :mod:`.bounds` (:func:`tolerance_for`) and
:mod:`.compare` (:func:`assert_close`, :func:`reference`,
:class:`BackendTolerance`).  It imports torch at import time; the plugin
imports it lazily.
"""

from __future__ import annotations

from pytest_backends.tolerance.bounds import tolerance_for
from pytest_backends.tolerance.compare import BackendTolerance, assert_close, reference
from pytest_backends.tolerance.kernel import kernel_precision
from pytest_backends.tolerance.model import OP_FAMILIES, Tolerance

__all__ = [
    "OP_FAMILIES",
    "BackendTolerance",
    "Tolerance",
    "assert_close",
    "kernel_precision",
    "reference",
    "tolerance_for",
]
