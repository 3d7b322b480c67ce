"""Determinism sessions in pytester, under one recorder, and the verdicts they reach.

Shared by the proof-rule tests and the generated corpus.
"""

from __future__ import annotations

import json
import re

import pytest

from pytest_backends.determinism.record_native import native_module

RECORDERS = ["native", "python"]


def session(
    pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch, *args: str
) -> pytest.RunResult:
    """A pytest subprocess under ``recorder`` (skips the native one where it is not built)."""
    if recorder == "native":
        if native_module() is None:
            pytest.skip("the native extension is not built here")
        monkeypatch.delenv("PYTEST_BACKENDS_NATIVE", raising=False)
    else:
        monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", "off")
    return pytester.runpytest_subprocess("-p", "no:xdist", *args)


def verdicts(pytester: pytest.Pytester, name: str) -> tuple[dict[str, str], set[str], set[str]]:
    """Per test: "not checked" where the census says so; the blamed ops; the tests blamed in.

    Read from the census ``<name>.json`` in the pytester directory.
    """
    census = json.loads((pytester.path / f"{name}.json").read_text(encoding="utf-8"))
    found = {nodeid: "not checked" for nodeid in census["not_checked"]}
    blamed_ops, blamed_in = set(), set()
    for row in census["entries"]:
        tests = row.get("nondeterministic_in", [])
        if tests:
            blamed_ops.add(row["op"])
            blamed_in.update(tests)
    return found, blamed_ops, blamed_in


def outcomes(result: pytest.RunResult, found: dict[str, str]) -> dict[str, str]:
    """``found`` completed with each test's ``-rA`` outcome (PASSED, FAILED, ...)."""
    merged = dict(found)
    for line in result.stdout.lines:
        if line.startswith(("PASSED ", "FAILED ", "SKIPPED ", "XFAIL ", "ERROR ")):
            kind, nodeid = line.split()[:2]
            merged.setdefault(nodeid, kind)
    return merged


def checked_session(
    pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[pytest.RunResult, dict[str, str], set[str], set[str]]:
    """Every test checked over 3 runs under ``recorder``, the census in ``<recorder>.json``.

    ``args`` are further pytest arguments. Returns the run, each test's verdict
    (:func:`outcomes`), the blamed ops and the tests they were blamed in.
    """
    result = session(
        pytester,
        recorder,
        monkeypatch,
        "--backends-determinism-all",
        "--backends-determinism=3",
        f"--backends-census={recorder}.json",
        "-rA",
        *args,
    )
    found, blamed_ops, blamed_in = verdicts(pytester, recorder)
    return result, outcomes(result, found), blamed_ops, blamed_in


def unchecked(
    pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[pytest.RunResult, str, dict[str, str]]:
    """Every test checked over 3 runs under ``recorder``, the leak guard off.

    Returns the run, its output and, per "not checked" test (by function name),
    the reason given.
    """
    result = session(
        pytester,
        recorder,
        monkeypatch,
        "--backends-determinism=3",
        "--backends-determinism-all",
        "--backends-leaks=off",
        "-rA",
    )
    out = result.stdout.str()
    return result, out, dict(re.findall(r"not checked: \S+::(\w+): (.*)", out))
