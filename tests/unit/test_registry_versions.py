"""The flag registry across torch versions: rows are feature-probed, never assumed.

The registry must work on torch >= 2.1.  Here a torch shaped like 2.1 (the
running torch with the newer APIs hidden) shows that missing features become
*absent* rows with a reason, and the rows that this torch does have are
overridden and restored in every nesting and on every kind of exit.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from pytest_backends import diff_flags, override_flags, restore_flags, snapshot_flags
from pytest_backends.flags import Flag, FlagRegistry, registry
from pytest_backends.flags.catalogue import build_catalogue

# rows changed only by an action (contexts, hooks, profiler) or config options: their own tests
_BY_ACTION = (
    "modes.",
    "nn.module_",
    "autograd.saved_tensors_hooks",
    "autograd.forward_ad.",
    "profiler.",
    "num_interop_threads",
    "inductor.",
    "autograd.inference_mode",
    "serialization.",
    "tunableop.results",
)
ROWS = [r for r in registry().rows if not r.name.startswith(_BY_ACTION)]
ABSENT = sorted(registry().absent)

# What torch 2.1 lacks, by where it lives.  Each entry names the rows that must
# then be absent (not errors, not silently present).
HIDDEN_C = {
    "_get_fp32_precision_getter": "fp32_precision",
    "_set_fp32_precision_setter": "fp32_precision",
    "_get_cudnn_depthwise_kernel": "cudnn.depthwise_kernel",
    "_get_fa3_sdp_enabled": "sdp.fa3",
    "_get_sdp_priority_order": "sdp.priority_order",
    "_get_overrideable_sdp_enabled": "sdp.overrideable",
    "_get_cudnn_sdp_enabled": "sdp.cudnn",
    "_get_math_sdp_allow_fp16_bf16_reduction": "sdp.allow_fp16_bf16_reduction_math",
    "_get_cublas_allow_fp16_accumulation": "cuda.matmul.allow_fp16_accumulation",
    "_get_cpu_allow_fp16_reduced_precision_reduction": (
        "cpu.allow_fp16_reduced_precision_reduction"
    ),
    "_get_blas_preferred_backend": "cuda.preferred_blas_library",
}
HIDDEN_TORCH = {"get_default_device", "get_autocast_dtype", "set_autocast_dtype"}
OLD_VERSION = "2.1.2"


class _Hiding:
    """A module whose listed attributes do not exist; the rest is the real one."""

    def __init__(self, real: Any, hidden: set[str], **replaced: Any) -> None:
        self._real = real
        self._hidden = hidden
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        if name in self._hidden:
            raise AttributeError(name)
        return getattr(self._real, name)


def _bool_reduction(getter: Callable[[], Any]) -> Callable[[], bool]:
    # before the (allow_reduced, allow_splitk) pair, these getters returned a bool
    return lambda: bool(getter()[0])


def _torch_21() -> Any:
    """The running torch, shaped like 2.1: newer functions hidden, old signatures."""
    real_c = torch._C
    c = _Hiding(
        real_c,
        set(HIDDEN_C) | {name.replace("_get_", "_set_", 1) for name in HIDDEN_C},
        **{
            f"_get_cublas_allow_{d}_reduced_precision_reduction": _bool_reduction(
                getattr(real_c, f"_get_cublas_allow_{d}_reduced_precision_reduction")
            )
            for d in ("fp16", "bf16")
        },
    )
    backends = _Hiding(torch.backends, {"mha"})

    def is_autocast_enabled() -> bool:  # no device argument before 2.4
        return bool(torch.is_autocast_enabled("cuda"))

    fake = _Hiding(
        torch,
        HIDDEN_TORCH,
        _C=c,
        backends=backends,
        is_autocast_enabled=is_autocast_enabled,
        __version__=OLD_VERSION,
    )
    return fake


pytestmark = [
    # the 2.1-shaped torch reads autocast through the functions torch now deprecates
    pytest.mark.filterwarnings("ignore:torch.*is deprecated:DeprecationWarning"),
    # setting the oneDNN TF32 alias on a build without Intel GPU support
    pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN:UserWarning"),
]


@pytest.fixture
def real_flags() -> Iterator[dict[str, object]]:
    """The running torch's flags; the fake writes through to them, so put them back."""
    before = snapshot_flags()
    yield before
    restore_flags(before)
    assert snapshot_flags() == before


