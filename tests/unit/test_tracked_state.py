"""The state the leak guard tracks beyond backend flags, and the guard's building blocks.

In-process and fast: the registry rows for the freeze switch, autocast,
opt_einsum and flush-denormal on the real torch (and autocast on the shape of a
torch older than 2.4), the snapshot taken at torch's import (in a fresh
interpreter), marker validation, the baseline lines and the soak's report
parser.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_backends.flags import FlagRegistry, registry, snapshot_flags
from pytest_backends.flags.catalogue import build_catalogue
from pytest_backends.isolation import TorchStateWatch, marker_mode
from pytest_backends.isolation.watch import Change

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def test_freeze_switch_is_tracked_and_written_last() -> None:
    reg = registry()
    before = reg.snapshot()
    assert before["flags_frozen"] is False
    try:
        # frozen, then set a ContextProp flag in the same call: the flag is
        # written under the mutation allowance, the freeze after it
        reg.apply(reg.validate({"flags_frozen": True, "mkldnn.enabled": False}))
        assert torch.backends.flags_frozen()
        assert torch.backends.mkldnn.enabled is False
        with pytest.raises(RuntimeError):
            torch.backends.cudnn.benchmark = True
        frozen = reg.snapshot()
        reg.restore(before)
        assert not torch.backends.flags_frozen()
        torch.backends.cudnn.benchmark = True  # settable again
        torch.backends.cudnn.benchmark = False
        reg.restore(frozen)
        assert torch.backends.flags_frozen() and torch.backends.mkldnn.enabled is False
    finally:
        reg.restore(before)
    assert reg.snapshot() == before


def test_autocast_state_is_tracked() -> None:
    reg = registry()
    before = reg.snapshot()
    a = torch.ones(4, 4)
    try:
        torch.set_autocast_enabled("cpu", True)
        torch.set_autocast_dtype("cpu", torch.float16)
        torch.set_autocast_cache_enabled(False)
        assert (a @ a).dtype == torch.float16
        diff = reg.diff(before, reg.snapshot())
        assert diff == {
            "autocast.cpu.enabled": (False, True),
            "autocast.cpu.dtype": ("bfloat16", "float16"),
            "autocast.cache_enabled": (True, False),
        }
    finally:
        reg.restore(before)
    assert (a @ a).dtype == torch.float32
    assert reg.snapshot() == before
    with pytest.raises(ValueError, match=r"autocast.cpu.dtype.*'float16', 'bfloat16'"):
        reg.validate({"autocast.cpu.dtype": "float64"})


class _TorchBefore24:
    """torch whose autocast functions take no device type (before 2.4)."""

    def __getattr__(self, name: str) -> Any:
        if name in ("get_autocast_dtype", "set_autocast_dtype"):
            raise AttributeError(name)
        if name == "is_autocast_enabled":

            def is_autocast_enabled(*args: object) -> bool:
                if args:
                    raise TypeError("is_autocast_enabled() takes no arguments")
                return bool(torch.is_autocast_enabled("cuda"))

            return is_autocast_enabled
        if name == "set_autocast_enabled":
            return lambda value: torch.set_autocast_enabled("cuda", value)
        return getattr(torch, name)


def test_autocast_rows_on_older_torch_use_the_per_device_functions() -> None:
    old = _TorchBefore24()
    rows, absent = build_catalogue(old)
    reg = FlagRegistry(old, rows, absent)
    names = reg.names()
    for row in (
        "autocast.cpu.enabled",
        "autocast.cpu.dtype",
        "autocast.cuda.enabled",
        "autocast.cuda.dtype",
        "autocast.cache_enabled",
    ):
        assert row in names
    real_before = snapshot_flags()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the per-device functions are deprecated in 2.13
        before = reg.snapshot()
        try:
            reg.apply(
                reg.validate(
                    {
                        "autocast.cpu.enabled": True,
                        "autocast.cpu.dtype": torch.float16,
                        "autocast.cuda.enabled": True,
                    }
                )
            )
            assert torch.is_autocast_enabled("cpu") and torch.is_autocast_enabled("cuda")
            assert torch.get_autocast_dtype("cpu") == torch.float16
            assert reg.diff(before, reg.snapshot()).keys() == {
                "autocast.cpu.enabled",
                "autocast.cpu.dtype",
                "autocast.cuda.enabled",
            }
        finally:
            reg.restore(before)
    assert snapshot_flags() == real_before


def test_opt_einsum_rows_exist_without_the_package() -> None:
    reg = registry()
    assert {"opt_einsum.enabled", "opt_einsum.strategy"} <= set(reg.names())
    before = reg.snapshot()
    einsum = torch.backends.opt_einsum
    try:
        # torch accepts both with or without the package (without it they are
        # plain attributes), so both are state a test can leak
        einsum.strategy = "greedy"
        einsum.enabled = not before["opt_einsum.enabled"]
        assert reg.diff(before, reg.snapshot()) == {
            "opt_einsum.strategy": (before["opt_einsum.strategy"], "greedy"),
            "opt_einsum.enabled": (before["opt_einsum.enabled"], not before["opt_einsum.enabled"]),
        }
    finally:
        reg.restore(before)
    assert reg.snapshot() == before


def test_flush_denormal_is_read_from_the_cpu_state() -> None:
    reg = registry()
    if "flush_denormal" not in reg.by_name:
        assert "flush_denormal" in reg.absent
        pytest.skip(f"flush_denormal: {reg.absent['flush_denormal']}")
    tiny = torch.tensor([1e-310], dtype=torch.float64)
    before = reg.snapshot()
    assert before["flush_denormal"] is False
    try:
        assert torch.set_flush_denormal(True)
        assert reg.snapshot()["flush_denormal"] is True
        assert (tiny * 1.0).item() == 0.0
    finally:
        reg.restore(before)
    assert (tiny * 1.0).item() != 0.0
    assert reg.snapshot() == before


def test_snapshot_is_taken_when_torch_finishes_importing(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import importlib.machinery, importlib.resources, sys
        from pytest_backends.isolation import WATCH
        WATCH.install(None)
        assert WATCH.import_state is None and "torch" not in sys.modules
        import torch
        torch.set_default_dtype(torch.float64)      # user code, right after the import
        torch.backends.cudnn.benchmark = True
        assert WATCH.ready()
        assert WATCH.import_state["default_dtype"] == "float32"
        assert WATCH.import_state["cudnn.benchmark"] is False
        # torch keeps its own loader and finder; the hook is gone
        assert isinstance(torch.__loader__, importlib.machinery.SourceFileLoader)
        assert importlib.resources.files("torch").joinpath("__init__.py").is_file()
        assert not any(type(f).__name__ == "_TorchFinder" for f in sys.meta_path)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_baseline_lines_name_the_source_of_each_net_change() -> None:
    watch = TorchStateWatch()
    watch.import_state = {"default_dtype": "float32", "cudnn.benchmark": False, "num_threads": 2}
    watch.baseline = {"default_dtype": "float64", "cudnn.benchmark": False, "num_threads": 1}
    watch.baseline_changes = [
        Change(
            "tests/conftest.py",
            {"default_dtype": ("float32", "float64"), "cudnn.benchmark": (False, True)},
        ),
        Change("tests/sub/conftest.py", {"cudnn.benchmark": (True, False)}),  # undone
        Change("a hook of a conftest.py or plugin", {"num_threads": (2, 1)}),
    ]
    assert watch.baseline_lines() == [
        "session baseline differs from torch defaults: default_dtype=float64 (tests/conftest.py)",
        "session baseline differs from torch defaults: num_threads=1 "
        "(a hook of a conftest.py or plugin)",
    ]
    assert TorchStateWatch().baseline_lines() == []


MARKED = """
import pytest


class Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr")


@pytest.mark.backends_leaks("warn")
def test_warn(): pass

@pytest.mark.backends_leaks(" OFF ")
def test_off(): pass

@pytest.mark.backends_leaks("bogus")
def test_bogus(): pass

@pytest.mark.backends_leaks(None)
def test_none(): pass

@pytest.mark.backends_leaks(123)
def test_int(): pass

@pytest.mark.backends_leaks("warn", "off")
def test_two(): pass

@pytest.mark.backends_leaks()
def test_empty(): pass

@pytest.mark.backends_leaks(mode="warn")
def test_keyword(): pass

@pytest.mark.backends_leaks(Unprintable())
def test_unprintable(): pass

@pytest.mark.backends_leaks("x" * 500)
def test_long(): pass

@pytest.mark.backends_leaks("bogus")
class TestMarkedClass:
    def test_in_class(self): pass

def test_unmarked(): pass
"""

MARKER_CASES: dict[str, tuple[str, str | None]] = {
    "test_warn": ("warn", None),
    "test_off": ("off", None),
    "test_bogus": ("fail", "got backends_leaks('bogus')"),
    "test_none": ("fail", "got backends_leaks(None)"),
    "test_int": ("fail", "got backends_leaks(123)"),
    "test_two": ("fail", "got backends_leaks('warn', 'off')"),
    "test_empty": ("fail", "got backends_leaks()"),
    "test_keyword": ("fail", "got backends_leaks(mode='warn')"),
    "test_unprintable": ("fail", "got backends_leaks(<Unprintable object>)"),
    "test_long": ("fail", "xxx..."),
    "test_in_class": ("fail", "got backends_leaks('bogus')"),
    "test_unmarked": ("fail", None),
}


def test_marker_mode_never_raises(pytester: pytest.Pytester) -> None:
    items = {item.name: item for item in pytester.getitems(MARKED)}
    assert items.keys() == MARKER_CASES.keys()
    for name, (mode, error) in MARKER_CASES.items():
        got_mode, got_error = marker_mode(items[name], "fail")
        assert got_mode == mode, name
        if error is None:
            assert got_error is None, name
        else:
            assert got_error is not None and error in got_error, (name, got_error)
            assert "one of 'fail', 'warn', 'off'" in got_error
            assert len(got_error) < 400


def _soak() -> Any:
    spec = importlib.util.spec_from_file_location("leak_soak", ROOT / "benchmarks" / "leak_soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_parses_every_kind_of_report() -> None:
    output = textwrap.dedent(
        """
        ____ ERROR at teardown of test_a ____
        test_a.py::test_a left torch backend flags changed:
          mkldnn.enabled: True -> False
          cudnn.benchmark: False -> True
        They were restored for the next test.
        [gw1] linux -- Python 3.11
        fixture 'mod' (module scope, defined in test_a.py) changed torch backend flags and did not restore them in its teardown:
          sdp.math: True -> False
        Restore them after the fixture's yield.
        test_c.py changed torch backend flags while it was imported:
          default_dtype: 'float32' -> 'float64'
        ERROR test_a.py::test_a - Failed: test_a.py::test_a left torch backend flags changed:
        """  # noqa: E501
    )
    assert _soak().parse_reports(output) == [
        ("test", "test_a.py::test_a", ("cudnn.benchmark", "mkldnn.enabled")),
        ("fixture", "mod", ("sdp.math",)),
        ("import", "test_c.py", ("default_dtype",)),
    ]


def test_inline_session_inside_a_session_keeps_the_enclosing_state(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_sees_the_enclosing_state():
            assert torch.backends.cudnn.benchmark

        def test_leaks_inside():
            torch.backends.mkldnn.enabled = False
        """
    )
    from pytest_backends import override_flags

    with override_flags({"cudnn.benchmark": True}):
        result = pytester.runpytest("-p", "no:randomly", "-p", "no:cacheprovider")
        # the inner session judges against the state it started with ...
        result.assert_outcomes(passed=2, errors=1)
        result.stdout.fnmatch_lines(["*mkldnn.enabled: True -> False"])
        assert "changed between tests" not in result.stdout.str()
        # ... and leaves the enclosing session's state as it found it
        assert torch.backends.cudnn.benchmark and torch.backends.mkldnn.enabled
