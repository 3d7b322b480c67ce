"""The promise table, its evaluation, and the profiler-based op recorder."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from matrix_helpers import NEW_API_FLAGS

from pytest_backends.flags import override_flags
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import BackendConfig
from pytest_backends.matrix.op_recorder import ProfilerOpRecorder
from pytest_backends.matrix.verify import PROMISES, evaluate, promises_for

REG = builtin_registry()


def make(choices: dict[str, str], cuda: bool = False) -> BackendConfig:
    return REG.make(choices, available_flags=NEW_API_FLAGS, cuda_available=cuda)


def test_hard_promise_broken_names_requested_and_ran() -> None:
    verdict = evaluate(make({"mkldnn": "off"}), {"aten::conv2d", "aten::mkldnn_convolution"})
    assert verdict.status == "broken"
    assert verdict.broken[0].startswith(
        "mkldnn-off promised no oneDNN kernels, but the test ran aten::mkldnn_convolution."
    )


def test_queries_do_not_break_hard_promises() -> None:
    ops = {
        "aten::cudnn_is_acceptable",
        "aten::_nnpack_available",
        "mkldnn::_is_mkldnn_bf16_supported",
    }
    for choices in ({"cudnn": "off"}, {"nnpack": "off"}, {"mkldnn": "off"}):
        assert evaluate(make(choices), ops).status == "ok"


def test_soft_promise_not_exercised_names_the_path_that_ran() -> None:
    verdict = evaluate(make({"mkldnn": "on"}), {"aten::conv2d", "aten::_slow_conv2d_forward"})
    assert verdict.status == "not exercised"
    assert verdict.detail == (
        "mkldnn-on not exercised: oneDNN kernels never ran; ran aten::_slow_conv2d_forward instead"
    )
    nothing = evaluate(make({"sdpa": "math"}), {"aten::mm"})
    assert nothing.detail.endswith("no scaled_dot_product_attention ran")


def test_exercised_and_sdpa_promises() -> None:
    assert evaluate(make({"mkldnn": "on"}), {"aten::mkldnn_convolution"}).status == "ok"
    flash = make({"sdpa": "flash"})
    assert evaluate(flash, {"aten::_scaled_dot_product_flash_attention_for_cpu"}).status == "ok"
    assert evaluate(flash, {"aten::_scaled_dot_product_attention_math"}).status == "broken"
    assert (
        evaluate(make({"sdpa": "math"}), {"aten::_scaled_dot_product_efficient_attention"}).status
        == "broken"
    )


def test_device_specific_promises() -> None:
    assert promises_for(make({"cudnn": "on"}, cuda=True))
    assert not promises_for(make({"mkldnn": "on", "device": "cuda"}))
    # TF32 shows only in CUDA kernel names (checked where a GPU profiles them)
    ((token, tf32),) = promises_for(make({"tf32": "on"}))
    assert (token, tf32.cuda_kernels) == ("tf32-on", "precision:tf32")
    assert set(PROMISES) >= {
        "mkldnn-on",
        "mkldnn-off",
        "nnpack-on",
        "nnpack-off",
        "cudnn-on",
        "cudnn-off",
        "sdpa-math",
        "sdpa-flash",
        "sdpa-efficient",
        "sdpa-cudnn",
    }


@pytest.mark.parametrize(
    ("enabled", "shape", "expected"),
    [
        (True, (8, 16, 32, 32), "aten::mkldnn_convolution"),
        (True, (1, 3, 8, 8), "aten::_slow_conv2d_forward"),
        (False, (16, 16, 16, 16), "aten::_nnpack_spatial_convolution"),
    ],
)
def test_recorder_sees_the_kernel_under_the_composite_op(
    enabled: bool, shape: tuple[int, int, int, int], expected: str
) -> None:
    if expected == "aten::mkldnn_convolution" and not torch.backends.mkldnn.is_available():
        pytest.skip("torch was built without oneDNN")
    if "nnpack" in expected and not torch.backends.nnpack.is_available():
        pytest.skip("torch was built without NNPACK")
    x, w = torch.randn(*shape), torch.randn(shape[1], shape[1], 3, 3)
    recorder = ProfilerOpRecorder()
    with override_flags({"mkldnn.enabled": enabled}):
        assert recorder.start()
        F.conv2d(x, w)
        ops = recorder.stop()
    assert {"aten::conv2d", expected} <= ops