def test_torch_21_shape_reports_missing_rows_absent(real_flags: dict[str, object]) -> None:
    old = _torch_21()
    rows, absent = build_catalogue(old)
    reg = FlagRegistry(old, rows, absent)
    names = set(reg.names())
    expected_absent = {
        *HIDDEN_C.values(),
        "cudnn.fp32_precision",
        "cuda.matmul.fp32_precision",
        "mkldnn.conv.fp32_precision",
        "mha.fastpath_enabled",
        "default_device",
    }
    assert expected_absent <= set(absent), expected_absent - set(absent)
    assert not names & set(absent)
    assert "fp32_precision API (torch >= 2.9)" in absent["cuda.matmul.fp32_precision"]
    assert absent["mha.fastpath_enabled"] == "needs torch.backends.mha"
    assert absent["default_device"] == "needs torch >= 2.3"
    # what 2.1 does have is still there, through its older APIs
    for name in (
        "cudnn.enabled",
        "mkldnn.enabled",
        "cudnn.allow_tf32",
        "cuda.matmul.allow_tf32",
        "float32_matmul_precision",
        "deterministic_algorithms.warn_only",
        "autocast.cpu.enabled",
        "autocast.cpu.dtype",
        "autocast.cuda.dtype",
    ):
        assert name in names, name
    # without the fp32_precision strings the legacy TF32 switch is state of its own
    assert reg.by_name["cuda.matmul.allow_tf32"].in_snapshot
    # a bool-returning reduced-precision getter gets a bool row, not the pair
    fp16 = reg.by_name["cuda.matmul.allow_fp16_reduced_precision_reduction"]
    assert fp16.allowed == "True, False"
    with pytest.raises(ValueError, match="True or False"):
        reg.validate({fp16.name: (True, False)})
    snap = reg.snapshot()
    assert set(snap) == {r.name for r in reg.snapshot_rows}
    assert json.loads(json.dumps(snap)) == snap


@pytest.mark.parametrize("name", sorted({*HIDDEN_C.values(), "mha.fastpath_enabled"}))
def test_torch_21_shape_absent_flag_is_a_clear_error(
    name: str, real_flags: dict[str, object]
) -> None:
    old = _torch_21()
    reg = FlagRegistry(old, *build_catalogue(old))
    with pytest.raises(ValueError) as info:
        reg.validate({"cudnn.benchmark": True, name: True})
    message = str(info.value)
    assert f"flag {name!r} does not exist in this torch ({OLD_VERSION})" in message
    assert reg.absent[name] in message
    assert "unknown backend flag" not in message
    assert snapshot_flags() == real_flags


def test_torch_21_shape_legacy_rows_round_trip(real_flags: dict[str, object]) -> None:
    old = _torch_21()
    reg = FlagRegistry(old, *build_catalogue(old))
    before = reg.snapshot()
    wanted = {
        "autocast.cpu.dtype": "float16"
        if before["autocast.cpu.dtype"] != "float16"
        else "bfloat16",
        "autocast.cpu.enabled": not before["autocast.cpu.enabled"],
        "cuda.matmul.allow_tf32": not before["cuda.matmul.allow_tf32"],
        "cuda.matmul.allow_fp16_reduced_precision_reduction": not before[
            "cuda.matmul.allow_fp16_reduced_precision_reduction"
        ],
        "float32_matmul_precision": "medium",
    }
    reg.apply(reg.validate(wanted))
    changed = reg.diff(before, reg.snapshot())
    assert set(wanted) <= set(changed)
    # the legacy writers reached the real torch
    assert torch.get_autocast_dtype("cpu") == getattr(torch, wanted["autocast.cpu.dtype"])
    reg.restore(before)
    assert reg.snapshot() == before


# --- probes of the running torch --------------------------------------------------------

