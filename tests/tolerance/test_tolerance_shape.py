"""The bound follows the kernel that computed *this* result, shape by shape, by default.

oneDNN picks its kernel per shape: on an Intel Xeon with AMX, under
``mkldnn.matmul.fp32_precision="bf16"``, a 64x256 @ 256x64 matmul runs
``brg_matmul:avx10_1_512_amx`` in bf16 while 64x8 @ 8x64, 16x4096 @ 4096x16 and
4x1024 @ 1024x4 stay on ``brg_matmul:avx512_core`` in f32, and a matrix-vector
product may use no oneDNN at all.  A bound taken from one probe shape would be
bf16-wide (thousands of times the error) for the f32 ones.

The log-replay tests use lines oneDNN printed on that AMX machine, so their
branch is checked on any CPU; the measured tests run real matmuls and convs on
this machine and check that the bound is at most ~10x the worst error seen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from pytest_backends import assert_close, override_flags, reference, tolerance_for
from pytest_backends.kernels import PrimitiveLog, computes_shape, observe, parse_primitive
from pytest_backends.kernels import log as kernels_module

BF16 = {"mkldnn.matmul.fp32_precision": "bf16", "mkldnn.conv.fp32_precision": "bf16"}


def _matmul_line(impl: str, problem: str) -> str:
    return (
        f"onednn_verbose,v1,primitive,exec,cpu,matmul,{impl},undef,"
        "src:f32::blocked:ab::f0 wei:f32::blocked:ab::f0 dst:f32::blocked:ab::f0,"
        f"attr-scratchpad:user attr-fpmath:bf16,,{problem},0.05"
    )


AMX_LOG = (
    _matmul_line("brg_matmul:avx10_1_512_amx", "64x256:256x64"),
    _matmul_line("brg_matmul:avx512_core", "64x8:8x64"),
    _matmul_line("brg_matmul:avx512_core", "16x4096:4096x16"),
    _matmul_line("brg_matmul:avx512_core", "4x1024:1024x4"),
)


@pytest.fixture
def amx_log() -> Iterator[PrimitiveLog]:
    """The AMX machine's log as the active one (what the default capture would see)."""
    log = PrimitiveLog(_text="\n".join(AMX_LOG) + "\n")
    token = kernels_module._ACTIVE.set(log)
    yield log
    kernels_module._ACTIVE.reset(token)


def _reduced(tol: object) -> bool:
    return any(line.startswith("inputs rounded") for line in tol.path)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("result", "k", "reduced"),
    [((64, 64), 256, True), ((64, 64), 8, False), ((16, 16), 4096, False), ((4, 4), 1024, False)],
    ids=["64x256@256x64-amx-bf16", "64x8@8x64-f32", "16x4096@4096x16-f32", "4x1024@1024x4-f32"],
)
def test_the_log_answers_for_the_results_own_shape(
    amx_log: PrimitiveLog, result: tuple[int, int], k: int, reduced: bool
) -> None:
    with override_flags(BF16):
        tol = tolerance_for(torch.float32, op="matmul", k=k, shape=result)
    ieee = tolerance_for(
        torch.float32, op="matmul", k=k, flags={"mkldnn.matmul.fp32_precision": "ieee"}
    )
    assert tol.precision_source == "primitive log"
    assert _reduced(tol) is reduced, tol.describe()
    if not reduced:
        assert (tol.rtol, tol.atol) == (ieee.rtol, ieee.atol)
        assert any("brg_matmul:avx512_core" in line and "f32" in line for line in tol.path)
    else:
        assert tol.atol > 100 * ieee.atol


def test_a_matrix_vector_product_oneDNN_did_not_log_gets_a_same_shape_probe(
    amx_log: PrimitiveLog,
) -> None:
    # no primitive of this shape in the log: the probe of the same shape decides
    gen = torch.Generator().manual_seed(3)
    m, v = torch.randn(64, 256, generator=gen), torch.randn(256, generator=gen)
    with override_flags(BF16):
        out = m @ v
        tol = tolerance_for(torch.float32, op="matmul", k=256, shape=out.shape)
        assert tol.precision_source == "probe"
        assert any("of this shape" in line for line in tol.path), tol.describe()
        # where the probe saw an f32 kernel, the bound is the IEEE one
        if not _reduced(tol):
            ieee = tolerance_for(
                torch.float32, op="matmul", k=256, flags={"mkldnn.matmul.fp32_precision": "ieee"}
            )
            assert (tol.rtol, tol.atol) == (ieee.rtol, ieee.atol)
        assert_close(out, reference(torch.matmul, m, v), op="matmul", k=256)


