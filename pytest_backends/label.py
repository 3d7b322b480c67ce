"""The job label: the name a report or census carries for the machine or CI job that wrote it.

``--backends-label=NAME`` (ini ``backends_label``) sets it; by default it is
built from the host name, the CPU capability torch dispatches to and the GPU
(``runner-7/AVX2/cpu``, ``gpu-box/AVX512/NVIDIA H100 80GB HBM3``).
``pytest-backends merge`` shows it for each source of a merged report or
census, so give each job of a CI matrix its own.
"""

from __future__ import annotations

import socket

import pytest

from pytest_backends import _options
from pytest_backends._keys import LABEL_KEY

__all__ = ["check_label", "configure", "default_label", "resolve"]


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


def configure(config: pytest.Config) -> None:
    """Resolve the explicit label once (command line over ini) into ``config.stash``."""
    raw = _options.lookup(config, "backends_label")
    explicit = raw.from_cli or raw.text != ""
    config.stash[LABEL_KEY] = check_label(raw.text, raw.source) if explicit else None


def default_label() -> str:
    """``host/CPU capability/GPU name`` of this process (imports torch)."""
    from pytest_backends.matrix.availability import probe

    avail = probe()
    host = socket.gethostname().split(".", 1)[0] or "localhost"
    gpu = avail.cuda_devices[0] if avail.cuda_devices else "cpu"
    return f"{host}/{avail.cpu_capability}/{gpu}"


def resolve(config: pytest.Config) -> str:
    """The label of this run: the explicit one, else :func:`default_label`."""
    explicit = config.stash.get(LABEL_KEY, None)
    return explicit if explicit is not None else default_label()
