"""The flags as the model reads them (the running state under an overlay), and the
record of the path a bound was derived along."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_backends.flags import registry
from pytest_backends.tolerance.model import BF16_U, TF32_U


class FlagView:
    """Reads single flags from the registry, with an optional overlay.

    The precision getters report *effective* values (a leaf set to "none"
    reads what it inherits).  An overlaid parent therefore also changes a
    leaf that reads the same as its parent does now, the rule the registry
    uses when it restores.
    """

    def __init__(self, overlay: Mapping[str, object] | None) -> None:
        self._reg = registry()
        self._overlay = dict(self._reg.validate(overlay)) if overlay else {}

    @property
    def overlay(self) -> dict[str, object]:
        """The overlaid (validated) flag values."""
        return dict(self._overlay)

    def _active(self, name: str) -> object:
        row = self._reg.by_name.get(name)
        if row is None:
            return None
        try:
            return row.plain(row.read())
        except RuntimeError:  # legacy getters can raise after the new API was used
            return None

    def get(self, name: str) -> object:
        if name in self._overlay:
            value = self._overlay[name]
            if value == "none":
                return self._parent_value(name)
            return value
        active = self._active(name)
        row = self._reg.by_name.get(name)
        if (
            row is not None
            and row.parent is not None
            and self._touches_ancestor(name)
            and active == self._active(row.parent)
        ):
            return self.get(row.parent)
        return active

    def _parent_value(self, name: str) -> object:
        row = self._reg.by_name.get(name)
        return self.get(row.parent) if row is not None and row.parent else "none"

    def _touches_ancestor(self, name: str) -> bool:
        row = self._reg.by_name.get(name)
        while row is not None and row.parent is not None:
            if row.parent in self._overlay:
                return True
            row = self._reg.by_name.get(row.parent)
        return False

    def exists(self, name: str) -> bool:
        return name in self._reg.by_name


@dataclass
class PrecisionPath:
    """The unit roundoffs of one computation, and what decided them."""

    u_out: float
    u_acc: float
    u_in: float = 0.0
    u_red: float = 0.0
    #: attention probabilities rounded before P @ V (fused fp16/bf16 SDPA kernels)
    u_prob: float = 0.0
    #: a recurrent cell's state rounded each step (fp16/bf16 RNN, LSTM, GRU)
    u_cell: float = 0.0
    consulted: dict[str, object] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def note(self, name: str, value: object) -> None:
        self.consulted.setdefault(name, value)

    def say(self, line: str) -> None:
        self.lines.append(line)


def precision_u(value: object) -> tuple[float, str] | None:
    if value == "bf16":
        return BF16_U, "bf16"
    if value == "tf32":
        return TF32_U, "tf32"
    return None