def test_computes_shape_reads_matmul_and_conv_problems() -> None:
    mm = parse_primitive(_matmul_line("brg_matmul:avx512_core", "3x64x256:3x256x64"))
    assert mm is not None
    assert computes_shape(mm, (3, 64, 64), 256)
    assert not computes_shape(mm, (64, 64), 256)
    assert not computes_shape(mm, (3, 64, 64), 8)
    mv = parse_primitive(_matmul_line("brg_matmul:avx512_core", "64x256:256x1"))
    assert mv is not None and computes_shape(mv, (64,), 256)
    conv = parse_primitive(
        "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,"
        "forward_training,src:f32::blocked:acdb::f0 wei:f32::blocked:AcdB16b16a::f0 "
        "bia:undef::undef::: dst:f32::blocked:acdb::f0,attr-scratchpad:user attr-fpmath:bf16,"
        "alg:convolution_direct,mb2_ic64oc32_ih12oh10kh3sh1dh0ph0_iw12ow10kw3sw1dw0pw0,0.2"
    )
    assert conv is not None
    assert computes_shape(conv, (2, 32, 10, 10), 64 * 9)
    assert not computes_shape(conv, (2, 32, 10, 10), 64)
    assert not computes_shape(conv, (2, 16, 10, 10), 64 * 9)


def test_a_bad_shape_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="shape must be a sequence of non-negative ints"):
        tolerance_for(torch.float32, op="matmul", k=8, shape=(2, -1))


def test_the_worst_case_says_so_in_the_failure_message() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 64, generator=gen), torch.randn(64, 16, generator=gen)
    expected = reference(torch.matmul, a, b)
    with override_flags(BF16), pytest.raises(AssertionError) as info:
        assert_close((expected + 1.0).float(), expected, op="matmul", k=64, kernel=False)
    assert "precision from: worst case" in str(info.value)
    assert "may be far looser than needed" in str(info.value)


# --- measured: real matmuls and convs on this machine ------------------------------

Make = Callable[[torch.Generator], tuple[torch.Tensor, ...]]


def _mm(m: int, k: int, n: int) -> Make:
    return lambda g: (torch.randn(m, k, generator=g), torch.randn(k, n, generator=g))


def _mv(m: int, k: int) -> Make:
    return lambda g: (torch.randn(m, k, generator=g), torch.randn(k, generator=g))


def _conv(n: int, cin: int, hw: int, cout: int, kh: int) -> Make:
    return lambda g: (
        torch.randn(n, cin, hw, hw, generator=g),
        torch.randn(cout, cin, kh, kh, generator=g),
    )


CASES: dict[str, tuple[str, int, Make, Callable[..., torch.Tensor]]] = {
    "mm 64x256@256x64": ("matmul", 256, _mm(64, 256, 64), torch.matmul),
    "mm 64x8@8x64": ("matmul", 8, _mm(64, 8, 64), torch.matmul),
    "mm 16x4096@4096x16": ("matmul", 4096, _mm(16, 4096, 16), torch.matmul),
    "mm 4x1024@1024x4": ("matmul", 1024, _mm(4, 1024, 4), torch.matmul),
    "mv 64x256@256": ("matmul", 256, _mv(64, 256), torch.matmul),
    "conv 2x64x12x12 k3x3": ("conv", 64 * 9, _conv(2, 64, 12, 32, 3), F.conv2d),
    "conv 2x16x12x12 k3x3": ("conv", 16 * 9, _conv(2, 16, 12, 16, 3), F.conv2d),
}
TRIALS = 30


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_default_bound_is_within_10x_of_the_worst_error(case: str) -> None:
    op, k, make, run = CASES[case]
    worst_use = 0.0
    with override_flags(BF16), observe() as log:
        for trial in range(TRIALS):
            inputs = make(torch.Generator().manual_seed(trial))
            out = run(*inputs)
            expected = run(*(t.double() for t in inputs))
            tol = tolerance_for(torch.float32, op=op, k=k, shape=out.shape)
            if tol.precision_source == "worst case":
                pytest.skip(f"the kernel of {case} could not be observed or probed here")
            use = (out.double() - expected).abs() / (tol.atol + tol.rtol * expected.abs())
            worst_use = max(worst_use, float(use.max()))
    assert worst_use <= 1.0, f"{case}: the bound was exceeded ({worst_use:.2f})"
    # Where oneDNN's log named the kernel, the bound is its own: within 10x.  Where only
    # a probe decided (the op ran outside oneDNN, e.g. an AVX2 CPU's BLAS gemv, which
    # splits k over vector lanes the f32 model does not see), the error can sit further
    # below the f32 bound; within 20x still tells an f32 bound from a bf16-wide one,
    # which would be thousands of times looser.
    floor = 0.1 if tol.precision_source == "primitive log" else 0.05
    assert worst_use >= floor, (
        f"{case}: bound {1 / worst_use:.0f}x the worst error over {TRIALS} trials "
        f"({tol.precision_source}; {log.error or 'log captured'})\n{tol.describe()}"
    )