PROBES: dict[str, Callable[[], bool]] = {
    "fp32_precision": lambda: hasattr(torch._C, "_get_fp32_precision_getter"),
    "cuda.matmul.fp32_precision": lambda: hasattr(torch._C, "_get_fp32_precision_getter"),
    "cudnn.depthwise_kernel": lambda: hasattr(torch._C, "_get_cudnn_depthwise_kernel"),
    "cudnn.benchmark_limit": lambda: bool(torch.backends.cudnn.is_available()),
    "cuda.cufft_plan_cache[0].max_size": lambda: torch.cuda.is_available(),
    "sdp.fa3": lambda: hasattr(torch._C, "_get_fa3_sdp_enabled"),
    "sdp.priority_order": lambda: hasattr(torch._C, "_get_sdp_priority_order"),
    "mha.fastpath_enabled": lambda: hasattr(torch.backends, "mha"),
    "default_device": lambda: hasattr(torch, "get_default_device"),
    "autocast.cpu.dtype": lambda: True,
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_row_exists_exactly_when_torch_has_the_feature(name: str) -> None:
    reg = registry()
    if PROBES[name]():
        assert name in reg.by_name and name not in reg.absent
    else:
        assert name in reg.absent and name not in reg.by_name


@pytest.mark.parametrize("name", ABSENT or ["<none absent>"])
def test_absent_row_of_this_torch_fails_override_naming_flag_and_version(name: str) -> None:
    if name not in registry().absent:
        pytest.skip("every known flag exists in this torch")
    before = snapshot_flags()
    with (
        pytest.raises(ValueError) as info,
        override_flags({"mkldnn.enabled": False, name: 1}),
    ):
        pytest.fail("the block must not run")
    message = str(info.value)
    assert repr(name) in message and torch.__version__ in message
    assert registry().absent[name] in message
    assert snapshot_flags() == before


# --- every row of this torch: nested overrides, exits by exception ------------------------


def _candidates(row: Flag, current: object) -> Iterator[object]:
    """Valid values other than ``current``, derived from the row's kind and allowed values."""
    if isinstance(current, bool):
        yield not current
    elif current is None and row.allowed.startswith("None"):
        yield from (True, False)
    elif isinstance(current, list) and not current:
        yield ["scaled_mm"] if "operations" in row.name else ["CUDA"]
    elif row.allowed == "True, False":  # a write-only alias that reads None on this build
        yield from (True, False)
    elif isinstance(current, tuple):
        yield (not current[0], current[1])
    elif isinstance(current, list):
        yield list(reversed(current))
    elif isinstance(current, int):
        yield 1 if current != 1 else 2
    else:
        words = [w.strip("'") for w in row.allowed.split(", ") if " " not in w]
        yield from (w for w in [*words, "meta"] if w != current and _checked(row, w) != current)


def _checked(row: Flag, value: object) -> object:
    try:
        return row.check(value)
    except ValueError:
        return None


def _accepts(row: Flag, value: object) -> bool:
    try:
        row.check(value)
    except ValueError:
        return False
    return True


def _settable_other(row: Flag, current: object) -> object:
    """The first value other than ``current`` that this build lets ``row`` take."""
    refused: list[str] = []
    for value in filter(functools.partial(_accepts, row), _candidates(row, current)):
        try:
            with override_flags({row.name: value}):
                return value
        except ValueError as exc:
            if "cannot be set to" not in str(exc):
                raise
            refused.append(str(exc))
    pytest.skip(f"no other value of {row.name} is settable on this build: {refused}")


class _Boom(Exception):
    pass


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_nested_overrides_unwind_in_order_through_an_exception(row: Flag) -> None:
    before = snapshot_flags()
    original = row.plain(row.read())
    readable = row.in_snapshot or original is not None
    value = _settable_other(row, original)
    assert snapshot_flags() == before
    with override_flags({row.name: value}) as entered:
        assert entered == before
        middle = snapshot_flags()
        if row.in_snapshot:
            assert row.name in diff_flags(before, middle)
        elif readable:  # an alias is set through the legacy API and read back through it
            assert row.plain(row.read()) == row.check(value)
        # back to the original inside, where it is a value one may set (not opt_einsum's None)
        back = original if _accepts(row, original) else value
        with pytest.raises(_Boom), override_flags({row.name: back}) as inner:
            assert inner == middle
            assert row.plain(row.read()) == back or not readable
            # the body also changes other state directly: it is restored too
            torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
            raise _Boom
        assert snapshot_flags() == middle
    assert snapshot_flags() == before


def test_three_levels_restore_each_level_state() -> None:
    before = snapshot_flags()
    seen: list[dict[str, object]] = []
    with override_flags({"mkldnn.enabled": False, "num_threads": 1}):
        seen.append(snapshot_flags())
        with override_flags({"mkldnn.enabled": True, "default_dtype": "float64"}):
            seen.append(snapshot_flags())
            with override_flags({"num_threads": 2, "cudnn.benchmark": True}):
                assert torch.get_num_threads() == 2
                assert torch.get_default_dtype() == torch.float64
                assert torch.backends.mkldnn.enabled is True
            assert snapshot_flags() == seen[1]
        assert snapshot_flags() == seen[0]
        assert torch.get_default_dtype() == torch.float32
        assert torch.backends.mkldnn.enabled is False
    assert snapshot_flags() == before


def _interrupt() -> None:
    raise KeyboardInterrupt


def _exit() -> None:
    raise SystemExit(3)


@pytest.mark.parametrize(
    ("stop", "kind"),
    [
        (_interrupt, KeyboardInterrupt),
        (_exit, SystemExit),
        (lambda: pytest.skip("skipped inside"), pytest.skip.Exception),
        (lambda: pytest.fail("failed inside"), pytest.fail.Exception),
    ],
    ids=["KeyboardInterrupt", "SystemExit", "pytest.skip", "pytest.fail"],
)
def test_restores_on_base_exceptions(stop: Callable[[], None], kind: type[BaseException]) -> None:
    before = snapshot_flags()
    with (
        pytest.raises(BaseException) as info,
        override_flags({"deterministic_algorithms": True, "default_dtype": "float64"}),
    ):
        torch.backends.mkldnn.enabled = False
        assert torch.are_deterministic_algorithms_enabled()
        stop()
    assert type(info.value) is kind
    assert snapshot_flags() == before


def test_a_value_refused_midway_restores_what_was_already_written() -> None:
    before = snapshot_flags()
    refused = next(
        (
            (name, value)
            for name, value in (
                ("cuda.preferred_linalg_library", "magma"),
                ("cuda.preferred_blas_library", "cublaslt"),
            )
            if name in registry().by_name
        ),
        None,
    )
    if refused is None:
        pytest.skip("no refusable row in this torch")
    name, value = refused
    try:
        with override_flags({"fp32_precision": "bf16", "cudnn.benchmark": True, name: value}):
            pytest.skip(f"{name}={value!r} is settable on this build")
    except ValueError as exc:
        assert f"flag {name!r} cannot be set to {value!r}" in str(exc)
    assert snapshot_flags() == before


# --- fixtures and markers in a real session ----------------------------------------------

SESSION_CONFTEST = """
import torch
from pytest_backends import diff_flags, snapshot_flags

START = snapshot_flags()

def pytest_unconfigure(config):
    print("EXIT_DIFF=" + repr(diff_flags(START, snapshot_flags())))
"""

SESSION_TESTS = """
import pytest
import torch
from pytest_backends import override_flags
from pytest_backends.flags import registry

@pytest.fixture(scope="module")
def warn_always():
    with override_flags({"warn_always": True}):
        yield

def test_fixture_then_fail(backend_flags, warn_always):
    backend_flags.set({"cudnn.benchmark": True, "mkldnn.enabled": False})
    backend_flags.set({"cudnn.benchmark": False, "default_dtype": "float64"})
    assert backend_flags.get("mkldnn.enabled") is False
    assert torch.is_warn_always_enabled()
    raise RuntimeError("body failed")

def test_fixture_state_was_restored(warn_always):
    assert torch.backends.mkldnn.enabled is True
    assert torch.get_default_dtype() == torch.float32
    assert torch.is_warn_always_enabled()

@pytest.mark.backends("mkldnn")
def test_matrix_then_fail(backend_config):
    assert torch.backends.mkldnn.enabled is (backend_config.axes["mkldnn"] == "on")
    assert False, "marked test failed"

def test_absent_flag_in_fixture(backend_flags):
    name = sorted(registry().absent)[0]
    with pytest.raises(ValueError) as info:
        backend_flags.set({"mkldnn.enabled": False, name: 1})
    assert torch.__version__ in str(info.value) and repr(name) in str(info.value)
    assert torch.backends.mkldnn.enabled is True
"""

AFTER_TESTS = """
import torch

def test_next_module_starts_clean():
    assert torch.backends.mkldnn.enabled is True
    assert not torch.is_warn_always_enabled()
    assert torch.backends.cudnn.benchmark is False
"""


def test_fixture_and_marker_restore_after_failing_tests(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SESSION_CONFTEST)
    pytester.makepyfile(test_a_restore=SESSION_TESTS, test_b_after=AFTER_TESTS)
    absent = bool(registry().absent)
    # The leak guard is off: what is restored here, the fixtures and the matrix restored.
    result = pytester.runpytest_subprocess(
        "-s", "-p", "no:randomly", "--backends-leaks=off", "--backends-matrix", "-rA"
    )
    result.assert_outcomes(passed=2 + absent, failed=3 + (not absent))
    out = result.stdout.str()
    assert "RuntimeError: body failed" in out
    for value in ("on", "off"):
        assert f"FAILED test_a_restore.py::test_matrix_then_fail[mkldnn-{value}]" in out
    for name in ("test_a_restore.py::test_fixture_state_was_restored", "test_b_after.py::"):
        assert f"PASSED {name}" in out
    exit_lines = [line for line in result.outlines if line.startswith("EXIT_DIFF=")]
    assert exit_lines == ["EXIT_DIFF={}"]
