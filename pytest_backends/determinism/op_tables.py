"""The op tables both recorders use, in one place.

The Python recorder (:mod:`~pytest_backends.determinism.keys`) reads them
directly; the native recorder (``native/recorder.cpp``) receives them from
:func:`~pytest_backends.determinism.record_native.native_module` before it
records anything, so the two cannot drift apart.

Importing this module imports nothing.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MARKER_NAMESPACES",
    "OVERWRITES",
    "REBINDS",
    "SLOT_TAGS",
    "UNINITIALIZED",
    "WORKSPACES",
    "SlotTag",
]

#: Ops whose output is uninitialised memory: compared by dtype and shape only.
UNINITIALIZED = frozenset(
    {
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::empty_permuted",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "aten::resize_as_",
    }
)

#: Outputs that are scratch space of a fused kernel, not results (by position in
#: the op's returns; the schemas leave these returns unnamed). Their contents need
#: not be reproducible; the backward that reads them is still checked.
WORKSPACES: dict[str, frozenset[int]] = {
    "aten::mkldnn_rnn_layer": frozenset({3}),  # (output, hy, cy, workspace)
    "aten::_cudnn_rnn": frozenset({3}),  # (output, hy, cy, reserve, weight_buf)
    "aten::miopen_rnn": frozenset({3}),
    "aten::_thnn_fused_lstm_cell": frozenset({2}),  # (hy, cy, workspace)
    "aten::_thnn_fused_gru_cell": frozenset({1}),  # (hy, workspace)
    "aten::cudnn_batch_norm": frozenset({3}),  # (out, save_mean, save_var, reserve)
    "aten::_scaled_dot_product_flash_attention": frozenset({7, 8}),  # unused, debug mask
    "aten::_scaled_dot_product_cudnn_attention": frozenset({8}),  # debug_attn_mask
    "aten::_flash_attention_forward": frozenset({3, 4}),  # unused, debug_attn_mask
    # (loss, log_alpha): the CPU kernel fills log_alpha only up to each sample's
    # input and target lengths; the rest is uninitialised and never read.
    "aten::_ctc_loss": frozenset({1}),
}

#: Ops that overwrite every element of the tensors they write without reading them.
OVERWRITES = frozenset(
    {
        "aten::fill_",
        "aten::zero_",
        "aten::copy_",
        "aten::normal_",
        "aten::uniform_",
        "aten::random_",
        "aten::bernoulli_",
        "aten::exponential_",
        "aten::geometric_",
        "aten::cauchy_",
        "aten::log_normal_",
        "aten::set_",
    }
)

#: Ops that point a tensor at other memory (a storage made outside torch ops, shared
#: memory from a DataLoader worker): the memory is keyed where an op first reads it.
REBINDS = frozenset({"aten::set_"})

#: Namespaces of ops that mark a range and compute nothing: ``record_function``
#: enters and leaves its range through ``profiler::`` ops (so does a DataLoader
#: around every batch it yields). They read and write no tensor data, so neither
#: recorder records them: a test that opens a different number of ranges per run
#: but computes the same ops has the same op sequence in every run.
MARKER_NAMESPACES = frozenset({"profiler"})


class SlotTag:
    """The tags a recorded tensor slot starts with (``("digest", h0, h1)``,
    ``("uninitialized", dtype, shape)``, ...): the one spelling of each.

    Both recorders write them (``native/recorder.cpp`` spells them in C++; its
    parity test holds them to :data:`SLOT_TAGS`); the comparison and the
    verdict read them from here.
    """

    DIGEST: Final = "digest"
    VIEW: Final = "view"
    UNINITIALIZED: Final = "uninitialized"
    WORKSPACE: Final = "workspace"
    EMPTY: Final = "empty"
    UNREAD: Final = "unread"
    REBOUND: Final = "rebound"
    OPAQUE: Final = "opaque"


#: Every :class:`SlotTag`.
SLOT_TAGS = frozenset(
    {
        SlotTag.DIGEST,
        SlotTag.VIEW,
        SlotTag.UNINITIALIZED,
        SlotTag.WORKSPACE,
        SlotTag.EMPTY,
        SlotTag.UNREAD,
        SlotTag.REBOUND,
        SlotTag.OPAQUE,
    }
)
