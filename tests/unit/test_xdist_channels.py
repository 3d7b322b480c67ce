"""Each xdist channel name belongs to one module: two features never write one name."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import pytest_backends
from pytest_backends import _xdist


def test_every_module_imports_with_its_own_channel_names() -> None:
    for info in pkgutil.walk_packages(pytest_backends.__path__, "pytest_backends."):
        importlib.import_module(info.name)  # a name claimed twice raises here
    assert _xdist._CLAIMED["deselected"] == "pytest_backends.matrix.coverage"
    assert _xdist._CLAIMED["cpu_deselected_count"] == "pytest_backends.capability.plan"


def test_a_second_module_claiming_a_name_is_refused_by_name() -> None:
    code = compile("from pytest_backends import _xdist\n_xdist.channel('seed')", "<m>", "exec")
    with pytest.raises(RuntimeError, match=r"'seed' is claimed by both \S+settings and other\.mod"):
        exec(code, {"__name__": "other.mod"})
    exec(code, {"__name__": "pytest_backends.matrix.settings"})  # its own module again: fine
