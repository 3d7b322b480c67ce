"""The one channel between a pytest-xdist controller and its workers.

Every feature that carries data across processes goes through here: the
controller hands a worker plain data when the node starts
(:func:`send`, from ``pytest_configure_node``), the worker reads it
(:func:`received`), the worker leaves plain data for the controller at the
end of its session (:func:`put`), and the controller collects it per node
(:func:`collected`, from ``pytest_testnodedown``).  Names are prefixed with
``backends_`` so that they never meet another plugin's, and each is claimed by
one module (:func:`channel`), so that two of the plugin's features never
write one name.  Verdicts about one
test do not travel here: they are report properties (:mod:`pytest_backends._shared`).
This module imports neither torch nor xdist.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = [
    "channel",
    "collected",
    "is_controller",
    "is_worker",
    "node_id",
    "put",
    "received",
    "send",
    "worker_id",
]

_PREFIX = "backends_"
# channel name -> the module that claimed it
_CLAIMED: dict[str, str] = {}


def channel(name: str) -> str:
    """Claim ``name`` for the calling module's data; returns it.

    A second module claiming the same name is an error when it is imported: two
    features writing one name would read each other's data (a count where a list
    is expected).
    """
    import sys

    owner = str(sys._getframe(1).f_globals.get("__name__", "?"))
    claimed = _CLAIMED.setdefault(name, owner)
    if claimed != owner:
        raise RuntimeError(
            f"pytest-backends: the xdist channel {name!r} is claimed by both {claimed} and {owner}"
        )
    return name


def is_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker."""
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist controller (``-n``/``--dist``, not a worker).

    Read after ``pytest_cmdline_main``, where pytest-xdist turns ``-n N`` into a
    distribution mode.
    """
    return not is_worker(config) and getattr(config.option, "dist", "no") != "no"


def worker_id(config: pytest.Config) -> str | None:
    """This worker's id (``gw0``), or None in a controller or a run without xdist."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput.get("workerid", "gw"))


def send(node: Any, name: str, value: Any) -> None:
    """Controller: hand ``value`` (plain data) to the worker ``node`` as ``name``."""
    node.workerinput[_PREFIX + name] = value


def received(config: pytest.Config, name: str, default: Any = None) -> Any:
    """Worker: the value the controller sent as ``name`` (``default`` if none, or not a worker)."""
    workerinput = getattr(config, "workerinput", None)
    if not isinstance(workerinput, dict):
        return default
    return workerinput.get(_PREFIX + name, default)


def put(config: pytest.Config, name: str, value: Any) -> bool:
    """Worker: leave ``value`` (plain data) for the controller as ``name``.

    Returns False, and does nothing, outside a worker.
    """
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is None:
        return False
    workeroutput[_PREFIX + name] = value
    return True


def collected(node: Any, name: str, default: Any = None) -> Any:
    """Controller: what the worker ``node`` left as ``name`` (``default`` if nothing)."""
    output = getattr(node, "workeroutput", None) or {}
    return output.get(_PREFIX + name, default)


def node_id(node: Any) -> str:
    """The worker id of ``node`` (``gw0``) as the controller knows it."""
    return str(getattr(node, "workerinput", {}).get("workerid", "worker"))
