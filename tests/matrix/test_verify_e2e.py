"""--backends-verify and the matrix report, end to end."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from html.parser import HTMLParser

import pytest

# Imported before any pytester snapshot (see test_matrix_e2e.py).
import torch  # noqa: F401

Run = Callable[..., pytest.RunResult]

CONV_TESTS = """
    import pytest
    import torch
    import torch.nn.functional as F

    def conv(shape):
        x = torch.randn(*shape)
        return F.conv2d(x, torch.randn(shape[1], shape[1], 3, 3), padding=1)

    @pytest.mark.backends(mkldnn="off")
    def test_planted():
        # re-enables oneDNN inside the config (and restores it: no leak to catch)
        with torch.backends.mkldnn.flags(enabled=True):
            conv((8, 16, 32, 32))

    @pytest.mark.backends(mkldnn="off")
    def test_honest():
        conv((8, 16, 32, 32))

    @pytest.mark.backends(mkldnn="on")
    def test_small_conv():
        conv((1, 3, 8, 8))

    @pytest.mark.backends(mkldnn="on")
    def test_big_conv():
        conv((8, 16, 32, 32))

    @pytest.mark.backends(sdpa=["math", "flash"])
    def test_sdpa():
        q = torch.randn(1, 2, 4, 8)
        F.scaled_dot_product_attention(q, q, q)
"""


class _Grid(HTMLParser):
    """Reads the HTML summary table back into {config: [cells]}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_summary = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._in_summary = ("class", "summary") in attrs
        elif tag == "tr" and self._in_summary:
            self.rows.append([])
        elif tag in ("td", "th") and self._in_summary:
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._in_summary = False


def _terminal_grid(result: pytest.RunResult) -> dict[str, list[int]]:
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if re.match(r"=+ backends matrix =+$", line))
    start += 2
    grid = {}
    for line in lines[start:]:
        if not line.strip():
            break
        name, *counts = re.split(r"\s{2,}", line.strip())
        grid[name] = [int(c) for c in counts]
    return grid


def test_verify_catches_the_planted_mismatch_and_reports_agree(
    pytester: pytest.Pytester, run: Run
) -> None:
    pytester.makepyfile(test_paths=CONV_TESTS)
    result = run(
        "--backends-matrix",
        "--backends-verify",
        "--backends-report=out/r.json",
        "--backends-html=out/r.html",
        "-rf",
    )
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_planted[[]mkldnn-off] _*",
            "backends-verify: mkldnn-off promised no oneDNN kernels, but oneDNN ran * "
            "(convolution, f32) for aten::mkldnn_convolution. The flags of mkldnn-off were set "
            "around the test*",
            "FAILED test_paths.py::test_planted[[]mkldnn-off] - *",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "not exercised (*",
            "  mkldnn-on",
            "    test_paths.py::test_small_conv[[]mkldnn-on]: mkldnn-on not exercised: no oneDNN "
            "primitive computed an op of the test; aten::_slow_conv2d_forward ran for input "
            "(1, 3, 8, 8)",
        ]
    )
    grid = _terminal_grid(result)
    assert grid == {
        "mkldnn-on": [2, 0, 0, 1],
        "mkldnn-off": [1, 1, 0, 0],
        "sdpa-math": [1, 0, 0, 0],
        "sdpa-flash": [1, 0, 0, 0],
        "total": [5, 1, 0, 1],
    }

    data = json.loads((pytester.path / "out" / "r.json").read_text())
    from_json = {
        c["id"]: [
            c["counts"]["passed"],
            c["counts"]["failed"],
            c["counts"]["skipped"],
            c["not_exercised"],
        ]
        for c in data["configs"]
    }
    assert from_json == {k: v for k, v in grid.items() if k != "total"}
    verdicts = {t["nodeid"].split("::")[1]: t["verify"] for t in data["tests"]}
    assert verdicts["test_big_conv[mkldnn-on]"] == "ok"
    assert verdicts["test_small_conv[mkldnn-on]"] == "not exercised"
    assert verdicts["test_planted[mkldnn-off]"] == "broken"

    parser = _Grid()
    parser.feed((pytester.path / "out" / "r.html").read_text())
    header, *body = parser.rows
    assert header == ["config", "passed", "failed", "skipped", "not exercised"]
    assert {row[0]: [int(c) for c in row[1:]] for row in body} == grid


def test_strict_mode_fails_unexercised_promises(pytester: pytest.Pytester, run: Run) -> None:
    pytester.makepyfile(test_paths=CONV_TESTS)
    result = run("--backends-matrix", "--backends-verify=strict", "-k", "small or big", "-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_small_conv[[]mkldnn-on] _*",
            "backends-verify=strict: mkldnn-on not exercised: no oneDNN primitive computed an op "
            "of the test; aten::_slow_conv2d_forward ran for input (1, 3, 8, 8)",
        ]
    )


def test_a_test_with_its_own_profiler_is_judged_by_the_primitive_log(
    pytester: pytest.Pytester, run: Run
) -> None:
    pytester.makepyfile(
        test_own="""
        import pytest
        import torch
        import torch.nn.functional as F
        from torch.profiler import ProfilerActivity, profile

        @pytest.mark.backends(mkldnn="on")
        def test_profiles_itself():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                F.conv2d(torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3))
            assert "aten::mkldnn_convolution" in {e.name for e in prof.events()}
    """
    )
    result = run("--backends-matrix", "--backends-verify=strict", "--junitxml=j.xml")
    result.assert_outcomes(passed=1)
    xml = (pytester.path / "j.xml").read_text()
    # the test's profiler takes the op recording over, but oneDNN's log still
    # shows that a primitive computed the convolution
    assert 'name="backends_verify" value="ok"' in xml
    assert "(convolution, f32)" in xml
