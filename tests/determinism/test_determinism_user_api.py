"""The determinism harness as users rely on it: call semantics, errors, census and baseline files.

Complements test_reproducible_api.py, test_nondeterministic_alert.py and the
census/plugin tests: kwargs and run counts, seeds and RNG restoration (NumPy
included, and when ``fn`` raises), exact failure messages, the mode each
alert expectation names, what the census lists per ``(op, device, dtype)``
and how a baseline is updated, version-checked and refused.
"""

from __future__ import annotations

import itertools
import json
import random
import warnings
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from pytest_backends import (
    AlertExpectationError,
    DeterminismError,
    NotReproducibleError,
    assert_reproducible,
    expect_nondeterministic_alert,
    override_flags,
)

np = pytest.importorskip("numpy")

ALERT = "does not have a deterministic implementation"
RAISING = "torch.use_deterministic_algorithms(True)"
WARNING = "torch.use_deterministic_algorithms(True, warn_only=True)"


def _put() -> torch.Tensor:
    # put_ without accumulate has no deterministic kernel: it alerts on every device.
    return torch.zeros(5).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))


def _det_flags() -> tuple[bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )


@pytest.fixture
def deterministic_mode_off() -> Iterator[None]:
    """Leave deterministic mode off after the test, whatever the test set."""
    yield
    torch.use_deterministic_algorithms(False)


# --- assert_reproducible: calls, arguments, errors -----------------------------


def test_fn_gets_args_and_kwargs_in_every_one_of_runs_calls() -> None:
    calls: list[tuple[float, float]] = []

    def affine(x: torch.Tensor, *, scale: float, shift: float = 0.0) -> torch.Tensor:
        calls.append((scale, shift))
        return x * scale + shift

    assert_reproducible(affine, torch.ones(3), runs=4, scale=2.0, shift=1.0)
    assert calls == [(2.0, 1.0)] * 4
    calls.clear()
    assert_reproducible(affine, torch.ones(3), scale=3.0)  # the default is 5 runs
    assert calls == [(3.0, 0.0)] * 5


def test_gradient_of_a_keyword_argument_is_named(planted: ModuleType) -> None:
    x = torch.randn(32, requires_grad=True)
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(lambda *, t: planted.spread(t, 16), t=x, runs=3)
    assert info.value.what == "grad of kwargs['t']"
    assert info.value.runs == 3
    assert str(info.value).startswith(
        "assert_reproducible: grad of kwargs['t'] differs between run 0 and run "
    )
    assert x.grad is None


def test_failure_names_the_first_differing_run_and_everything_else_that_differs() -> None:
    calls = itertools.count()

    def fn() -> dict[str, object]:
        late = float(next(calls) >= 3)  # runs 3, 4 and 5 differ from run 0
        return {"stable": torch.ones(2), "late": torch.full((2,), late), "flag": late}

    with pytest.raises(AssertionError) as info:
        assert_reproducible(fn, runs=6, seed=11)
    err = info.value
    assert isinstance(err, NotReproducibleError)
    assert isinstance(err, DeterminismError)
    assert (err.what, err.run, err.runs) == ("output['late']", 3, 6)
    assert str(err) == (
        "assert_reproducible: output['late'] differs between run 0 and run 3 "
        "(6 runs, RNGs seeded with 11; compared bitwise); "
        "also differing in run 3: output['flag']"
    )


def test_failure_message_says_when_rngs_were_reset_instead_of_seeded() -> None:
    calls = itertools.count()
    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(lambda: [torch.zeros(1), torch.tensor(next(calls))], seed=None)
    assert (info.value.what, info.value.run, info.value.runs) == ("output[1]", 1, 5)
    assert str(info.value) == (
        "assert_reproducible: output[1] differs between run 0 and run 1 "
        "(5 runs, RNGs reset to the call's state; compared bitwise)"
    )


@pytest.mark.parametrize("seed", ["0", 1.5, True], ids=["str", "float", "bool"])
def test_invalid_seed_is_a_type_error_before_fn_runs(seed: object) -> None:
    calls: list[int] = []
    with pytest.raises(TypeError, match=r"seed must be an int or None, got "):
        assert_reproducible(lambda: calls.append(1) or torch.ones(1), seed=seed)  # type: ignore[arg-type]
    assert calls == []


