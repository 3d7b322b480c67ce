"""The job label: the name a report or census carries for the machine or CI job that wrote it.

``--backends-label=NAME`` (ini ``backends_label``) sets it; by default it is
built from the host name, the CPU capability torch dispatches to and the GPU
(``runner-7/AVX2/cpu``, ``gpu-box/AVX512/NVIDIA H100 80GB HBM3``).
``pytest-backends merge`` shows it for each source of a merged report or
census, so give each job of a CI matrix its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_backends import _options, _shared

__all__ = ["SETTINGS_KEY", "Settings", "check_label", "plugins"]


_MAX_LENGTH = 200


def check_label(value: str, source: str) -> str:
    """``value`` stripped; a :class:`pytest.UsageError` when it is empty or not one short line."""
    text = value.strip()
    if not text:
        raise pytest.UsageError(f"{source}: expected a name for this job, got an empty value")
    if any(not ch.isprintable() for ch in text):
        raise pytest.UsageError(
            f"{source}: the label must be one line of printable characters, got {value!r}"
        )
    if len(text) > _MAX_LENGTH:
        raise pytest.UsageError(
            f"{source}: the label is {len(text)} characters long; use at most {_MAX_LENGTH}"
        )
    return text


@dataclass(frozen=True)
class Settings:
    """The label feature's settings: the label given explicitly, if any."""

    explicit: str | None = None

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Resolve ``--backends-label`` (command line over ini); checked here, before any test."""
        raw = _options.lookup(config, "backends_label")
        explicit = raw.from_cli or raw.text != ""
        return cls(check_label(raw.text, raw.source) if explicit else None)


#: Read across features (through :func:`pytest_backends._shared.explicit_label`).
SETTINGS_KEY = _shared.LABEL_KEY


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """None: the label is read by the reports and the census, which say it."""
    return []
