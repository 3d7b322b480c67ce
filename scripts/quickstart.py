#!/usr/bin/env python3
"""Print the commands of README.md's Quick start block, one a line, as written.

``.ci/run`` runs exactly these lines and ``tests/packaging/test_demo.py`` reads
them with the same function, so the README, CI and the tests cannot drift.
Standard library only: it runs before any virtualenv exists.

    python3 scripts/quickstart.py [README.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart_commands(text: str) -> list[str]:
    """The commands of the first ``console`` block under ``## Quick start``, comments cut."""
    lines = text.splitlines()
    try:
        start = lines.index("## Quick start")
    except ValueError:
        raise SystemExit("README.md has no '## Quick start' section") from None
    commands: list[str] = []
    inside = False
    for line in lines[start + 1 :]:
        if not inside and line.startswith("## "):
            break
        if line.strip() == "```console":
            inside = True
        elif inside and line.strip() == "```":
            break
        elif inside and line.split("#", 1)[0].strip():
            commands.append(line.split("#", 1)[0].strip())
    if not commands:
        raise SystemExit("README.md's Quick start section has no console block with commands")
    return commands


def main(argv: list[str]) -> int:
    """Print the commands; the optional argument names another README."""
    path = Path(argv[1]).resolve() if len(argv) > 1 else README
    print("\n".join(quickstart_commands(path.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
