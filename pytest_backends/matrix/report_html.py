"""The matrix report's HTML page: the run's verdict, the grid, failures, skips, sources.

:func:`render_html` renders the results that :mod:`pytest_backends.matrix.report`
reads from test reports, for a run (``--backends-report-html``) and for
``pytest-backends merge``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_backends import _files
from pytest_backends.matrix.report import (
    FAILING,
    NOT_EXERCISED,
    OUTCOMES,
    ConfigRow,
    Result,
    RunSummary,
    grid_cell,
    grid_columns,
)

__all__ = ["printable", "render_html"]

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.env{color:#555;font-size:12px;margin:0} table{border-collapse:collapse}
th,td{border:1px solid #ddd;padding:4px 8px} th{background:#f6f6f6;font-weight:600}
.summary td{text-align:right} .summary td:first-child{text-align:left;font-family:monospace}
.grid th.test{text-align:left;font-family:monospace;font-weight:normal;white-space:nowrap}
.grid thead th{font-family:monospace;font-size:12px;vertical-align:bottom}
.grid td{text-align:center;min-width:32px;font-weight:700}
.passed{background:#c8f0c8;color:#185c18} .failed{background:#f7b5b5;color:#8a1010}
.error{background:#e07070;color:#fff} .skipped{background:#eee;color:#888}
.xfailed{background:#fbe7a9;color:#7a5b00} .xpassed{background:#f9c98a;color:#7a3d00}
.conflict{background:#c9a6f0;color:#3d136e}
.interrupted{background:#444;color:#fff}
.run{font-size:15px;font-weight:600;padding:6px 10px;margin:8px 0;border-radius:3px}
.run.ok{background:#c8f0c8;color:#185c18} .run.bad{background:#e07070;color:#fff}
.src{font-size:9px;font-weight:normal;vertical-align:super;margin-left:1px}
.list td{text-align:left;vertical-align:top} .list td.id{font-family:monospace;white-space:nowrap}
.list td.msg{font-family:monospace;white-space:pre-wrap}
.absent{background:#fff} .unexercised{box-shadow:inset 0 0 0 3px #f0a020}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border:1px solid #ddd}
.crash{display:block;font-size:9px;font-weight:normal} .crashed{outline:2px solid #8a1010}
pre.detail{margin:4px 0 0;white-space:pre-wrap}
pre.warning{background:#fbe7a9;color:#5c4300;padding:6px 10px;white-space:pre-wrap}
"""
_SYMBOL = {
    "passed": "✓",
    "failed": "✗",
    "error": "E",
    "skipped": "–",
    "xfailed": "x",
    "xpassed": "X",
    "interrupted": "!",
    "conflict": "≠",
}


