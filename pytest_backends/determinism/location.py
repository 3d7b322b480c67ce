"""Where an op was called from: what the locator finds and every message names.

A leaf: the comparison (:mod:`.compare`) holds locations, the locator
(:mod:`.locate`) makes them, the verdict (:mod:`.verdict`) writes them out.

Importing this module imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Location"]


@dataclass(frozen=True)
class Location:
    """Where an op was called from: the innermost frame outside torch and this plugin.

    ``module`` is the ``nn.Module`` path (``"layers.0.self_attn"``) and
    ``module_type`` its class name, when the op ran inside a module's
    ``forward``. For a backward op, ``forward`` is the location of the forward
    op it differentiates and ``forward_op`` that op's name.
    """

    file: str
    line: int
    function: str
    module: str | None = None
    module_type: str | None = None
    forward_op: str | None = None
    forward: Location | None = None

    def describe(self) -> str:
        """``"test_x.py:12 in test_fn, module layers.0 (Linear)"``."""
        text = f"{self.file}:{self.line} in {self.function}"
        if self.module:
            text += f", module {self.module} ({self.module_type})"
        elif self.module is not None:
            text += f", module {self.module_type} (outermost)"
        if self.forward is not None:
            text += f"; backward of {self.forward_op} called at {self.forward.describe()}"
        return text
