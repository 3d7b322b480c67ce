"""Sphinx configuration for the pytest-backends documentation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

project = "pytest-backends"
author = "pytest-backends contributors"
copyright = "2026, pytest-backends contributors"
extensions = ["sphinx.ext.autodoc"]
html_theme = "alabaster"
exclude_patterns = ["_build"]
nitpicky = False


def feature_table_lines() -> list[str]:
    """The feature table as reST: ``pytest_backends.plugin.FEATURES``, in registration order."""
    from pytest_backends.plugin import FEATURES

    lines = [".. list-table::", "   :header-rows: 1", ""]
    lines += ["   * - order", "     - feature module", "     - what it is"]
    for number, feature in enumerate(FEATURES, 1):
        name = feature.__name__.removeprefix("pytest_backends.")
        summary = (feature.__doc__ or "").strip().splitlines()[0]
        lines += [f"   * - {number}", f"     - ``{name}``", f"     - {summary}"]
    return lines


class FeatureTable(SphinxDirective):
    """``.. backends-features::``: the feature table, generated from ``FEATURES``."""

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(
            StringList(feature_table_lines(), source="FEATURES"), self.content_offset, container
        )
        return container.children


def setup(app: Any) -> dict[str, Any]:
    """Register the generated feature table."""
    app.add_directive("backends-features", FeatureTable)
    return {"parallel_read_safe": True}