def test_exceptions_from_fn_propagate_unchanged() -> None:
    calls = itertools.count()

    def fails_in_run_2() -> torch.Tensor:
        if next(calls) == 2:
            raise KeyError("missing in run 2")
        return torch.ones(1)

    with pytest.raises(KeyError, match="missing in run 2"):
        assert_reproducible(fails_in_run_2)


# --- assert_reproducible: RNGs -------------------------------------------------


def _draw() -> tuple[torch.Tensor, float, float]:
    return torch.rand(3), random.random(), float(np.random.rand())


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def test_seed_seeds_torch_python_and_numpy_before_every_run() -> None:
    seen: list[tuple[torch.Tensor, float, float]] = []

    def fn() -> tuple[torch.Tensor, float, float]:
        seen.append(_draw())
        return seen[-1]

    assert_reproducible(fn, runs=3, seed=42)
    _seed_everything(42)
    expected = _draw()
    assert len(seen) == 3
    for t, p, n in seen:
        assert torch.equal(t, expected[0])
        assert (p, n) == expected[1:]
    seen.clear()
    assert_reproducible(fn, runs=2, seed=43)
    assert not torch.equal(seen[0][0], expected[0])


def test_seed_none_starts_every_run_from_the_callers_state_and_keeps_it() -> None:
    _seed_everything(5)
    expected = _draw()
    _seed_everything(5)
    seen: list[tuple[torch.Tensor, float, float]] = []

    def fn() -> tuple[torch.Tensor, float, float]:
        seen.append(_draw())
        return seen[-1]

    assert_reproducible(fn, runs=3, seed=None)
    assert len(seen) == 3
    for t, p, n in seen:
        assert torch.equal(t, expected[0])
        assert (p, n) == expected[1:]
    # The runs consumed random numbers, but the caller's generators are where they were.
    after = _draw()
    assert torch.equal(after[0], expected[0])
    assert after[1:] == expected[1:]


def test_rngs_and_grads_are_restored_when_fn_raises_or_runs_differ(planted: ModuleType) -> None:
    x = torch.randn(32, requires_grad=True)
    old_grad = torch.full_like(x, 9.0)
    x.grad = old_grad
    _seed_everything(3)
    expected = _draw()
    _seed_everything(3)
    calls = itertools.count()

    def fails_in_run_1(t: torch.Tensor) -> torch.Tensor:
        torch.rand(100)
        random.random()
        np.random.rand(7)
        if next(calls) == 1:
            raise ValueError("boom in run 1")
        return t * 2

    with pytest.raises(ValueError, match="boom in run 1"):
        assert_reproducible(fails_in_run_1, x, seed=1)
    assert x.grad is old_grad
    with pytest.raises(NotReproducibleError, match=r"grad of args\[0\]"):
        assert_reproducible(lambda t: (torch.rand(4), planted.spread(t, 16)), x, seed=None)
    assert x.grad is old_grad
    assert torch.equal(old_grad, torch.full_like(x, 9.0))
    after = _draw()
    assert torch.equal(after[0], expected[0])
    assert after[1:] == expected[1:]


def test_fn_runs_under_the_active_flags(deterministic_mode_off: None) -> None:
    seen: list[tuple[bool, bool]] = []

    def fn() -> torch.Tensor:
        seen.append(_det_flags())
        return torch.ones(2).cumsum(0)

    torch.use_deterministic_algorithms(False)
    with override_flags({"deterministic_algorithms": True}):
        assert_reproducible(fn, runs=2)
        # An op without a deterministic kernel raises torch's error, not a reproducibility one.
        with pytest.raises(RuntimeError, match=ALERT):
            assert_reproducible(_put, runs=2)
    assert seen == [(True, False), (True, False)]
    assert _det_flags() == (False, False)


# --- expect_nondeterministic_alert ----------------------------------------------


