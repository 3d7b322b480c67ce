"""Per-op traces as a feature: ``--backends-trace=DIR`` and the plugin that writes them.

Importing this module never imports torch.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_backends import _options
from pytest_backends._shared import CONFIG_KEY

__all__ = ["SETTINGS_KEY", "Settings", "plugins"]


@dataclass(frozen=True)
class Settings:
    """The resolved trace option: the directory, or ``None`` when off."""

    trace_dir: Path | None = None

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Resolve ``--backends-trace`` once."""
        raw = _options.lookup(config, "backends_trace")
        text = str(raw.text).strip()
        if not text:
            if raw.from_cli:
                raise pytest.UsageError("--backends-trace: expected a directory, got ''")
            return cls()
        base = Path(config.invocation_params.dir) if raw.from_cli else config.rootpath
        path = base / text
        if path.exists() and not path.is_dir():
            raise pytest.UsageError(f"--backends-trace: {path} exists and is not a directory")
        return cls(path)


#: Where the registrar stores the :class:`Settings`.
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()


class TracePlugin:
    """Records the call phase of every marked test into a trace file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Trace the test body of a ``@pytest.mark.backends`` test."""
        if item.get_closest_marker("backends") is None:
            return (yield)
        from pytest_backends.paths.trace import header, trace_file, tracing

        config = item.stash.get(CONFIG_KEY, None)
        config_id = config.id if config is not None else "default"
        flags = dict(config.flags) if config is not None else {}
        device = str(getattr(config, "device", "cpu")) if config is not None else "cpu"
        path = trace_file(self.root, item.nodeid, config_id)
        with tracing(path, header(config_id, flags, device, item.nodeid)):
            return (yield)


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The trace writer when ``--backends-trace`` is given."""
    if settings.trace_dir is None:
        return []
    return [(TracePlugin(settings.trace_dir), "backends-trace")]