def render_html(
    rows: Sequence[ConfigRow],
    results: Sequence[Result],
    *,
    environment: Sequence[str],
    verify: bool,
    sources: Sequence[Mapping[str, Any]] = (),
    session: RunSummary | None = None,
    warnings: Sequence[str] = (),
    errors: Sequence[str] = (),
) -> str:
    """A self-contained HTML page: the summary, a tests x configs grid, failures and skips.

    ``sources`` (a merged report's inputs, each with a ``label``) adds a
    table of sources and, on every cell, a badge naming the source it came from.
    ``session`` puts pytest's verdict (closing line and exit status) at the
    top and its problems outside the matrix (unmarked tests, collection
    errors, teardown errors) in the failures. ``warnings`` (a merge's: tests
    that ran in no job, mixed versions) are listed under it; ``errors`` (a
    ``merge --strict`` that failed) above them, marked as failing.
    """
    esc = html.escape
    columns = grid_columns(rows, verify)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="generator" content="{_files.HTML_GENERATOR}">',
        "<title>pytest-backends matrix</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Backend matrix</h1>",
    ]
    out += [f'<p class="env">{esc(line)}</p>' for line in environment]
    if session is not None:
        ok = session.exitstatus == 0 and not session.interrupted
        what = "interrupted, " if session.interrupted else ""
        out.append(
            f'<p class="run {"ok" if ok else "bad"}" id="run">pytest: '
            f"{esc(session.closing_line())} &mdash; {what}exit status "
            f"{session.exitstatus} ({esc(session.exit)})</p>"
        )
    out += [f'<p class="run bad" id="merge-failed">{esc(text)}</p>' for text in errors]
    if warnings:
        out.append(f'<h2 id="warnings">Warnings ({len(warnings)})</h2>')
        out += [f'<pre class="warning">{esc(text)}</pre>' for text in warnings]
    badges = {str(src.get("label")): str(i) for i, src in enumerate(sources, 1)}
    merged = len(sources) > 1
    summary = ['<h2>Configurations</h2><table class="summary"><thead><tr><th>config</th>']
    summary += [f"<th>{esc(c)}</th>" for c in columns]
    summary.append("</tr></thead><tbody>")
    for row in rows:
        summary.append(
            f"<tr><td>{esc(row.config)}</td>"
            + "".join(f"<td>{grid_cell(row, c)}</td>" for c in columns)
            + "</tr>"
        )
    totals = "".join(f"<td>{sum(grid_cell(r, c) for r in rows)}</td>" for c in columns)
    summary.append(f"<tr><th>total</th>{totals}</tr></tbody></table>")
    if not merged:
        out += summary

    configs = [row.config for row in rows]
    by_test: dict[str, dict[str, Result]] = {}
    for result in sorted(results, key=lambda r: r.nodeid):
        by_test.setdefault(result.test, {})[result.config] = result
    out.append("<h2>Tests &times; configurations</h2>")
    out.append(
        '<p class="legend">'
        + "".join(f'<span class="{o}">{_SYMBOL[o]} {o}</span>' for o in OUTCOMES)
        + '<span class="unexercised">orange frame: not exercised</span>'
        + (
            ' small numbers: the source (<a href="#sources">Sources</a>, below)'
            if len(sources) > 1
            else ""
        )
        + "</p>"
    )
    out.append('<table class="grid"><thead><tr><th>test</th>')
    out += ["<th>" + "<br>".join(esc(t) for t in c.split(",")) + "</th>" for c in configs]
    out.append("</tr></thead><tbody>")
    for test in sorted(by_test):
        cells = []
        for config in configs:
            cell = by_test[test].get(config)
            if cell is None:
                cells.append('<td class="absent"></td>')
                continue
            classes = cell.outcome + (" unexercised" if cell.verify == NOT_EXERCISED else "")
            classes += " crashed" if cell.crashed else ""
            title = f"{cell.nodeid}\n{cell.outcome}" + (" (crashed)" if cell.crashed else "")
            for extra in (cell.message, cell.verify_detail):
                if extra:
                    title += f"\n{extra}"
            badge = ""
            if len(sources) > 1 and cell.sources:
                title += "\nfrom " + ", ".join(cell.sources)
                marks = ",".join(badges.get(label, "?") for label in cell.sources)
                badge = f'<span class="src">{esc(marks)}</span>'
            crash = ""
            if cell.crashed:
                found = re.search(r"signal (\w+)", cell.message)
                crash = (
                    f'<span class="crash">crashed{" " + esc(found.group(1)) if found else ""}'
                    f"<br>{esc(cell.config)}</span>"
                )
            cells.append(
                f'<td class="{esc(classes)}" title="{esc(title)}">'
                f"{_SYMBOL.get(cell.outcome, '?')}{crash}{badge}</td>"
            )
        out.append(f'<tr><th class="test">{esc(test)}</th>{"".join(cells)}</tr>')
    out.append("</tbody></table>")
    out += _html_failures(results, merged=merged, session=session)
    if merged:
        # A merged page starts with the grid and the failures; what was merged comes after.
        out += summary
        out += _html_sources(sources)
    out += _html_skips(rows, results)
    out.append("</body></html>")
    return printable("\n".join(out) + "\n")


