"""The value of the ``backend_flags`` fixture: set flags in a test, restored at teardown."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_backends.isolation.snapshot import registry

__all__ = ["FlagSetter"]


@dataclass
class FlagSetter:
    """The value of the ``backend_flags`` fixture: set flags, restored at teardown."""

    _before: dict[str, object] | None = field(default=None, repr=False)
    _start: dict[str, object] | None = field(default=None, repr=False)

    def begin(self) -> None:
        """The fixture is set up: the state teardown puts back once a flag was set."""
        self._start = registry().snapshot()

    def set(self, mapping: Mapping[str, object]) -> None:
        """Validate and apply ``mapping``; raises ``ValueError`` and changes nothing if invalid."""
        reg = registry()
        normalised = reg.validate(mapping)
        before = reg.snapshot()
        if self._before is None:
            # The state when the fixture was set up, not at this call: a call made
            # inside override_flags() would otherwise keep that block's values.
            self._before = self._start if self._start is not None else before
        try:
            reg.apply(normalised)
        except ValueError:
            reg.restore(before)
            raise

    def get(self, name: str) -> object:
        """The current plain value of one flag."""
        reg = registry()
        if name not in reg.by_name:
            reg.validate({name: None})
        row = reg.by_name[name]
        return row.plain(row.read())

    def snapshot(self) -> dict[str, object]:
        """All flags as plain values."""
        return dict(registry().snapshot())

    def close(self) -> None:
        """Restore the state from when the fixture was set up, if :meth:`set` was called."""
        if self._before is not None:
            before, self._before = self._before, None
            registry().restore(before)
