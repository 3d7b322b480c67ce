"""Sphinx configuration for the pytest-backends documentation."""

project = "pytest-backends"
author = "pytest-backends contributors"
copyright = "2026, pytest-backends contributors"
extensions = ["sphinx.ext.autodoc"]
html_theme = "alabaster"
exclude_patterns = ["_build"]
nitpicky = False
