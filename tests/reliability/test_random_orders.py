"""Random test orders give no leak reports and the same outcomes.

CI runs a short version (three seeds over examples/ with the backend matrix and
the flag-registry tests); ``benchmarks/random_orders.py`` runs 20 seeds over
the whole suite, see docs/explanation/guarantees.rst.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _soak_module() -> object:
    spec = importlib.util.spec_from_file_location(
        "random_orders", ROOT / "benchmarks" / "random_orders.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_three_random_orders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    soak = _soak_module()
    monkeypatch.chdir(ROOT)
    out = tmp_path / "orders.txt"
    code = soak.main(
        [  # type: ignore[attr-defined]
            "--seeds",
            "3",
            "--first-seed",
            "11",
            "--output",
            str(out),
            "examples",
            "tests/unit/test_flags.py",
            "--",
            "--backends-matrix",
            "-p",
            "no:xdist",
        ]
    )
    text = out.read_text()
    assert code == 0, text
    assert "0 leak reports, 0 tests with differing outcomes" in text
    assert text.count(" tests, 0 leak reports") == 3
