"""What ran inside an op: oneDNN's primitive log and CUDA kernel names.

Profiler op names stop at the dispatcher: ``aten::mm`` may be computed by
oneDNN or by a BLAS, in fp32 or in bf16, and a flag only *allows* a path.
Two sources say what really computed an op:

* on the CPU, **oneDNN's primitive log** (``torch.backends.mkldnn.verbose``):
  the C++ library prints one line per executed primitive to file
  descriptor 1, naming its kind, implementation, ISA, data types and
  ``fpmath`` attribute.  :class:`PrimitiveLog` captures it at the fd level
  (pytest's own capture keeps working: whatever else reached fd 1 is passed
  on when the capture ends) and :func:`parse_primitive` reads the lines;
* on CUDA, **the profiler's kernel names**: :func:`classify_cuda_kernel`
  tells TF32, cuDNN, cuBLAS/cuBLASLt and the SDPA kernels apart.

:func:`attribute` assigns each primitive to the op that was running, from
the op events of a ``torch.profiler`` run of the same code.  While a log is
being captured (``--backends-verify``, or :func:`observe` in a test),
:func:`computed_precision` answers "in which precision did the kernels of
this op family compute so far", which the tolerance model uses.

:mod:`.log` captures the log (:func:`observe`, :func:`computed_precision`);
:mod:`.primitives` parses the log's lines,
:mod:`.attribution` matches primitives to ops and :mod:`.cuda` reads CUDA
kernel names.  Nothing here imports torch at import time.
"""

from pytest_backends.kernels.attribution import FAMILY_OPS, OpEvent, attribute, computes_shape
from pytest_backends.kernels.cuda import CudaKernel, classify_cuda_kernel, cuda_kernel_summary
from pytest_backends.kernels.log import (
    PROBE_SCOPE,
    PrimitiveLog,
    active_log,
    computed_precision,
    observe,
    paused_log,
)
from pytest_backends.kernels.primitives import (
    PRIMITIVE_FAMILY,
    Primitive,
    parse_primitive,
    parse_primitives,
)

__all__ = [
    "FAMILY_OPS",
    "PRIMITIVE_FAMILY",
    "PROBE_SCOPE",
    "CudaKernel",
    "OpEvent",
    "Primitive",
    "PrimitiveLog",
    "active_log",
    "attribute",
    "classify_cuda_kernel",
    "computed_precision",
    "computes_shape",
    "cuda_kernel_summary",
    "observe",
    "parse_primitive",
    "parse_primitives",
    "paused_log",
]
