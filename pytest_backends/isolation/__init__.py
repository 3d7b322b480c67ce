"""Per-test isolation of torch backend flags, and the leak guard.

The reference is torch's state **the moment torch finished importing**: an
import hook takes that snapshot before any user code can change a flag, so
the guard works whoever imports torch (a test, a fixture, a conftest.py or a
test module), and a suite that never imports torch never pays for it.

From there the state is followed through the session:

* changes made while a ``conftest.py`` (or plugin) is imported or configured
  become the suite's baseline, listed after collection with the file that
  made them;
* changes made while a test module is imported belong to that module: they
  are applied around each of its own tests (as a module-scoped autouse fixture
  would) and undone for every other module's tests, whatever the collection
  order; they are reported once, as a warning naming the module;
* around every test the flags are compared before setup and after teardown; a
  test that leaves one changed is reported with ``before -> after`` and the
  state is put back.  A fixture owns what it changes for its scope and is
  reported, once, naming it, if the change outlives its teardown;
* changes made while no test runs (a stray thread, a hook) are reported before
  the next test, or at session end after the last one.

The package is split by job: :mod:`.feature` (settings and plugins),
:mod:`.watch` (the import-time snapshot and the baseline), :mod:`.guard` (the
hooks around each test), :mod:`.snapshot` (fingerprints and diffs of the flag
registry), :mod:`.modules` (flags set while test modules are imported),
:mod:`.threads` (threads that may change flags), :mod:`.findings` (what is
reported outside a test's own report, across xdist too), :mod:`.markers` (the
leak modes and ``@pytest.mark.backends_leaks``), :mod:`.first_use` (values
torch gives a switch itself on first use, adopted as the process's state),
:mod:`.xfail` (a leak in an xfail-marked test reported as an error) and
:mod:`.setter` (the ``backend_flags`` fixture's value).
"""

from __future__ import annotations

from pytest_backends.isolation.findings import BackendsLeakWarning
from pytest_backends.isolation.guard import IsolationPlugin
from pytest_backends.isolation.markers import LEAK_MODES, marker_mode, parse_leak_mode
from pytest_backends.isolation.setter import FlagSetter
from pytest_backends.isolation.settings import SETTINGS_KEY, Settings
from pytest_backends.isolation.watch import WATCH, TorchStateWatch, watch_torch

__all__ = [
    "LEAK_MODES",
    "SETTINGS_KEY",
    "WATCH",
    "BackendsLeakWarning",
    "FlagSetter",
    "IsolationPlugin",
    "Settings",
    "TorchStateWatch",
    "marker_mode",
    "parse_leak_mode",
    "watch_torch",
]
