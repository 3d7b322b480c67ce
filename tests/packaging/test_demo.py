"""The README's Quick start, read literally: each command is a make target, and ``make demo``
as written, from the root of a fresh copy of the tree, shows exactly the planted problems.

The commands come from ``scripts/quickstart.py``, the reader ``.ci/run`` uses to run them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parents[2]


def _tree() -> Path:
    """The checkout (``PYTEST_BACKENDS_SOURCE_TREE`` when the tests run from a copy)."""
    root = Path(os.environ.get("PYTEST_BACKENDS_SOURCE_TREE", HERE))
    if not (root / "README.md").is_file() or not (root / "Makefile").is_file():
        pytest.skip(f"no source tree with README.md and Makefile at {root}")
    return root


def _quickstart() -> ModuleType:
    path = _tree() / "scripts" / "quickstart.py"
    spec = importlib.util.spec_from_file_location("quickstart", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands() -> list[str]:
    text = (_tree() / "README.md").read_text(encoding="utf-8")
    commands: list[str] = _quickstart().quickstart_commands(text)
    return commands


def _make_targets(makefile: str) -> set[str]:
    rule = re.compile(r"^([A-Za-z0-9_.%/-]+(?:\s+[A-Za-z0-9_.%/-]+)*)\s*::?(?!=)", re.M)
    return {name for match in rule.finditer(makefile) for name in match.group(1).split()}


def _targets_of(command: str) -> list[str]:
    argv = shlex.split(command)
    assert argv[0] == "make", f"the Quick start runs {command!r}, not a make target"
    return [arg for arg in argv[1:] if not arg.startswith("-") and "=" not in arg]


def test_the_quick_start_commands_are_make_targets() -> None:
    commands = _commands()
    assert [_targets_of(c) for c in commands] == [["demo"], ["test"]], commands
    targets = _make_targets((_tree() / "Makefile").read_text(encoding="utf-8"))
    for command in commands:
        missing = [t for t in _targets_of(command) if t not in targets]
        assert not missing, f"README's {command!r}: no such target in the Makefile"


def _fresh_copy(root: Path, dest: Path) -> None:
    """The tree as a clone has it: git's tracked and unignored files, nothing built."""
    if (root / ".git").exists() and shutil.which("git"):
        listing = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = [name for name in listing.split("\0") if name]
    else:  # an unpacked sdist
        names = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    for name in names:
        source = root / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _venv_of_this_session(dest: Path) -> None:
    """``make``'s ``.venv``, standing in for the one it would build (as ``.ci/run`` does).

    Building a virtualenv with torch costs a minute and a gigabyte; the interpreter
    running these tests has everything the demo needs, so ``.venv/bin/python`` execs it
    and the stamp says the venv is current.
    """
    python = dest / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    for name in ("pyproject.toml", "setup.py"):
        if (dest / name).exists():
            os.utime(dest / name, (1, 1))
    (dest / ".venv" / ".installed").touch()


def test_make_demo_as_the_readme_writes_it_on_a_fresh_copy(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    (demo,) = [c for c in _commands() if _targets_of(c) == ["demo"]]
    clone = tmp_path / "clone"
    _fresh_copy(_tree(), clone)
    _venv_of_this_session(clone)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    proc = subprocess.run(
        demo,
        shell=True,
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"$ {demo}\n{out[-4000:]}"
    assert "UNEXPECTED" not in out and "demo OK" in out
    assert "mkldnn.enabled: True -> False" in out
    assert "nondeterministic op demo::jitter" in out
    # the relative directory the Makefile names is the caller's, not demo/'s
    assert not (clone / "demo" / "demo-output").exists()
    census = json.loads((clone / "demo-output" / "census.json").read_text())
    assert [e["op"] for e in census["entries"] if e["verdict"] == "nondeterministic"] == [
        "demo::jitter"
    ]


def test_the_slow_group_is_left_out_of_make_test_and_run_by_the_wheel_job() -> None:
    root = _tree()
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    script = (root / "scripts" / "test-installed.sh").read_text(encoding="utf-8")
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    # the editable `make test` deselects the group, the wheel flavour selects it, and CI
    # runs both after the README's own commands: every test runs in CI
    assert re.search(r'^\t\$\(PY\) -m pytest .*-m "not slow"', makefile, re.M)
    assert "scripts/test-installed.sh wheel" in makefile
    assert re.search(r"suite_run -m slow ", script)
    assert "scripts/quickstart.py README.md" in ci and "make test INSTALL=wheel" in ci
    ini = (root / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^\s+"slow: ', ini, re.M), "the slow marker is not registered"