def test_bf16_and_f32_shapes_side_by_side_where_this_cpu_has_a_bf16_path() -> None:
    with override_flags(BF16), observe() as log:
        big = _mm(64, 256, 64)(torch.Generator().manual_seed(0))
        small = _mm(64, 8, 64)(torch.Generator().manual_seed(0))
        out_big, out_small = big[0] @ big[1], small[0] @ small[1]
        tol_big = tolerance_for(torch.float32, op="matmul", k=256, shape=out_big.shape)
        tol_small = tolerance_for(torch.float32, op="matmul", k=8, shape=out_small.shape)
        computed = [p.precision for p in log.primitives() if p.family == "matmul"]
    if log.error is not None or "bf16" not in computed:
        pytest.skip(
            "no oneDNN bf16 path for fp32 matmuls on this CPU "
            f"(kernels: {sorted(set(computed)) or log.error})"
        )
    assert _reduced(tol_big) and tol_big.precision_source == "primitive log"
    # the small shape is bounded by its own kernel, whatever the big one did
    small_kernels = [
        p
        for p in log.primitives()
        if p.family == "matmul" and computes_shape(p, out_small.shape, 8)
    ]
    assert small_kernels
    assert _reduced(tol_small) == (small_kernels[-1].precision == "bf16")


# --- by default: the log is captured for tests under a reduced-precision config --------

CONFIG_TEST = """
import pytest
import torch

from pytest_backends import assert_close, kernels, reference, tolerance_for
from pytest_backends.kernels import computes_shape


@pytest.mark.backends("mkldnn_precision")
def test_config(backend_config):
    precision = backend_config.axes["mkldnn_precision"]
    log = kernels.active_log()
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 256, generator=gen), torch.randn(256, 64, generator=gen)
    out = a @ b
    tol = tolerance_for(torch.float32, op="matmul", k=256, shape=out.shape)
    assert_close(out, reference(torch.matmul, a, b), op="matmul", k=256)
    named = log is not None and any(
        p.family == "matmul" and computes_shape(p, out.shape, 256) for p in log.primitives()
    )
    print("SOURCE", precision, log is not None, named, tol.precision_source or "-")
"""


def test_a_reduced_precision_config_captures_the_log_by_default(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cfg=CONFIG_TEST)
    result = pytester.runpytest_subprocess("--backends-matrix", "-p", "no:randomly", "-s", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, result.stdout.str()
    found = (re.search(r"SOURCE (\S+) (\S+) (\S+) (.+)$", line) for line in result.stdout.lines)
    seen = {m.group(1): [m.group(2), m.group(3), m.group(4)] for m in found if m is not None}
    assert seen.get("ieee") == ["False", "False", "-"], seen
    reduced = [mode for mode in seen if mode != "ieee"]
    if not reduced:
        # A CPU without oneDNN bf16 (AVX2 only): the reduced configs skip, saying why.
        result.stdout.fnmatch_lines(["SKIPPED *needs a CPU with bf16 support in oneDNN*"])
        pytest.skip("this CPU runs no reduced-precision oneDNN configuration")
    for mode in reduced:
        _, named, source = seen[mode]
        if named == "True":
            # the log named the matmul's own primitive, and that decided the bound
            assert source == "primitive log", (mode, seen)
        else:
            # captured, but no oneDNN primitive ran this shape (a CPU without oneDNN's
            # bf16 matmul path sends it to BLAS), or no oneDNN at all: a probe decides
            assert source == "probe", (mode, seen)
    assert any(seen[mode][0] == "True" for mode in reduced) or not torch._C._has_mkldnn


def test_a_conv_lowered_to_a_gemm_is_judged_by_that_gemm() -> None:
    # oneDNN may run a convolution as a matmul of the weights (out_channels x k)
    # by the columns (k x output pixels): the conv's matmul row asks about that GEMM
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 64, 10, 10, generator=gen), torch.randn(32, 64, 3, 3, generator=gen)
    with override_flags(BF16), observe() as log:
        out = F.conv2d(x, w)
        tol = tolerance_for(torch.float32, op="conv", k=576, shape=out.shape)
        gemms = [p for p in log.primitives() if p.family == "matmul"]
    if log.error is not None or not gemms:
        pytest.skip(f"oneDNN did not run this conv as a matmul here ({log.error or 'a conv'})")
    assert computes_shape(gemms[-1], (1, 32, 64), 576), gemms[-1].problem
    matmul_lines = [line for line in tol.path if "mkldnn.matmul.fp32_precision" in line]
    assert any(gemms[-1].impl in line and "primitive log" in line for line in matmul_lines) or (
        _reduced(tol) and gemms[-1].precision == "bf16"
    ), tol.path
