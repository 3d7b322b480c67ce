"""The reference documents every flag the registry knows."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_backends.flags import registry

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_registry_row_is_documented() -> None:
    text = (DOCS / "reference" / "flags.rst").read_text()
    text += (DOCS / "reference" / "switches.rst").read_text()
    reg = registry()
    names = [row.name for row in reg.rows] + [
        name for name in reg.absent if "cufft_plan_cache" not in name
    ]
    # a row per CUDA device (cuda.cufft_plan_cache[0].max_size) is documented once, as [N]
    names = [re.sub(r"\[\d+\]", "[N]", name) for name in names]
    missing = [name for name in names if f"``{name}``" not in text]
    assert not missing, f"add these flags to docs/reference/flags.rst: {missing}"


def test_guarantees_page_names_real_tests() -> None:
    import ast
    import re

    root = DOCS.parent
    text = (DOCS / "explanation" / "guarantees.rst").read_text()
    refs = re.findall(r"``(tests/[\w/]+\.py)::(\w+)``", text)
    assert len(refs) >= 25
    for path, name in refs:
        tree = ast.parse((root / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"{path}::{name} is named in guarantees.rst but does not exist"