def printable(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates from ``os.fsdecode``) escaped.

    Any text pytest can print survives: ``\udcff`` is written as those six characters.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _html_sources(sources: Sequence[Mapping[str, Any]]) -> list[str]:
    esc = html.escape
    out = [
        '<h2 id="sources">Sources</h2><table class="list"><thead><tr><th>#</th><th>label</th>'
        "<th>file</th><th>tests</th><th>environment</th></tr></thead><tbody>"
    ]
    for i, src in enumerate(sources, 1):
        env = "<br>".join(esc(str(line)) for line in src.get("environment") or ())
        out.append(
            f"<tr><td>{i}</td><td>{esc(str(src.get('label')))}</td>"
            f'<td class="id">{esc(str(src.get("file")))}</td>'
            f"<td>{esc(str(src.get('tests', '')))}</td><td>{env}</td></tr>"
        )
    out.append("</tbody></table>")
    return out


def _outside(results: Sequence[Result], session: RunSummary | None) -> list[Result]:
    """The session's problems that no failing matrix cell shows, as rows of the failure list."""
    if session is None:
        return []
    shown = {(r.nodeid, s) for r in results if r.outcome in FAILING for s in r.sources or [""]}
    shown_any = {r.nodeid for r in results if r.outcome in FAILING}
    out = []
    for p in session.problems:
        source = p.get("source")
        if (p["nodeid"], source) in shown or (source is None and p["nodeid"] in shown_any):
            continue
        when = p.get("when", "")
        where = {"collect": "collection", "???": "worker crash"}.get(when, when)
        out.append(
            Result(
                p["nodeid"],
                p["nodeid"],
                p.get("config") or "(no backend config)",
                outcome=p.get("outcome", "failed"),
                message=(f"[{where}] " if where else "") + p.get("message", ""),
                sources=[source] if source else [],
                detail=p.get("detail", ""),
            )
        )
    return out


def _html_failures(
    results: Sequence[Result], merged: bool, session: RunSummary | None = None
) -> list[str]:
    esc = html.escape
    failing = sorted(
        [*(r for r in results if r.outcome in FAILING), *_outside(results, session)],
        key=lambda r: (r.test, r.config),
    )
    out = [f'<h2 id="failures">Failures ({len(failing)})</h2>']
    if not failing:
        return [*out, "<p>none</p>"]
    out.append(
        '<table class="list failures"><thead><tr><th>test</th><th>config</th>'
        "<th>outcome</th><th>message</th>"
        + ("<th>source</th>" if merged else "")
        + "</tr></thead><tbody>"
    )
    for r in failing:
        source = f"<td>{esc(', '.join(r.sources))}</td>" if merged else ""
        message = esc(r.message)
        if r.detail and r.detail.strip() != r.message.strip():
            # Folded, not cut: the first line shows, the whole text unfolds.
            message = (
                f"<details><summary>{message}</summary>"
                f'<pre class="detail">{esc(r.detail)}</pre></details>'
            )
        out.append(
            f'<tr><td class="id">{esc(r.test)}</td><td class="id">{esc(r.config)}</td>'
            f'<td class="{esc(r.outcome)}">{esc(r.outcome)}</td>'
            f'<td class="msg">{message}</td>{source}</tr>'
        )
    out.append("</tbody></table>")
    return out


def _html_skips(rows: Sequence[ConfigRow], results: Sequence[Result]) -> list[str]:
    esc = html.escape
    counts: dict[tuple[str, str], int] = {}
    for r in results:
        if r.outcome == "skipped":
            counts[(r.config, r.message)] = counts.get((r.config, r.message), 0) + 1
    out = ['<h2 id="skips">Skip reasons per configuration</h2>']
    if not counts:
        return [*out, "<p>none</p>"]
    out.append(
        '<table class="list skips"><thead><tr><th>config</th><th>tests</th>'
        "<th>reason</th></tr></thead><tbody>"
    )
    order = {row.config: i for i, row in enumerate(rows)}
    for (config, reason), n in sorted(
        counts.items(), key=lambda kv: (order.get(kv[0][0], 1 << 30), kv[0])
    ):
        out.append(
            f'<tr><td class="id">{esc(config)}</td><td>{n}</td>'
            f'<td class="msg">{esc(reason)}</td></tr>'
        )
    out.append("</tbody></table>")
    return out
