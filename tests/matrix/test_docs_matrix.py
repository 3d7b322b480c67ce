"""The reference pages list every option, ini key, axis and value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.verify import PROMISES

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


def test_every_option_and_ini_key_is_documented(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--help")
    text = result.stdout.str()
    options = set(re.findall(r"(--backends-[a-z-]+)", text))
    ini = set(re.findall(r"^  (backends_[a-z_]+) \(", text, re.MULTILINE))
    assert "--backends-matrix" in options and "backends_matrix" in ini
    hidden: set[str] = set()
    page = (REFERENCE / "options.rst").read_text()
    missing = sorted(o for o in options - hidden if f"``{o}" not in page)
    missing += sorted(k for k in ini if f"``{k}``" not in page)
    assert not missing, f"document these in docs/reference/options.rst: {missing}"


def test_every_axis_value_and_promise_is_documented() -> None:
    page = (REFERENCE / "axes.rst").read_text()
    missing = [f"axis {a.name}" for a in builtin_registry() if f"``{a.name}``" not in page]
    missing += [
        f"{a.name}={v}" for a in builtin_registry() for v in a.value_names if f"``{v}``" not in page
    ]
    missing += [token for token in PROMISES if f"``{token}``" not in page]
    assert not missing, f"document these in docs/reference/axes.rst: {missing}"
