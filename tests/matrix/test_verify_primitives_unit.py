"""oneDNN's primitive log: parsing, capture, attribution to ops, and the promises read from it."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from matrix_helpers import NEW_API_FLAGS

from pytest_backends.flags import override_flags
from pytest_backends.kernels import (
    OpEvent,
    Primitive,
    PrimitiveLog,
    attribute,
    computed_precision,
    observe,
    parse_primitive,
)
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import BackendConfig
from pytest_backends.matrix.op_recorder import ProfilerOpRecorder
from pytest_backends.matrix.verify import KernelTrace, coverage, evaluate

REG = builtin_registry()

# Lines as oneDNN 3.x prints them (AMD EPYC without AMX; an Intel CPU with AMX).
MM_BF16 = (
    "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_bf16,undef,"
    "src:bf16::blocked:ab::f0 wei:bf16::blocked:ab::f0 dst:bf16::blocked:ab::f0,"
    "attr-scratchpad:user,,256x256:256x256,0.405029"
)
MM_FPMATH_NO_AMX = (
    "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core,undef,"
    "src:f32::blocked:ab::f0 wei:f32::blocked:ab::f0 dst:f32::blocked:ab::f0,"
    "attr-scratchpad:user attr-fpmath:bf16,,256x1024:1024x256,0.601807"
)
MM_FPMATH_AMX = MM_FPMATH_NO_AMX.replace("avx512_core,", "avx512_core_amx,")
CONV = (
    "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,"
    "src:f32:a:blocked:aBcd16b::f0 wei:f32:a:blocked:ABcd16b16a::f0 bia:undef::undef::: "
    "dst:f32:a:blocked:aBcd16b::f0,attr-scratchpad:user,alg:convolution_direct,"
    "mb8_ic16oc16_ih32oh30kh3sh1dh0ph0_iw32ow30kw3sw1dw0pw0,3.06299"
)
# an LSTM under mkldnn.rnn.fp32_precision="bf16" (AMD EPYC, torch 2.13): no fpmath attribute
RNN_F32 = (
    "onednn_verbose,v1,primitive,exec,cpu,rnn,brgemm:avx512_core,forward_inference,"
    "src_layer:f32::blocked:abc::f0 src_iter:f32::blocked:abcd::f0 "
    "wei_layer:f32:ap:blocked:abdEc32e::f0 wei_iter:f32:ap:blocked:abdEc32e::f0 "
    "bias:f32::blocked:abcd::f0 dst_layer:f32::blocked:abc::f0 dst_iter:f32::blocked:abcd::f0,"
    "attr-scratchpad:user,alg:vanilla_lstm direction:unidirectional_left2right "
    "activation:undef flags:,l1t4mb2sic16slc16dhc16dic16,138.198"
)
REORDER = (
    "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:blk,undef,"
    "src:f32::blocked:abcd::f0 dst:f32::blocked:aBcd16b::f0,attr-scratchpad:user,,"
    "8x16x32x32,0.14917"
)
# oneDNN 2.x/3.0 (torch 2.1): no version/component fields, "src_f32" descriptors
OLD_FORMAT = (
    "onednn_verbose,exec,cpu,inner_product,brgemm:avx512_core,forward_training,"
    "src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0 bia_f32::blocked:a:f0 "
    "dst_f32::blocked:ab:f0,attr-fpmath:bf16 ,,mb64ic256oc32,0.0581"
)


def make(choices: dict[str, str], cuda: bool = False) -> BackendConfig:
    return REG.make(choices, available_flags=NEW_API_FLAGS, cuda_available=cuda)


def parsed(line: str) -> Primitive:
    primitive = parse_primitive(line)
    assert primitive is not None
    return primitive


def test_parse_current_and_old_formats() -> None:
    mm = parsed(MM_FPMATH_NO_AMX)
    assert (mm.kind, mm.impl, mm.isa, mm.fpmath, mm.problem) == (
        "matmul",
        "brg_matmul:avx512_core",
        "avx512_core",
        "bf16",
        "256x1024:1024x256",
    )
    assert mm.dtypes == (("src", "f32"), ("wei", "f32"), ("dst", "f32"))
    old = parsed(OLD_FORMAT)
    assert (old.kind, old.isa, old.fpmath, old.family) == (
        "inner_product",
        "avx512_core",
        "bf16",
        "matmul",
    )
    assert old.input_dtypes() == ("f32", "f32")
    conv = parsed(CONV)
    assert conv.family == "conv" and conv.prop_kind == "forward_training"
    assert conv.input_dtypes() == ("f32", "f32")
    for other in (
        "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost",
        "onednn_verbose,v1,graph,exec,cpu,100002,sdp,,in0:f32:strided,fpm:strict,dnnl,1.0",
        "hello from a test",
        "",
    ):
        assert parse_primitive(other) is None


def test_the_precision_a_primitive_computed_in_follows_its_isa() -> None:
    # the flag allowed bf16, but avx512_core has no bf16 arithmetic: an f32 kernel
    assert parsed(MM_FPMATH_NO_AMX).precision == "f32"
    assert parsed(MM_FPMATH_AMX).precision == "bf16"
    assert parsed(MM_FPMATH_NO_AMX.replace("avx512_core,", "avx512_core_bf16,")).precision == (
        "bf16"
    )
    assert parsed(MM_BF16).precision == "bf16"  # bf16 data is bf16 whatever the attribute
    assert parsed(CONV).precision == "f32"
    assert not parsed(REORDER).computes and parsed(CONV).computes
    tf32 = parsed(MM_FPMATH_NO_AMX.replace("attr-fpmath:bf16", "attr-fpmath:tf32"))
    assert tf32.precision == "f32"
    assert parsed(MM_FPMATH_NO_AMX).describe() == (
        "brg_matmul:avx512_core (matmul, f32 with attr-fpmath:bf16)"
    )


def _events() -> list[OpEvent]:
    return [
        OpEvent("aten::matmul", ((256, 1024), (1024, 256))),
        OpEvent("aten::mm", ((256, 1024), (1024, 256)), parent=0),
        OpEvent("aten::conv2d", ((1, 3, 8, 8), (4, 3, 3, 3))),
        OpEvent("aten::convolution", ((1, 3, 8, 8), (4, 3, 3, 3)), parent=2),
        OpEvent("aten::_slow_conv2d_forward", ((1, 3, 8, 8), (4, 3, 3, 3)), parent=3),
        OpEvent("aten::conv2d", ((8, 16, 32, 32), (16, 16, 3, 3))),
        OpEvent("aten::convolution", ((8, 16, 32, 32), (16, 16, 3, 3)), parent=5),
        OpEvent("aten::mkldnn_convolution", ((8, 16, 32, 32), (16, 16, 3, 3)), parent=6),
        OpEvent("aten::mm", ((256, 256), (256, 256))),
    ]


def test_attribution_follows_order_kind_and_shape() -> None:
    events = _events()
    lines = [MM_FPMATH_NO_AMX, REORDER, CONV, REORDER, MM_BF16]
    out = attribute([parsed(line) for line in lines], events)
    assert [(p.kind, p.op, p.op_index) for p in out] == [
        ("matmul", "aten::mm", 1),  # the innermost matmul op, not aten::matmul
        ("reorder", "aten::mkldnn_convolution", 7),  # data movement joins its conv
        ("convolution", "aten::mkldnn_convolution", 7),  # the (8, 16, 32, 32) one
        ("reorder", "aten::mkldnn_convolution", 7),
        ("matmul", "aten::mm", 8),  # shape 256x256 picks the second mm
    ]
    assert out[0].op_shapes == ((256, 1024), (1024, 256))
    assert attribute([parsed(CONV)], [])[0].op is None


def test_coverage_names_the_ops_oneDNN_did_not_compute() -> None:
    events = _events()
    trace = KernelTrace.build([parsed(REORDER), parsed(CONV)], events)
    assert coverage(trace) == [
        "exercised by 1 of 2 convolutions; aten::_slow_conv2d_forward ran for input (1, 3, 8, 8)",
        "exercised by 0 of 2 matmuls; aten::mm ran for input (256, 1024); aten::mm ran for "
        "input (256, 256)",
    ]


def test_promises_read_the_primitives() -> None:
    events = _events()
    conv_only = KernelTrace.build([parsed(CONV)], events)
    on = evaluate(make({"mkldnn": "on"}), {"aten::mkldnn_convolution"}, kernels=conv_only)
    assert on.status == "ok"
    assert (
        "mkldnn-on exercised by 1 of 2 convolutions; aten::_slow_conv2d_forward ran for "
        "input (1, 3, 8, 8)" in on.detail
    )
    # an op name alone no longer satisfies the promise: no primitive computed anything
    reorder_only = KernelTrace.build([parsed(REORDER)], events)
    idle = evaluate(make({"mkldnn": "on"}), {"aten::mkldnn_convolution"}, kernels=reorder_only)
    assert idle.status == "not exercised"
    assert idle.detail == (
        "mkldnn-on not exercised: no oneDNN primitive computed an op of the test; "
        "aten::_slow_conv2d_forward ran for input (1, 3, 8, 8); aten::mkldnn_convolution ran "
        "for input (8, 16, 32, 32); aten::mm ran for input (256, 1024); aten::mm ran for input "
        "(256, 256)"
    )
    # mkldnn-off: any primitive breaks it, even inside an op the names do not flag
    off = evaluate(
        make({"mkldnn": "off"}), {"aten::mm"}, kernels=KernelTrace.build([parsed(MM_BF16)], events)
    )
    assert off.status == "broken"
    assert off.broken[0].startswith(
        "mkldnn-off promised no oneDNN kernels, but oneDNN ran brg_matmul:avx512_core_bf16 "
        "(matmul, bf16) for aten::mm."
    )
    clean = evaluate(make({"mkldnn": "off"}), {"aten::mm"}, kernels=KernelTrace(()))
    assert clean.status == "ok"


@pytest.mark.parametrize(
    ("line", "status", "detail"),
    [
        (
            MM_FPMATH_NO_AMX,
            "not exercised",
            "mkldnn_precision-bf16 not exercised: matmul brg_matmul:avx512_core for aten::mm: "
            "ISA avx512_core, computed in f32, not bf16: the flag allowed bf16, this kernel has "
            "no bf16 arithmetic",
        ),
        (
            MM_FPMATH_AMX,
            "ok",
            "mkldnn_precision-bf16 exercised: matmul brg_matmul:avx512_core_amx for aten::mm: "
            "ISA avx512_core_amx, computed in bf16 as promised",
        ),
        (
            MM_BF16,
            "not exercised",
            "mkldnn_precision-bf16 not exercised: matmul brg_matmul:avx512_core_bf16 for aten::mm: "
            "ISA avx512_core_bf16, computed in bf16 from bf16 inputs, not an fp32 op that the "
            "flag governs",
        ),
        (
            RNN_F32,
            "not exercised",
            "mkldnn_precision-bf16 not exercised: rnn brgemm:avx512_core for aten::lstm: "
            "ISA avx512_core, computed in f32, not bf16: oneDNN got no attr-fpmath:bf16 for "
            "this primitive",
        ),
        (
            REORDER,
            "not exercised",
            "mkldnn_precision-bf16 not exercised: no oneDNN matmul, convolution or RNN ran",
        ),
    ],
    ids=["no-amx", "amx", "bf16-data", "rnn-no-fpmath", "nothing"],
)
def test_precision_promise_needs_a_primitive_that_computed_in_it(
    line: str, status: str, detail: str
) -> None:
    config = make({"mkldnn": "on", "mkldnn_precision": "bf16"})
    events = [*_events(), OpEvent("aten::lstm", ((4, 2, 16),))]
    trace = KernelTrace.build([parsed(line)], events)
    verdict = evaluate(config, {"aten::mm", "aten::lstm"}, kernels=trace)
    assert verdict.status == status
    assert detail in verdict.detail, verdict.detail
    # one statement per op: never "no ... ran" next to what ran
    if "no oneDNN matmul" not in detail:
        assert "ran;" not in verdict.detail


def test_cuda_kernel_promises() -> None:
    tf32_on, tf32_off = make({"tf32": "on"}, cuda=True), make({"tf32": "off"}, cuda=True)
    tf32_kernel = (
        "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_"
        "warpsize2x2x1_tensor16x8x8_kernel"
    )
    assert evaluate(tf32_on, {"aten::mm"}, cuda_kernels=[tf32_kernel]).status == "ok"
    ieee = evaluate(tf32_on, {"aten::mm"}, cuda_kernels=["ampere_sgemm_128x64_nn"])
    assert ieee.detail == (
        "tf32-on not exercised: the flag allowed tf32, but ampere_sgemm_128x64_nn computed in f32"
    )
    broken = evaluate(tf32_off, {"aten::mm"}, cuda_kernels=[tf32_kernel])
    assert broken.status == "broken" and "but the GPU ran sm80_xmma_gemm" in broken.detail
    unknown = evaluate(tf32_on, {"aten::mm"}, cuda_kernels=["nvjet_tst_128x24_64x11_2x1_v_bz_TNT"])
    assert unknown.status == "ok" and "do not tell" in unknown.detail
    cudnn = make({"cudnn": "on"}, cuda=True)
    conv = (
        "void cudnn::detail::implicit_convolve_sgemm<float, float, 512, 6, 8, 3, 3, 5, 1, "
        "true, false, true>(int)"
    )
    assert evaluate(cudnn, {"aten::cudnn_convolution"}, cuda_kernels=[conv]).status == "ok"
    native = evaluate(cudnn, {"aten::cudnn_convolution"}, cuda_kernels=["ampere_sgemm_32x32_nn"])
    assert native.status == "not exercised"
    assert "no cudnn kernel ran; ran ampere_sgemm_32x32_nn" in native.detail


needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch was built without oneDNN"
)


@needs_onednn
def test_log_captures_fd1_and_passes_other_output_on(capfd: pytest.CaptureFixture[str]) -> None:
    x, w = torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3)
    with override_flags({"mkldnn.enabled": True}), observe() as log:
        os.write(1, b"written to fd 1 by the test\n")
        F.conv2d(x, w)
        during = log.primitives()
    assert log.error is None
    convs = [p for p in log.primitives() if p.kind == "convolution"]
    assert convs and convs == [p for p in during if p.kind == "convolution"]
    assert convs[0].problem.startswith("mb8_ic16oc16_ih32")
    out = capfd.readouterr().out
    assert "written to fd 1 by the test" in out
    assert "onednn_verbose" not in out  # the log itself is not passed on
    with override_flags({"mkldnn.enabled": True}):
        F.conv2d(x, w)  # after the capture: no log
    assert "onednn_verbose" not in capfd.readouterr().out


@needs_onednn
def test_real_run_attributes_a_conv_and_leaves_the_slow_one_uncovered() -> None:
    recorder, log = ProfilerOpRecorder(shapes=True), PrimitiveLog()
    with override_flags({"mkldnn.enabled": True}):
        assert recorder.start()
        assert log.start()
        F.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3))
        F.conv2d(torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3))
        primitives = log.stop()
        recorder.stop()
    trace = KernelTrace.build(primitives, recorder.events)
    assert {p.op for p in trace.primitives if p.kind == "convolution"} == {
        "aten::mkldnn_convolution"
    }
    assert coverage(trace) == [
        "exercised by 1 of 2 convolutions; aten::_slow_conv2d_forward ran for input (1, 3, 8, 8)"
    ]


def test_computed_precision_reads_the_active_log_only() -> None:
    assert computed_precision("matmul", "bf16") is None  # nothing captured
    with observe():
        a, b = torch.randn(64, 256), torch.randn(256, 64)
        with override_flags({"mkldnn.matmul.fp32_precision": "bf16"}):
            a @ b
        seen = computed_precision("matmul", "bf16")
    if seen is not None:  # oneDNN took the matmul (x86 with AVX512)
        precision, primitive = seen
        assert primitive.fpmath == "bf16" and precision == primitive.precision
        assert precision in ("f32", "bf16")
    assert computed_precision("matmul", "bf16") is None


def test_two_same_shaped_ops_get_one_primitive_each() -> None:
    events = [
        OpEvent("aten::mm", ((256, 256), (256, 256))),
        OpEvent("aten::mm", ((256, 256), (256, 256))),
    ]
    out = attribute([parsed(MM_BF16), parsed(MM_BF16)], events)
    assert [p.op_index for p in out] == [0, 1]
    trace = KernelTrace.build([parsed(MM_BF16), parsed(MM_BF16)], events)
    assert coverage(trace) == ["exercised by 2 of 2 matmuls"]
    # one op that runs two primitives keeps both
    single = attribute([parsed(MM_BF16), parsed(MM_BF16)], events[:1])
    assert [p.op_index for p in single] == [0, 0]


RNN = (
    "onednn_verbose,v1,primitive,exec,cpu,rnn,ref,forward_training,"
    "src_layer:f32::blocked:abc::f0 src_iter:f32::blocked:abcd::f0 "
    "wei_layer:f32:a:blocked:abcde::f0 wei_iter:f32:a:blocked:abcde::f0 "
    "bias:f32::blocked:abcd::f0 dst_layer:f32::blocked:abc::f0,attr-scratchpad:user,"
    "alg:vanilla_lstm direction:unidirectional_left2right,l1t3mb2sic8slc8dhc8dic8,24.59"
)


def test_timestamps_rnn_and_data_types_of_other_primitives() -> None:
    stamped = "onednn_verbose,1700000000123.45," + MM_BF16.split(",", 1)[1]
    assert parsed(stamped).impl == "brg_matmul:avx512_core_bf16"
    rnn = parsed(RNN)
    assert (rnn.family, rnn.impl, rnn.isa, rnn.precision) == ("rnn", "ref", "", "f32")
    assert rnn.input_dtypes() == ("f32", "f32", "f32", "f32")
    int8 = parsed(MM_BF16.replace("src:bf16", "src:u8").replace("wei:bf16", "wei:s8"))
    assert int8.precision == "s8"
    f16 = parsed(
        MM_FPMATH_NO_AMX.replace("attr-fpmath:bf16", "attr-fpmath:f16").replace(
            "avx512_core,", "avx512_core_fp16,"
        )
    )
    assert f16.precision == "f16"
    strict = parsed(MM_FPMATH_NO_AMX.replace(" attr-fpmath:bf16", ""))
    assert strict.fpmath is None and strict.precision == "f32"
    assert parsed(MM_FPMATH_AMX.replace("attr-fpmath:bf16", "attr-fpmath:bf16:true")).fpmath == (
        "bf16"
    )


def test_rnn_coverage_and_a_primitive_with_no_op() -> None:
    events = [
        OpEvent("aten::lstm", ((3, 2, 8),)),
        OpEvent("aten::mkldnn_rnn_layer", ((3, 2, 8),), parent=0),
        OpEvent("aten::lstm", ((5, 2, 8),)),
    ]
    trace = KernelTrace.build([parsed(RNN)], events)
    assert trace.primitives[0].op == "aten::mkldnn_rnn_layer"
    assert coverage(trace) == ["exercised by 1 of 2 RNNs; aten::lstm ran for input (5, 2, 8)"]
    lost = KernelTrace.build([parsed(MM_BF16)], events)
    assert lost.primitives[0].op is None  # no matmul op was recorded
    verdict = evaluate(make({"mkldnn": "on"}), {"aten::lstm"}, kernels=lost)
    assert verdict.status == "ok"  # oneDNN computed something all the same
    assert verdict.detail.startswith(
        "mkldnn-on exercised: brg_matmul:avx512_core_bf16 (matmul, bf16);"
    )


def test_cuda_promises_without_any_kernel_of_the_kind() -> None:
    tf32_on = make({"tf32": "on"}, cuda=True)
    nothing = evaluate(tf32_on, set(), cuda_kernels=["triton_poi_fused_add_0"])
    assert nothing.detail == (
        "tf32-on not exercised: the flag allowed tf32, but no fp32 GEMM or convolution ran"
    )
    cudnn = evaluate(make({"cudnn": "on"}, cuda=True), {"aten::cudnn_convolution"}, cuda_kernels=[])
    assert "no cudnn kernel ran; no GEMM, convolution or RNN kernel ran" in cudnn.detail
    # without kernel names (no GPU profiled) only the op names count
    assert evaluate(tf32_on, {"aten::mm"}).status == "ok"


@needs_onednn
def test_user_asked_log_lines_are_passed_on(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_backends.kernels import log as kernels

    monkeypatch.setenv("ONEDNN_VERBOSE", "1")
    try:
        with override_flags({"mkldnn.enabled": True}), observe() as log:
            F.conv2d(torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3))
        assert any(p.kind == "convolution" for p in log.primitives())
        assert "onednn_verbose" in capfd.readouterr().out  # the user asked for the log
    finally:
        kernels._set_verbose(0)
    monkeypatch.setenv("ONEDNN_VERBOSE", "0")
    assert kernels._user_verbose_level() == 0
    monkeypatch.setenv("DNNL_VERBOSE", "2")
    monkeypatch.delenv("ONEDNN_VERBOSE")
    assert kernels._user_verbose_level() == 2


def test_a_log_that_cannot_start_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_backends.kernels import log as kernels

    monkeypatch.setattr(kernels, "_mkldnn_available", lambda: False)
    log = PrimitiveLog()
    assert not log.start()
    assert log.error == "torch was built without oneDNN"
    assert log.stop() == [] and log.primitives() == []
    with observe() as empty:
        torch.randn(4, 4) @ torch.randn(4, 4)
    assert empty.error is not None and empty.primitives() == []
