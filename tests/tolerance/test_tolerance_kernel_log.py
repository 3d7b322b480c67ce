"""The tolerance model reading a primitive log: both answers, on any CPU.

A log is replayed from lines oneDNN printed on two machines (an AMD EPYC
without AMX and an Intel Xeon with AMX), so the branch for the machine this
test does not run on is exercised too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from pytest_backends import assert_close, override_flags, tolerance_for
from pytest_backends.kernels import PrimitiveLog, computed_precision
from pytest_backends.kernels import log as kernels_module
from pytest_backends.tolerance import kernel_precision

NO_AMX = (
    "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core,undef,"
    "src:f32::blocked:ab::f0 wei:f32::blocked:ab::f0 dst:f32::blocked:ab::f0,"
    "attr-scratchpad:user attr-fpmath:bf16,,256x1024:1024x256,0.601807"
)
AMX = NO_AMX.replace("avx512_core,", "avx512_core_amx,")
CONV_AMX = (
    "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,"
    "forward_training,src:f32::blocked:acdb::f0 wei:f32::blocked:AcdB16b16a::f0 "
    "bia:undef::undef::: dst:f32::blocked:acdb::f0,attr-scratchpad:user attr-fpmath:bf16,"
    "alg:convolution_direct,mb2_ic64oc32_ih12oh10kh3sh1dh0ph0_iw12ow10kw3sw1dw0pw0,0.2"
)


Replay = Callable[..., PrimitiveLog]


@pytest.fixture
def replay() -> Iterator[Replay]:
    """Make a log of the given lines the active one, as verify's capture does."""
    tokens = []

    def activate(*lines: str) -> PrimitiveLog:
        log = PrimitiveLog(_text="\n".join(lines) + "\n")
        tokens.append(kernels_module._ACTIVE.set(log))
        return log

    yield activate
    for token in reversed(tokens):
        kernels_module._ACTIVE.reset(token)


def test_an_f32_kernel_under_the_bf16_flag_gets_the_ieee_bound(replay: Replay) -> None:
    replay(NO_AMX)
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        tol = tolerance_for(torch.float32, op="matmul", k=1024)
    ieee = tolerance_for(
        torch.float32, op="matmul", k=1024, flags={"mkldnn.matmul.fp32_precision": "ieee"}
    )
    assert (tol.rtol, tol.atol) == (ieee.rtol, ieee.atol)
    assert tol.precision_source == "primitive log"
    assert tol.path[0] == (
        "mkldnn.matmul.fp32_precision='bf16' allowed bf16, but primitive log: "
        "brg_matmul:avx512_core (256x1024:1024x256) computed in f32: fp32 arithmetic"
    )


def test_a_bf16_kernel_under_the_bf16_flag_gets_the_bf16_bound(replay: Replay) -> None:
    replay(AMX)
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        tol = tolerance_for(torch.float32, op="matmul", k=1024)
        worst = tolerance_for(torch.float32, op="matmul", k=1024, kernel=False)
    assert (tol.rtol, tol.atol) == (worst.rtol, worst.atol)
    assert tol.precision_source == "primitive log"
    assert (
        "primitive log: brg_matmul:avx512_core_amx (256x1024:1024x256) computed in bf16"
        in tol.path[0]
    )
    # a bf16-sized error passes that bound, and would fail the f32 one (the shape
    # of the logged primitive: the log answers for results of that shape)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 1024, generator=gen), torch.randn(1024, 256, generator=gen)
    actual = a.bfloat16().float() @ b.bfloat16().float()
    expected = a.double() @ b.double()
    with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
        assert_close(actual, expected, op="matmul", k=1024)
    with pytest.raises(AssertionError, match="computed in f32"):
        replay(NO_AMX)
        with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
            assert_close(actual, expected, op="matmul", k=1024)


def test_the_log_answers_per_family(replay: Replay) -> None:
    replay(NO_AMX, CONV_AMX)
    assert kernel_precision("cpu", "mkldnn.matmul.fp32_precision", "bf16")[:2] == (
        False,
        "primitive log",
    )
    assert kernel_precision("cpu", "mkldnn.conv.fp32_precision", "bf16")[:2] == (
        True,
        "primitive log",
    )
    # no tf32 primitive in the log: the probe decides
    assert kernel_precision("cpu", "mkldnn.matmul.fp32_precision", "tf32")[1] == "probe"
    flags = {"mkldnn.conv.fp32_precision": "bf16", "mkldnn.matmul.fp32_precision": "bf16"}
    with override_flags(flags):
        conv = tolerance_for(torch.float32, op="conv", k=576)
    # a conv may be lowered to a GEMM: the worse of its two rows counts
    assert any("inputs rounded to bf16" in line and "brg_conv_fwd" in line for line in conv.path)
    assert any(
        "brg_matmul:avx512_core (256x1024:1024x256) computed in f32" in line for line in conv.path
    )


def test_a_reduced_kernel_wins_over_f32_ones_of_the_same_family(replay: Replay) -> None:
    replay(NO_AMX, AMX, NO_AMX)
    seen = computed_precision("matmul", "bf16")
    assert seen is not None
    precision, primitive = seen
    assert (precision, primitive.isa) == ("bf16", "avx512_core_amx")
    assert computed_precision("matmul", "tf32") is None
    assert computed_precision("rnn", "bf16") is None


def test_unknown_rows_take_the_worst_case() -> None:
    used, source, why = kernel_precision("cpu", "no.such.row", "bf16")
    assert (used, source) == (True, "worst case")
    assert "has no probe" in why