@pytest.mark.parametrize(
    ("before", "fn", "should_alert"),
    [
        ((False, False), _put, True),
        ((True, True), _put, True),
        ((True, False), lambda: torch.ones(4).cumsum(0), False),
    ],
    ids=["alert-from-off", "alert-from-warn-only", "quiet-from-on"],
)
def test_fn_runs_once_per_mode_and_flags_come_back(
    deterministic_mode_off: None,
    before: tuple[bool, bool],
    fn: object,
    should_alert: bool,
) -> None:
    seen: list[tuple[bool, bool]] = []

    def recorded() -> object:
        seen.append(_det_flags())
        return fn()  # type: ignore[operator]

    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    expect_nondeterministic_alert(recorded, should_alert=should_alert)
    assert seen == [(True, False), (True, True)]
    assert _det_flags() == before


def _alerts_only_in_warn_only_mode() -> None:
    if torch.is_deterministic_algorithms_warn_only_enabled():
        _put()


def _forces_errors_on() -> None:
    # Switches warn_only off behind the harness's back: the alert raises in both modes.
    torch.use_deterministic_algorithms(True)
    _put()


@pytest.mark.parametrize(
    ("fn", "should_alert", "message"),
    [
        (_put, False, f"expected no nondeterministic-op alert under {RAISING}, but fn raised: "),
        (
            _alerts_only_in_warn_only_mode,
            False,
            f"expected no nondeterministic-op alert under {WARNING}, but fn warned: ",
        ),
        (
            lambda: torch.ones(3).neg(),
            True,
            f"expected fn to raise the {ALERT!r} RuntimeError under {RAISING}, "
            "but it returned normally",
        ),
        (_forces_errors_on, True, f"expected only a warning under {WARNING}, but fn raised: "),
    ],
    ids=["raised-unexpectedly", "warned-unexpectedly", "no-error", "raised-in-warn-only"],
)
def test_broken_expectation_names_the_mode(
    deterministic_mode_off: None, fn: object, should_alert: bool, message: str
) -> None:
    torch.use_deterministic_algorithms(False)
    with pytest.raises(AlertExpectationError) as info:
        expect_nondeterministic_alert(fn, should_alert=should_alert)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)
    assert isinstance(info.value, DeterminismError)
    assert isinstance(info.value, AssertionError)
    if "fn raised" in message or "fn warned" in message:
        assert ALERT in str(info.value)  # torch's own text is quoted
    if "fn raised" in message:
        assert isinstance(info.value.__cause__, RuntimeError)
    assert _det_flags() == (False, False)


def test_alert_warnings_are_consumed_and_other_warnings_reemitted() -> None:
    def fn() -> None:
        warnings.warn("unrelated advice", UserWarning, stacklevel=1)
        _put()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expect_nondeterministic_alert(fn)
    messages = [str(w.message) for w in caught]
    # Once from the raising call, once re-emitted from the warn_only call.
    assert messages.count("unrelated advice") == 2
    assert not [m for m in messages if ALERT in m]


def test_other_errors_in_warn_only_mode_propagate_and_flags_come_back(
    deterministic_mode_off: None,
) -> None:
    def fn() -> None:
        if torch.is_deterministic_algorithms_warn_only_enabled():
            raise RuntimeError("device lost")
        _put()

    torch.use_deterministic_algorithms(False)
    with pytest.raises(RuntimeError, match="device lost"):
        expect_nondeterministic_alert(fn)
    assert _det_flags() == (False, False)


# --- census and baseline files, end to end ---------------------------------------

SUITE = """
import pytest
import torch

pytestmark = pytest.mark.backends(deterministic="on")

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_noisy(dtype):
    torch.ops.pbtest.noisy(torch.ones(4, dtype=dtype))

def test_noisy_again():
    torch.ops.pbtest.noisy(torch.ones(4) * 3)

def test_clean():
    torch.ones(3).neg()
"""

UNSELECTED = """
import torch

def test_unmarked():
    torch.ops.pbtest.noisy(torch.ones(2, dtype=torch.float16))
"""

FAILS_FIRST = """
import pytest
import torch

@pytest.mark.backends(deterministic="on")
def test_fails_first():
    torch.ones(2, dtype=torch.int64).neg()
    assert False, "broken in run 0"
"""

