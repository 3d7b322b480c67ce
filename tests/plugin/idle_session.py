"""Measure an idle session: no ``--backends-*`` option, no marker, a few trivial torch tests.

One real pytest run in a child process.  A conftest counts, through
``pluginmanager.add_hookcall_monitoring``, every call into a hook
implementation whose plugin lives in ``pytest_backends``, from the end of
collection to the start of ``pytest_sessionfinish``, and lists the package's
modules in ``sys.modules`` at session end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS = 4

_CONFTEST = """
import json, sys, types
from collections import Counter

CALLS = Counter()
ON = [False]


def _module(plugin):
    return plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__


def pytest_configure(config):
    def before(hook_name, impls, kwargs):
        if ON[0]:
            for impl in impls:
                module = _module(impl.plugin)
                if module.startswith("pytest_backends"):
                    CALLS[f"{module}:{hook_name}"] += 1

    config.pluginmanager.add_hookcall_monitoring(before, lambda *a: None)


def pytest_collection_finish(session):
    ON[0] = True


def pytest_sessionfinish(session):
    ON[0] = False
    modules = sorted(m for m in sys.modules if m.split(".")[0] == "pytest_backends")
    with open("idle.json", "w") as out:
        json.dump({"calls": CALLS, "tests": len(session.items), "modules": modules}, out)
"""

_TESTS = "import torch\n\n" + "\n".join(
    f"def test_{i}():\n    assert torch.backends.cudnn.enabled is not None\n" for i in range(TESTS)
)


@dataclass(frozen=True)
class IdleSession:
    """What one idle session did: hook calls by ``module:hook``, and modules imported."""

    calls: dict[str, int]
    tests: int
    modules: list[str]

    def per_test(self) -> dict[str, float]:
        """Calls per test, for each ``module:hook`` called more than once a session."""
        return {k: v / self.tests for k, v in self.calls.items() if v >= self.tests}


def measure(root: Path) -> IdleSession:
    """Run the idle session in ``root`` and return what it measured."""
    (root / "conftest.py").write_text(_CONFTEST)
    (root / "test_idle.py").write_text(_TESTS)
    (root / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            *("-p", "no:randomly", "-p", "no:cacheprovider"),
            *("-p", "no:xdist", "-W", "ignore::pytest.PytestAssertRewriteWarning"),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((root / "idle.json").read_text())
    return IdleSession(dict(data["calls"]), int(data["tests"]), list(data["modules"]))
