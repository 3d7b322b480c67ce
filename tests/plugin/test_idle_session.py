"""An idle session (no option, no marker) runs only the leak guard per test and imports little.

The budget below is what the plugin may cost a suite that asks it for
nothing: hook implementation calls per test into ``pytest_backends``
plugins, and the package modules imported by the end of the session.  The
architecture page (``docs/explanation/architecture.rst``) states the same
facts; the tests below hold the page to them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from idle_session import IdleSession, measure

#: Hook implementation calls into ``pytest_backends`` plugins per test, idle (4 while
#: the primitive-log call hook was registered in every session).
CALLS_PER_TEST = 3
#: The per-test hooks an idle session runs: the leak guard's, nothing else.
PER_TEST_HOOKS = {
    "pytest_backends.isolation.guard:pytest_runtest_protocol",
    "pytest_backends.isolation.guard:pytest_runtest_setup",
    "pytest_backends.isolation.guard:pytest_runtest_teardown",
}
#: At most this many ``pytest_backends`` modules are imported by an idle session:
#: 56 before the idle-run work and 52 after it, then the switch catalogue (four
#: flag modules) and the kernel-paths feature module joined the registry (58); the
#: batch, determinism and leak-guard settings then moved into leaves of their own,
#: so that no feature module and its hook layer import each other (61); the run count
#: moved out of the determinism API, which the options no longer import (59); the leak
#: guard's attribution of a fixture's teardown changes joined it (60); the row that
#: watches attributes set on the ``torch.backends`` modules joined the catalogue (61); the
#: native switch key, which reads some ninety C++ switches in one call for the fingerprint,
#: joined the flags package (62).
MODULE_BUDGET = 62
#: Modules an idle session must not import: the hook layers and data of features
#: nobody asked for.
NOT_IMPORTED = (
    "pytest_backends.batch.plugin",
    "pytest_backends.batch.census",
    "pytest_backends.batch.api",
    "pytest_backends.batch.locate",
    "pytest_backends.determinism.census",
    "pytest_backends.determinism.plugin",
    "pytest_backends.determinism.record",
    "pytest_backends.capability.controller",
    "pytest_backends.capability.worker",
    "pytest_backends.matrix.report",
    "pytest_backends.matrix.report_plugin",
    "pytest_backends.matrix.verify",
    "pytest_backends.tolerance",
    "pytest_backends.kernels",
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "architecture.rst"


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> IdleSession:
    return measure(tmp_path_factory.mktemp("idle"))


def test_idle_session_calls_only_the_leak_guard_per_test(idle: IdleSession) -> None:
    assert idle.tests == 4
    assert set(idle.per_test()) == PER_TEST_HOOKS, idle.calls
    per_test = sum(idle.per_test().values())
    assert per_test <= CALLS_PER_TEST, idle.calls


def test_idle_session_imports_within_the_module_budget(idle: IdleSession) -> None:
    assert len(idle.modules) <= MODULE_BUDGET, idle.modules
    imported = [
        m for m in NOT_IMPORTED if any(x == m or x.startswith(m + ".") for x in idle.modules)
    ]
    assert imported == []


def _per_test_section() -> str:
    """The text of the page's "The per-test path" section."""
    text = PAGE.read_text()
    start = text.index("The per-test path\n---")
    body = text[start:].split("\n", 2)[2]
    following = re.search(r"\n[^\n]+\n-{3,}\n", body)
    return body[: following.start()] if following else body


def test_the_page_names_the_per_test_hooks_of_an_idle_session(idle: IdleSession) -> None:
    section = _per_test_section()
    named = set(re.findall(r"``(pytest_runtest_\w+)``", section))
    assert named == {key.split(":")[1] for key in idle.per_test()}


def test_the_page_names_what_an_idle_session_does_not_import(idle: IdleSession) -> None:
    section = _per_test_section()
    named = set(re.findall(r"``(pytest_backends\.[\w.]+)``", section))
    assert named, "the page names the modules an idle session leaves unimported"
    assert named <= set(NOT_IMPORTED)
    assert not named & set(idle.modules)
    budget = re.search(r"at most (\d+)\s+of the package's modules", section)
    assert budget is not None and int(budget.group(1)) == MODULE_BUDGET
