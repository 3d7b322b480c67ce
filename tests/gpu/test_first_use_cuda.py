"""torch's first SDPA call on a real GPU: a session with it reports no leak.

On Hopper and Blackwell GPUs with cuDNN 9.9+, that call puts cuDNN attention
first in ``sdp.priority_order`` (see ``pytest_backends.isolation.first_use``).
Skipped without a GPU; on other GPUs the order does not change and the
session passes all the same.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytest_plugins = ["pytester"]

SUITE = """
import torch
import torch.nn.functional as F

ORDER = {}


def test_a_first_sdpa_call():
    ORDER["before"] = list(torch._C._get_sdp_priority_order())
    q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16)
    F.scaled_dot_product_attention(q, q, q)
    torch.cuda.synchronize()
    ORDER["after"] = list(torch._C._get_sdp_priority_order())


def test_b_the_order_torch_chose_is_kept():
    assert list(torch._C._get_sdp_priority_order()) == ORDER["after"]
    print("sdp.priority_order", ORDER["before"], "->", ORDER["after"])
"""


def test_the_first_sdpa_call_is_no_leak(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sdpa_first=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-s")
    result.assert_outcomes(passed=2)
    assert "left torch backend flags changed" not in result.stdout.str()
