"""What users rely on in the public tolerance API: validation, messages, references, effects.

Covers :func:`pytest_backends.assert_close`, :func:`~pytest_backends.tolerance_for`,
:func:`~pytest_backends.reference`, :func:`pytest_backends.tolerance.kernel_precision`
and :func:`~pytest_backends.flag_effect` as docs/reference/tolerance.rst describes
them.  Expectations come from the model itself (``tolerance_for``) or from what
torch computes on this machine, never from assumed CPU features.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from pytest_backends import (
    assert_close,
    flag_effect,
    override_flags,
    reference,
    snapshot_flags,
    tolerance_for,
)
from pytest_backends.tolerance import OP_FAMILIES, kernel_precision

MATMUL_ROW = "mkldnn.matmul.fp32_precision"


def _precision() -> object:
    return snapshot_flags()[MATMUL_ROW]


def _bound_at_one(dtype: torch.dtype) -> float:
    """The elementwise bound of an unnamed op for ``|expected| == 1``."""
    tol = tolerance_for(dtype)
    return tol.atol + tol.rtol


# ------------------------------------------------------------ argument checks

_FAMILIES = "choose one of " + ", ".join(map(repr, OP_FAMILIES))

SHARED_BAD_ARGUMENTS = [
    pytest.param({"op": "linear"}, f"unknown op 'linear'; {_FAMILIES}", id="op-unknown"),
    pytest.param({"op": "Matmul"}, f"unknown op 'Matmul'; {_FAMILIES}", id="op-case"),
    pytest.param({"op": 3}, f"unknown op 3; {_FAMILIES}", id="op-not-str"),
    pytest.param({"k": 2.0}, "k must be a positive int .*got 2.0", id="k-float"),
    pytest.param({"k": "8"}, "k must be a positive int .*got '8'", id="k-str"),
    pytest.param({"k": False}, "k must be a positive int .*got False", id="k-bool"),
    pytest.param({"k": 0}, "k must be a positive int .*got 0; use k=1", id="k-zero"),
    pytest.param(
        {"op": "elementwise", "k": 2},
        "op='elementwise' has no reduction, so k must be 1, got 2",
        id="elementwise-k",
    ),
    pytest.param({"scale": 0.0}, "scale must be a positive finite number, got 0.0", id="scale-0"),
    pytest.param({"scale": -1}, "scale must be a positive finite number, got -1", id="scale-neg"),
    pytest.param({"scale": math.inf}, "scale must be a positive finite number, got inf", id="inf"),
    pytest.param({"scale": math.nan}, "scale must be a positive finite number, got nan", id="nan"),
    pytest.param({"scale": True}, "scale must be a positive finite number, got True", id="bool"),
    pytest.param({"scale": "2"}, "scale must be a positive finite number, got '2'", id="str"),
]

TOLERANCE_BAD_ARGUMENTS = [
    pytest.param({"rtol": -1e-9}, "rtol must be a non-negative number, got -1e-09", id="rtol-neg"),
    pytest.param({"rtol": math.nan}, "rtol must be a non-negative number, got nan", id="rtol-nan"),
    pytest.param({"rtol": True}, "rtol must be a non-negative number, got True", id="rtol-bool"),
    pytest.param({"rtol": "0.1"}, "rtol must be a non-negative number, got '0.1'", id="rtol-s"),
    pytest.param({"atol": -1}, "atol must be a non-negative number, got -1", id="atol-neg"),
    pytest.param({"atol": math.nan}, "atol must be a non-negative number, got nan", id="atol-nan"),
    pytest.param({"atol": False}, "atol must be a non-negative number, got False", id="atol-bool"),
    pytest.param({"atol": [0.1]}, r"atol must be a non-negative number, got \[0.1\]", id="list"),
]


@pytest.mark.parametrize(("kwargs", "pattern"), SHARED_BAD_ARGUMENTS + TOLERANCE_BAD_ARGUMENTS)
def test_assert_close_rejects_bad_arguments_before_comparing(
    kwargs: dict[str, object], pattern: str
) -> None:
    # the values differ: a ValueError (not an AssertionError) shows the check came first
    before = snapshot_flags()
    with pytest.raises(ValueError, match=pattern):
        assert_close(torch.ones(3), torch.zeros(3), **kwargs)  # type: ignore[arg-type]
    assert snapshot_flags() == before


@pytest.mark.parametrize(("kwargs", "pattern"), SHARED_BAD_ARGUMENTS)
def test_tolerance_for_rejects_the_same_arguments_alike(
    kwargs: dict[str, object], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        tolerance_for(torch.float32, **kwargs)  # type: ignore[arg-type]


def test_boundary_arguments_are_accepted() -> None:
    x = torch.tensor([1.0, -2.0, 0.5])
    # ints are numbers too; zero tolerances demand equality
    assert_close(x, x.clone(), rtol=0, atol=0, k=None, scale=1)
    with pytest.raises(AssertionError):
        assert_close(x, torch.nextafter(x, x + 1), rtol=0, atol=0)
    assert tolerance_for(torch.float32, op="matmul", k=None) == tolerance_for(
        torch.float32, op="matmul", k=1
    )
    assert tolerance_for("torch.float16", device="cpu:0") == tolerance_for(torch.float16)
    assert tolerance_for(torch.float32, op="elementwise", k=1).k == 1


# ------------------------------------------------------------ failure message


def test_failure_message_states_dtype_device_op_k_scale_flags_and_bound() -> None:
    gen = torch.Generator().manual_seed(11)
    a, b = torch.randn(8, 64, generator=gen).half(), torch.randn(64, 8, generator=gen).half()
    expected = a @ b
    with pytest.raises(AssertionError) as info:
        assert_close(expected * 1.25, expected, op="matmul", k=64, scale=4)
    text = str(info.value)
    tol = tolerance_for(torch.float16, op="matmul", k=64, scale=4)
    fp16_flag = "cpu.allow_fp16_reduced_precision_reduction"
    assert text.startswith("Tensor-likes are not close!")  # torch's report comes first
    assert tol.describe() in text
    for part in (
        "float16 on cpu",
        "op='matmul'",
        "k=64",
        "scale=4",
        f"flags consulted: {fp16_flag}={snapshot_flags()[fp16_flag]!r}",
        "bound: |actual - expected| <= atol + rtol * |expected|",
        f"rtol={tol.rtol:.3g}, atol={tol.atol:.3g}",
    ):
        assert part in text, part
    assert "k=1 assumed" not in text  # k was given


def test_failure_message_of_an_unnamed_op_lists_every_precision_flag() -> None:
    before = snapshot_flags()
    with pytest.raises(AssertionError) as info:
        assert_close(torch.ones(4), torch.full((4,), 2.0))
    text = str(info.value)
    assert "op=None (any op: every precision flag counts)" in text
    for name in (
        "mkldnn.enabled",
        "mkldnn.matmul.fp32_precision",
        "mkldnn.conv.fp32_precision",
        "mkldnn.rnn.fp32_precision",
    ):
        assert f"{name}={before[name]!r}" in text, name
    assert "k=1 assumed: pass k=<reduction length>" in text
    with pytest.raises(AssertionError) as info:
        assert_close(torch.ones(4), torch.full((4,), 2.0), op="elementwise")
    assert "op='elementwise'" in str(info.value)
    assert "k=1 assumed" not in str(info.value)  # an elementwise op has no reduction
    assert snapshot_flags() == before


def test_failure_message_says_which_explicit_values_replaced_the_model() -> None:
    with pytest.raises(AssertionError) as info:
        assert_close(torch.ones(2), torch.full((2,), 1.5), rtol=0, atol=1e-3)
    assert "explicit rtol=0, atol=0.001 replaced the model's value" in str(info.value)


def test_a_callable_msg_receives_torchs_report_and_replaces_the_message() -> None:
    seen: list[str] = []

    def msg(generated: str) -> str:
        seen.append(generated)
        return "custom verdict"

    with pytest.raises(AssertionError) as info:
        assert_close(torch.ones(2), torch.zeros(2), msg=msg)
    assert str(info.value) == "custom verdict"
    assert len(seen) == 1 and "Tensor-likes are not close" in seen[0]


def test_other_keywords_reach_torch() -> None:
    nan = torch.tensor([math.nan, 1.0])
    with pytest.raises(AssertionError):
        assert_close(nan, nan.clone())
    assert_close(nan, nan.clone(), equal_nan=True)
    strided = torch.ones(4, 2).t()
    assert_close(strided, strided.contiguous())
    with pytest.raises(AssertionError, match="stride"):
        assert_close(strided, strided.contiguous(), check_stride=True)


# ------------------------------------------------------- explicit tolerances


def test_explicit_rtol_keeps_the_models_atol() -> None:
    tol = tolerance_for(torch.float32, op="matmul", k=64)
    zeros = torch.zeros(4)  # |expected| = 0: only atol counts
    assert_close(torch.full((4,), tol.atol / 2), zeros, op="matmul", k=64, rtol=0.0)
    with pytest.raises(AssertionError):
        assert_close(torch.full((4,), tol.atol * 2), zeros, op="matmul", k=64, rtol=1.0)


def test_explicit_atol_keeps_the_models_rtol() -> None:
    tol = tolerance_for(torch.float32, op="matmul", k=64)
    expected = torch.full((4,), 1000.0)  # the rtol term is 1000 rtol, far above fp32 rounding
    inside = torch.full((4,), 1000.0 * (1 + tol.rtol / 2))
    outside = torch.full((4,), 1000.0 * (1 + tol.rtol * 2))
    assert_close(inside, expected, op="matmul", k=64, atol=0)
    with pytest.raises(AssertionError):
        assert_close(outside, expected, op="matmul", k=64, atol=0)


def test_explicit_values_win_over_a_wide_worst_case() -> None:
    expected = torch.linspace(-2, 2, 16)
    off = expected + 1e-3
    with override_flags({MATMUL_ROW: "bf16"}):
        worst = tolerance_for(torch.float32, op="matmul", k=1024, kernel=False)
        assert worst.atol > 1e-3  # the model alone would accept the offset
        assert_close(off, expected, op="matmul", k=1024, kernel=False)
        with pytest.raises(AssertionError, match=r"explicit rtol=0, atol=0\.0001 replaced"):
            assert_close(off, expected, op="matmul", k=1024, kernel=False, rtol=0, atol=1e-4)


# ---------------------------------------------------------- wider references


def test_wider_reference_is_compared_in_the_references_dtype() -> None:
    x = torch.tensor([1.0, 3.0, 0.1, -7.5])
    with pytest.raises(AssertionError, match="dtype"):
        torch.testing.assert_close(x, x.double())  # torch alone refuses the pair
    assert_close(x, x.double(), rtol=0, atol=0)
    # below half an fp32 ulp: invisible once the reference is rounded to fp32
    nudged = x.double() * (1 + 2.0**-40)
    assert torch.equal(nudged.float(), x)
    with pytest.raises(AssertionError, match="Tensor-likes are not equal"):
        assert_close(x, nudged, rtol=0, atol=0)


def test_wider_reference_keeps_the_actuals_bound() -> None:
    delta = 2.0**-20
    assert _bound_at_one(torch.float64) < delta < _bound_at_one(torch.float32)
    expected = torch.ones(3, dtype=torch.float64)
    assert_close(torch.full((3,), 1 + delta), expected)  # the fp32 bound, not the fp64 one
    with pytest.raises(AssertionError) as info:
        assert_close(torch.full((3,), 1 + 2.0**-10), expected)
    assert "float32 on cpu" in str(info.value)


def test_narrower_or_unrelated_expected_is_still_a_dtype_mismatch() -> None:
    x = torch.ones(3)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(x.double(), x)  # the reference is the narrower one
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(torch.ones(3, dtype=torch.int64), x.double())
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(x, x.to(torch.complex128))


def test_half_and_complex_results_against_reference() -> None:
    gen = torch.Generator().manual_seed(12)
    a, b = torch.randn(16, 128, generator=gen), torch.randn(128, 16, generator=gen)
    half_ref = reference(torch.matmul, a.half(), b.half())
    assert half_ref.dtype == torch.float64
    assert_close(a.half() @ b.half(), half_ref, op="matmul", k=128)
    ca = torch.complex(a, a.flip(0))
    cb = torch.complex(b, -b)
    complex_ref = reference(torch.matmul, ca, cb)
    assert complex_ref.dtype == torch.complex128
    actual = ca @ cb
    assert_close(actual, complex_ref, op="matmul", k=128)
    worse = complex_ref + 1000 * (actual.to(torch.complex128) - complex_ref) + 1e-2
    with pytest.raises(AssertionError, match="complex64 on cpu"):
        assert_close(worse.to(torch.complex64), complex_ref, op="matmul", k=128)


# --------------------------------------------------------- nested containers

# 1 + delta is exact in the leaf's dtype and inside that dtype's bound
OWN_DELTA = {
    torch.float16: 2.0**-10,
    torch.bfloat16: 2.0**-7,
    torch.float32: 2.0**-20,
    torch.float64: 2.0**-30,
}


def _nested(deltas: dict[torch.dtype, float], count: int = 0) -> dict[str, object]:
    def leaf(dtype: torch.dtype) -> torch.Tensor:
        return torch.full((4,), 1.0 + deltas.get(dtype, 0.0), dtype=dtype)

    return {
        "low": [leaf(torch.float16), leaf(torch.bfloat16)],
        "high": [leaf(torch.float32), (leaf(torch.float64), 2.5)],
        "count": [torch.arange(4) + count, 7],
    }


def test_mixed_nested_containers_use_each_leafs_own_bound() -> None:
    for dtype, delta in OWN_DELTA.items():
        assert delta < _bound_at_one(dtype), dtype
    expected = _nested({})
    assert_close(_nested(OWN_DELTA), expected)


@pytest.mark.parametrize(
    ("dtype", "delta", "where"),
    [
        (torch.float16, OWN_DELTA[torch.bfloat16], "['low'][0]"),
        (torch.float32, OWN_DELTA[torch.float16], "['high'][0]"),
        (torch.float64, OWN_DELTA[torch.float32], "['high'][1][0]"),
    ],
    ids=["float16", "float32", "float64"],
)
def test_a_wider_error_fails_only_its_own_leaf(
    dtype: torch.dtype, delta: float, where: str
) -> None:
    assert delta > _bound_at_one(dtype)  # fine for a narrower dtype, too much for this one
    with pytest.raises(AssertionError) as info:
        assert_close(_nested({**OWN_DELTA, dtype: delta}), _nested({}))
    text = str(info.value)
    assert f"compared element: {where}" in text
    assert f"{str(dtype).removeprefix('torch.')} on cpu" in text


def test_integer_and_plain_leaves_are_exact() -> None:
    with pytest.raises(AssertionError) as info:
        assert_close(_nested({}, count=1), _nested({}))
    assert "compared element: ['count'][0]" in str(info.value)
    assert "int64 on cpu" in str(info.value)
    changed = _nested({})
    changed["count"] = [torch.arange(4), 8]
    with pytest.raises(AssertionError):
        assert_close(changed, _nested({}))
    shorter = _nested({})
    shorter["low"] = [torch.ones(4, dtype=torch.float16)]
    with pytest.raises(AssertionError, match=r"lengths differ at \['low'\]: 1 != 2"):
        assert_close(shorter, _nested({}))


# ------------------------------------------------------------------ reference


def test_reference_runs_fn_in_float64_without_autograd() -> None:
    seen: dict[str, object] = {}
    x = torch.randn(3, requires_grad=True)
    c = torch.randn(3, dtype=torch.complex64)

    def fn(t: torch.Tensor, nested: dict[str, object], *, extra: tuple[object, ...]) -> object:
        seen["default"] = torch.get_default_dtype()
        seen["grad"] = torch.is_grad_enabled()
        seen["t"] = t.dtype
        seen["nested"] = [v.dtype for v in nested["pair"]]  # type: ignore[attr-defined]
        seen["extra"] = [e.dtype if isinstance(e, torch.Tensor) else e for e in extra]
        seen["created"] = torch.ones(1).dtype
        return (t * 2).sum()

    nested = {"pair": [x.detach().half(), c]}
    extra = (torch.arange(3), torch.tensor([True]), "label", torch.zeros(2, dtype=torch.bfloat16))
    before = snapshot_flags()
    out = reference(fn, x, nested, extra=extra)
    assert seen == {
        "default": torch.float64,
        "grad": False,
        "t": torch.float64,
        "nested": [torch.float64, torch.complex128],
        "extra": [torch.int64, torch.bool, "label", torch.float64],
        "created": torch.float64,
    }
    assert out.dtype == torch.float64 and not out.requires_grad
    assert float(out) == float((x.detach().double() * 2).sum())
    assert x.dtype == torch.float32 and c.dtype == torch.complex64  # inputs untouched
    assert snapshot_flags() == before


class _Boom(Exception):
    pass


def test_reference_restores_every_flag_when_fn_raises() -> None:
    before = snapshot_flags()
    inside: dict[str, object] = {}

    def fn(t: torch.Tensor) -> torch.Tensor:
        inside.update(snapshot_flags())
        torch.use_deterministic_algorithms(True)  # fn changes a flag, then fails
        raise _Boom("fn failed")

    with pytest.raises(_Boom, match="fn failed"):
        reference(fn, torch.ones(2))
    assert inside["default_dtype"] == "float64"
    assert inside["autograd.grad_enabled"] is False
    assert snapshot_flags() == before
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()


def test_reference_ignores_reduced_precision_flags() -> None:
    gen = torch.Generator().manual_seed(13)
    a, b = torch.randn(64, 512, generator=gen), torch.randn(512, 32, generator=gen)
    exact = a.double() @ b.double()
    for value in ("bf16", "tf32"):
        with override_flags({MATMUL_ROW: value, "mkldnn.conv.fp32_precision": value}):
            assert torch.equal(reference(torch.matmul, a, b), exact), value


def test_reference_module_argument_is_a_float64_copy() -> None:
    torch.manual_seed(14)
    norm = torch.nn.BatchNorm1d(4)  # training mode: a call updates the running stats
    x = torch.randn(8, 4) * 3 + 1
    out = reference(lambda module, t: module(t), norm, x)
    assert out.dtype == torch.float64
    buffers = dict(norm.named_buffers())
    assert torch.equal(buffers["running_mean"], torch.zeros(4))  # the copy ran, not this module
    assert int(buffers["num_batches_tracked"]) == 0
    assert norm.weight.dtype == torch.float32
    assert_close(norm(x), out, op="reduction", k=8)


# ---------------------------------------------------------- kernel precision

PROBED = [
    (MATMUL_ROW, "bf16", "matmul"),
    (MATMUL_ROW, "tf32", "matmul"),
    ("mkldnn.conv.fp32_precision", "bf16", "conv"),
    ("mkldnn.rnn.fp32_precision", "bf16", "rnn"),
]


@pytest.mark.parametrize(("row", "mode", "family"), PROBED)
def test_kernel_precision_agrees_with_tolerance_for(row: str, mode: str, family: str) -> None:
    before = snapshot_flags()
    used, source, why = kernel_precision("cpu", row, mode)
    assert snapshot_flags() == before
    assert isinstance(used, bool) and source == "probe"
    assert why.startswith(f"probe: a {family} on this machine moved by ")
    assert why.endswith(f"not {mode}-sized") == (not used)
    assert kernel_precision("cpu", row, mode) == (used, source, why)  # one answer per process
    tol = tolerance_for(torch.float32, op=family, flags={row: mode})
    assert tol.precision_source == source
    assert any(line.startswith(f"inputs rounded to {mode}") for line in tol.path) == used
    if not used:
        assert any(why in line and "fp32 arithmetic" in line for line in tol.path), tol.path
    worst = tolerance_for(torch.float32, op=family, flags={row: mode}, kernel=False)
    assert worst.precision_source == "worst case"
    assert any(line.startswith(f"inputs rounded to {mode}") for line in worst.path)
    assert worst.atol >= tol.atol
    assert snapshot_flags() == before


def test_kernel_precision_takes_the_worst_case_where_no_probe_can_run() -> None:
    devices = ["meta"] + ([] if torch.cuda.is_available() else ["cuda"])
    for device in devices:
        row = MATMUL_ROW if device == "meta" else "cuda.matmul.fp32_precision"
        used, source, why = kernel_precision(device, row, "tf32")
        assert (used, source) == (True, "worst case"), device
        assert f"no {device} probe could run" in why


def test_kernel_precision_of_a_disabled_library_is_full_precision() -> None:
    before = snapshot_flags()
    used, source, why = kernel_precision("cpu", MATMUL_ROW, "bf16", {"mkldnn.enabled": False})
    assert (used, source) == (False, "probe")
    assert "not bf16-sized" in why
    assert snapshot_flags() == before  # the overlay was only laid over the probe


# ---------------------------------------------------------------- flag_effect


def _by_precision(table: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
    def fn() -> torch.Tensor:
        return table[str(_precision())].clone()

    return fn


def test_flag_effect_groups_and_measures_per_value() -> None:
    base = torch.tensor([3.0, 4.0, math.nan])
    table = {"ieee": base, "tf32": torch.tensor([3.0, 4.5, math.nan]), "bf16": base.clone()}
    before = snapshot_flags()
    effect = flag_effect(_by_precision(table), MATMUL_ROW, ["ieee", "tf32", "bf16", "tf32"])
    assert snapshot_flags() == before
    assert effect.values == ("ieee", "tf32", "bf16", "tf32")
    assert effect.groups == (("ieee", "bf16"), ("tf32", "tf32"))  # order of first appearance
    assert effect.has_effect and bool(effect) and effect.verdict == "effect"
    assert effect.max_abs_diff == (0.0, 0.5, 0.0, 0.5)  # NaN == NaN by bits, not counted
    assert effect.max_rel_diff == pytest.approx((0.0, 0.1, 0.0, 0.1))
    assert effect.size == pytest.approx(0.1)
    assert "outputs differ between groups 'ieee', 'bf16' | 'tf32', 'tf32'" in str(effect)


def test_flag_effect_with_no_difference_is_falsy() -> None:
    effect = flag_effect(lambda: torch.arange(4) * 2, MATMUL_ROW, iter(["bf16", "ieee"]))
    assert effect.values == ("bf16", "ieee")  # any iterable, consumed once
    assert effect.groups == (("bf16", "ieee"),)
    assert not effect and effect.verdict == "no effect"
    assert effect.max_abs_diff == (0.0, 0.0) and effect.size == 0.0


def test_flag_effect_compares_dtypes_and_shapes() -> None:
    effect = flag_effect(lambda: torch.full((2,), 0.1), "default_dtype", ["float64", "float32"])
    assert effect.groups == (("float64",), ("float32",))  # the same values, another dtype
    fp32_error = abs(float(torch.tensor(0.1, dtype=torch.float32)) - 0.1)
    assert effect.max_abs_diff == pytest.approx((0.0, fp32_error))
    shapes = {"ieee": torch.zeros(2), "bf16": torch.zeros(3)}
    reshaped = flag_effect(_by_precision(shapes), MATMUL_ROW, ["ieee", "bf16"])
    assert reshaped.has_effect
    assert reshaped.max_abs_diff == (0.0, None)  # not comparable elementwise
    assert reshaped.max_rel_diff == (0.0, None)


def test_flag_effect_check_reproducible_catches_a_python_counter() -> None:
    calls: list[object] = []

    def counter() -> dict[str, object]:
        calls.append(_precision())
        return {"out": torch.ones(2), "calls": len(calls)}  # a plain leaf that never repeats

    effect = flag_effect(counter, MATMUL_ROW, ["ieee", "bf16"])
    assert calls == ["ieee", "bf16", "ieee"]  # once per value, then once more under the first
    assert not effect.reproducible and effect.verdict == "not reproducible"
    assert not effect and not effect.has_effect
    assert "not reproducible: two runs under 'ieee'" in str(effect)
    calls.clear()
    unchecked = flag_effect(counter, MATMUL_ROW, ["ieee", "bf16"], check_reproducible=False)
    assert calls == ["ieee", "bf16"]
    assert unchecked.reproducible and unchecked.has_effect  # nobody looked twice


def test_flag_effect_restores_every_flag_when_fn_raises() -> None:
    before = snapshot_flags()
    calls: list[object] = []
    fail_on = [2]

    def fn() -> torch.Tensor:
        calls.append(_precision())
        torch.use_deterministic_algorithms(True)  # fn changes another flag on every call
        if len(calls) in fail_on:
            raise _Boom("second value failed")
        return torch.zeros(1)

    with pytest.raises(_Boom, match="second value failed"):
        flag_effect(fn, MATMUL_ROW, ["bf16", "tf32"])
    assert calls == ["bf16", "tf32"]
    assert snapshot_flags() == before
    calls.clear()
    fail_on.clear()
    assert not flag_effect(fn, MATMUL_ROW, ["ieee", "bf16"])
    assert calls == ["ieee", "bf16", "ieee"]
    assert snapshot_flags() == before  # also after a run that succeeded


@pytest.mark.parametrize(
    ("flag", "values", "pattern"),
    [
        ("mkldnn.matmul.fp32_precison", ["ieee", "bf16"], "Did you mean 'mkldnn.matmul.fp32_prec"),
        (MATMUL_ROW, ["ieee", "int8"], "expected one of 'ieee', 'tf32', 'bf16', 'none'"),
        ("num_threads", [1, 0], "invalid value for flag 'num_threads'"),
        (MATMUL_ROW, [], r"at least two distinct values for 'mkldnn.matmul.fp32_precision'"),
        (MATMUL_ROW, ["bf16", "bf16"], "at least two distinct values"),
        ("default_dtype", ["float64", torch.float64], "at least two distinct values"),
    ],
)
def test_flag_effect_bad_input_runs_nothing(flag: str, values: list[object], pattern: str) -> None:
    calls: list[int] = []

    def fn() -> torch.Tensor:
        calls.append(1)
        return torch.zeros(1)

    before = snapshot_flags()
    with pytest.raises(ValueError, match=pattern):
        flag_effect(fn, flag, values)
    assert calls == []
    assert snapshot_flags() == before
