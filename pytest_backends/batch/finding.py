"""What the op-by-op comparison of a batch-invariance check found for one sub-batch.

Importing this module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_backends.determinism.locate import Location

__all__ = ["ACROSS", "Finding"]

#: The reason of a "mixed" finding whose op keeps the batch dimension.
ACROSS = "reads the other rows"


@dataclass(frozen=True)
class Finding:
    """What the op-by-op comparison found for one sub-batch.

    ``kind``: ``"op"`` (``op`` gave different output rows for identical input
    rows), ``"mixed"`` (``op`` reduces over the batch, so every row depends
    on the others: the function's design, not a kernel), ``"random"`` (``op``
    draws random numbers: two runs on the same inputs give different values,
    so a row's values depend on where it sits among the batch's draws),
    ``"nondeterministic"`` (``op`` gives other values from the same inputs and
    generator states: its result changes from call to call whatever the batch),
    ``"scalar"``
    (``op``'s tensor inputs were equal but a non-tensor argument, a value
    computed from the batch size, was not), ``"path"`` (the runs called
    different ops from ``op_index`` on, from the same line of user code in
    both: torch chose other ops for another batch size, ``op`` in the full
    batch and ``other_op`` in the sub-batch), ``"sequence"`` (the runs called
    different ops from ``op_index`` on, from different lines: control flow in
    the code depends on the batch size) or ``"none"`` (no op could be blamed;
    ``reason`` says why).
    """

    kind: str
    case: str
    op: str | None = None
    device: str | None = None
    dtype: str | None = None
    op_index: int | None = None
    other_op: str | None = None
    location: Location | None = None
    reason: str = ""
    #: Every cause found in the run, in op order, this finding among them: each op whose
    #: output rows differ for identical input rows, each value computed from the batch
    #: size, a different op sequence, each reduction over the batch that reaches a
    #: batched output. A baseline can accept only a blamed op and a path torch chose
    #: (:meth:`key`).
    causes: tuple[Finding, ...] = ()

    def key(self) -> tuple[str, str | None, str | None] | None:
        """The baseline key of a blamed op or of a path torch chose, else None.

        ``(op, device, dtype)`` for kind ``"op"``; ``("<op> -> <other op>",
        device, dtype)`` for kind ``"path"`` (the first ops that differ, full
        batch first).
        """
        if self.kind == "path" and self.op is not None and self.other_op is not None:
            return (f"{self.op} -> {self.other_op}", self.device, self.dtype)
        if self.kind != "op" or self.op is None:
            return None
        return (self.op, self.device, self.dtype)

    def describe(self) -> str:
        """A sentence for a failure message."""
        where = ", ".join(x for x in (self.device, self.dtype) if x)
        where = f" ({where})" if where else ""
        at = f" at {self.location.describe()}" if self.location is not None else ""
        if self.kind == "op":
            return (
                f"first batch-variant op: {self.op}{where}{at}: its output rows differ between "
                f"the full batch and {self.case} for identical input rows (op #{self.op_index} "
                "of the run)"
            )
        if self.kind == "mixed":
            module = ""
            if self.location is not None and self.location.module:
                module = f" in module `{self.location.module}` ({self.location.module_type})"
            if self.reason == ACROSS:
                return (
                    f"rows are mixed across the batch{module}: {self.op}{where}{at} reads the "
                    f"other rows (op #{self.op_index} of the run): run again with the rows "
                    f"outside {self.case} changed, its rows for {self.case} change too, so a "
                    "row's result depends on the other rows by the function's design; no "
                    "kernel is blamed"
                )
            # Named only for a batch-norm op: a mean over dim 0 in a lambda is no BatchNorm.
            norm = "; the batch statistics of BatchNorm" if "batch_norm" in str(self.op) else ""
            return (
                f"rows are mixed by a reduction over the batch{module}: {self.op}{where}{at} "
                f"computes a value over all the rows it is given (op #{self.op_index} of the "
                f"run{norm}), so a row's result "
                "depends on the other rows by the function's design; no kernel is blamed"
            )
        if self.kind == "random":
            return (
                f"{self.op}{where}{at} draws random numbers (op #{self.op_index} of the run): "
                "two runs on the same inputs give different values, and a row's values depend "
                f"on where it sits among the batch's draws, so they differ between the full "
                f"batch and {self.case} by the function's design (every run starts from the "
                "same generator state); no kernel is blamed. Check in eval mode, or draw per "
                "sample from a generator seeded by the row"
            )
        if self.kind == "nondeterministic":
            return (
                f"{self.op}{where}{at} gives different values from identical inputs from call "
                f"to call, with every generator in the same state (op #{self.op_index} of the "
                "run): it is nondeterministic (its kernel, or state outside the generators "
                f"such as a clock or a counter), so its rows differ between the full batch and "
                f"{self.case} whatever the batch; no batch-variant kernel is blamed. Check it "
                "with assert_reproducible or --backends-determinism"
            )
        if self.kind == "scalar":
            return (
                f"{self.op}{where}{at} got equal tensor inputs but {self.reason} between the "
                f"full batch and {self.case} (op #{self.op_index} of the run): a value "
                "computed from the batch size, or from state that changes from call to call "
                "(a counter, an attribute the function sets); no kernel is blamed"
            )
        if self.kind == "path":
            key = self.key()
            return (
                f"the full batch and {self.case} ran different ops from op #{self.op_index} on "
                f"(full batch: {self.op}, sub-batch: {self.other_op}){at}, called from the same "
                "line in both runs: torch chose other ops for another batch size (no branch in "
                "the calling code), so the rows may differ in their last bits; a batch baseline "
                f"can accept it as `{key[0] if key else self.op}`{where}"
            )
        if self.kind == "sequence":
            return (
                f"the full batch and {self.case} ran different ops from op #{self.op_index} on "
                f"(full batch: {self.op}, sub-batch: {self.other_op}){at}: the code takes another "
                "path for another batch size"
            )
        return f"no op located: {self.reason}"
