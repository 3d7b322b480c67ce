"""``make demo`` shows the product: the planted problems are found, and nothing else fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "demo" / "run_demo.py"


def test_demo_reports_exactly_its_planted_problems(tmp_path: Path) -> None:
    if not DEMO.is_file():
        pytest.skip(f"no demo at {DEMO}")
    proc = subprocess.run(
        [sys.executable, str(DEMO), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "UNEXPECTED" not in out and "demo OK" in out
    assert "mkldnn.enabled: True -> False" in out
    assert "nondeterministic op demo::jitter" in out
    census = json.loads((tmp_path / "out" / "census.json").read_text())
    assert [e["op"] for e in census["entries"] if e["verdict"] == "nondeterministic"] == [
        "demo::jitter"
    ]