OLD_BASELINE = {
    "format": "pytest-backends-baseline",
    "version": 1,
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "accepted": [
        {"op": "pbtest::noisy", "device": "cpu", "dtype": "float64", "note": "planted"},
        {"op": "aten::neg", "device": "cpu", "note": "fixed upstream"},
        {"op": "aten::scatter_add_", "device": "cuda", "note": "gpu shard"},
    ],
}


def _rows(census: dict[str, object]) -> dict[tuple[str, str, str], dict[str, object]]:
    entries = census["entries"]
    assert isinstance(entries, list)
    keys = [(e["op"], e["device"], e["dtype"]) for e in entries]
    assert keys == sorted(keys), "entries are sorted"
    assert len(keys) == len(set(keys)), "one row per (op, device, dtype)"
    return dict(zip(keys, entries))


def test_census_rows_and_baseline_update_then_gate(planted_conftest: pytest.Pytester) -> None:
    pytester = planted_conftest
    pytester.makepyfile(test_ops=SUITE, test_unselected=UNSELECTED)
    baseline_path = pytester.path / "baseline.json"
    baseline_path.write_text(json.dumps(OLD_BASELINE))

    # 1. Update an old baseline while writing the census.
    result = pytester.runpytest_subprocess(
        "--backends-determinism=3",
        "--backends-census=census.json",
        "--backends-label=ci-job-1",
        "--backends-baseline=baseline.json",
        "--backends-baseline-update",
    )
    result.assert_outcomes(passed=5)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*BaselineVersionWarning: baseline *baseline.json was recorded under "
            f"torch 2.11.0+cu130 (CUDA 13.0), but this run uses torch {torch.__version__} "
            "(CUDA *); which kernels are nondeterministic can change between versions. "
            "Refresh it with --backends-baseline-update.",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*= determinism =*",
            "pbtest::noisy (cpu, float32): added to the baseline; in "
            "test_ops.py::test_noisy[[]f32[]], test_ops.py::test_noisy_again",
            "pbtest::noisy (cpu, float64): accepted by the baseline; in "
            "test_ops.py::test_noisy[[]f64[]]",
            "census written to *census.json",
            "baseline updated: *baseline.json (a run only adds ops;*",
        ]
    )

    census = json.loads((pytester.path / "census.json").read_text())
    header = {k: census[k] for k in ("format", "version", "torch", "cuda", "runs", "label")}
    assert header == {
        "format": "pytest-backends-census",
        "version": 1,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "runs": 3,
        "label": "ci-job-1",
    }
    assert (census["not_checked"], census["boundary"]) == ({}, {})
    rows = _rows(census)
    assert rows[("pbtest::noisy", "cpu", "float32")] == {
        "op": "pbtest::noisy",
        "device": "cpu",
        "dtype": "float32",
        "verdict": "nondeterministic",
        "observations": {"nondeterministic": 2},
        "tests": ["test_ops.py::test_noisy[f32]", "test_ops.py::test_noisy_again"],
        "nondeterministic_in": ["test_ops.py::test_noisy[f32]", "test_ops.py::test_noisy_again"],
        "evidence": "seen to differ from identical inputs in 2 test(s)",
    }
    assert rows[("pbtest::noisy", "cpu", "float64")]["tests"] == ["test_ops.py::test_noisy[f64]"]
    ones = rows[("aten::ones", "cpu", "float32")]
    assert ones["verdict"] == "deterministic"
    # Not seen to differ is not proof: the evidence says so, with the number of runs.
    assert (
        ones["evidence"] == "no difference in 3 runs (in each of 3 test(s)); a sample, not a proof"
    )
    assert ones["observations"] == {"deterministic": 3}
    assert "nondeterministic_in" not in ones
    assert ones["tests"] == [
        "test_ops.py::test_clean",
        "test_ops.py::test_noisy[f32]",
        "test_ops.py::test_noisy_again",
    ]
    assert rows[("aten::neg", "cpu", "float32")]["tests"] == ["test_ops.py::test_clean"]
    # Tests not selected for the check are not in the census.
    assert ("pbtest::noisy", "cpu", "float16") not in rows
    assert not [e for e in census["entries"] if "test_unselected.py::test_unmarked" in e["tests"]]

    baseline = json.loads(baseline_path.read_text())
    assert (baseline["torch"], baseline["cuda"]) == (torch.__version__, torch.version.cuda)
    # Only added: every old entry stays with its note, seen or not, deterministic or not.
    assert baseline["accepted"] == [
        {"op": "aten::neg", "device": "cpu", "note": "fixed upstream"},
        {"op": "aten::scatter_add_", "device": "cuda", "note": "gpu shard"},
        {"op": "pbtest::noisy", "device": "cpu", "dtype": "float32"},
        {"op": "pbtest::noisy", "device": "cpu", "dtype": "float64", "note": "planted"},
    ]

    # 2. Gate on the refreshed baseline: no version warning, every op accepted, file untouched.
    written = baseline_path.read_bytes()
    result = pytester.runpytest_subprocess(
        "--backends-determinism=2",
        "--backends-census=census2.json",
        "--backends-baseline=baseline.json",
    )
    result.assert_outcomes(passed=5)
    assert result.ret == pytest.ExitCode.OK
    assert "BaselineVersionWarning" not in result.stdout.str()
    result.stdout.fnmatch_lines(["every nondeterministic op is in the baseline *baseline.json"])
    assert baseline_path.read_bytes() == written
    census2 = json.loads((pytester.path / "census2.json").read_text())
    assert census2["runs"] == 2
    assert _rows(census2).keys() == rows.keys()


def test_ops_of_a_test_failing_in_its_first_run_are_inconclusive(
    planted_conftest: pytest.Pytester,
) -> None:
    pytester = planted_conftest
    pytester.makepyfile(test_fails=FAILS_FIRST)
    result = pytester.runpytest_subprocess(
        "--backends-determinism=3", "--backends-census=census.json"
    )
    result.assert_outcomes(failed=1)
    rows = _rows(json.loads((pytester.path / "census.json").read_text()))
    neg = rows[("aten::neg", "cpu", "int64")]
    assert neg["tests"] == ["test_fails.py::test_fails_first"]
    assert neg["observations"] == {"inconclusive": 1}
    assert neg["verdict"] == "inconclusive"


# Runs that stop at configuration touch no torch state: they run in-process.


def _baseline_text(**overrides: object) -> str:
    data = dict(OLD_BASELINE, torch=torch.__version__, cuda=torch.version.cuda)
    data.update(overrides)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        (
            json.dumps({"format": "pytest-backends-census", "version": 1, "entries": []}),
            "'format' must be 'pytest-backends-baseline', got 'pytest-backends-census' "
            "(it is a census file)",
        ),
        (
            _baseline_text(accepted=[{"op": "aten::put_", "device": "cpu", "dtyp": "float32"}]),
            "accepted[0] has unknown field(s) 'dtyp'; allowed: op, device, dtype, note",
        ),
        (
            _baseline_text(version=2),
            "has format version 2, but this pytest-backends reads versions up to 1; "
            "upgrade pytest-backends",
        ),
        (
            _baseline_text(accepted=[{"op": "aten::put_", "device": ""}]),
            "accepted[0]: 'device' must be a non-empty string such as 'cuda', got ''",
        ),
    ],
    ids=["census-file", "unknown-field", "newer-version", "empty-device"],
)
@pytest.mark.parametrize("update", [False, True], ids=["check", "update"])
def test_malformed_baseline_is_a_usage_error_naming_file_and_fix(
    pytester: pytest.Pytester, text: str, what: str, update: bool
) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    path = pytester.path / "ci" / "baseline.json"
    path.parent.mkdir()
    path.write_text(text)
    # A relative ini path is resolved against the root directory.
    pytester.makeini(
        "[pytest]\nbackends_baseline = ci/baseline.json\n"
        f"backends_baseline_update = {'true' if update else 'false'}\n"
    )
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert f"--backends-baseline: baseline file {path}" in err
    assert what in err
    assert "INTERNALERROR" not in result.stdout.str() + err
    assert "test_a" not in result.stdout.str()
    # Even with --backends-baseline-update, a file that cannot be read is never overwritten.
    assert path.read_text() == text
