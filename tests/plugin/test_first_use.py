"""A switch torch sets itself on first use is the process's state, not a test's leak.

On a Hopper or Blackwell GPU with cuDNN 9.9+, torch's first SDPA call on CUDA
puts cuDNN attention first in ``sdp.priority_order`` (once per process). The
guard used to report that as a leak of whichever test made the first call
and restore the old order for every later test. The GPU tests make the real
call; here the machine check is faked (a conftest says this is such a GPU)
and a test makes the same change torch makes, so the rule runs on any machine.
On this machine itself (no such GPU), the same change is a leak.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from pytest_backends.isolation import first_use

pytest_plugins = ["pytester"]

STATIC = list(torch._C._get_sdp_priority_order())
CUDNN_FIRST = first_use.cudnn_attention_first(torch, STATIC)

SUITE = f"""
import torch

STATIC = {STATIC!r}
CUDNN_FIRST = {CUDNN_FIRST!r}


def test_a_first_sdpa_call():
    # what torch's first SDPA call does on such a GPU
    torch._C._set_sdp_priority_order(CUDNN_FIRST)


def test_b_later_test_sees_torchs_order():
    assert list(torch._C._get_sdp_priority_order()) == CUDNN_FIRST


def test_c_user_puts_the_static_order_back():
    torch._C._set_sdp_priority_order(STATIC)


def test_d_order_restored_for_the_next_test():
    assert list(torch._C._get_sdp_priority_order()) == CUDNN_FIRST

"""

FAKE_GPU = """
from pytest_backends.isolation import first_use

first_use.prefers_cudnn_attention = lambda torch: True
"""


def test_torchs_first_use_order_is_adopted_as_the_process_state(pytester: pytest.Pytester) -> None:
    assert CUDNN_FIRST is not None and CUDNN_FIRST != STATIC
    pytester.makeconftest(FAKE_GPU)
    pytester.makepyfile(test_first=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-rA")
    text = result.stdout.str()
    # a: torch's own change, adopted and kept for b; c leaks (putting the old order back is
    # no first-use value of torch's) and torch's order is restored for d
    result.assert_outcomes(passed=4, errors=1)
    assert "test_a_first_sdpa_call left" not in text
    assert "test_c_user_puts_the_static_order_back left torch backend flags changed" in text


LEAK = f"""
import torch


def test_sets_cudnn_first():
    torch._C._set_sdp_priority_order({CUDNN_FIRST!r})


def test_next():
    assert list(torch._C._get_sdp_priority_order()) == {STATIC!r}
"""


def test_the_same_change_is_a_leak_where_torch_would_not_make_it(
    pytester: pytest.Pytester,
) -> None:
    # A machine where torch never makes the change (faked: on a Hopper GPU torch would).
    pytester.makeconftest(FAKE_GPU.replace("True", "False"))
    pytester.makepyfile(test_leak=LEAK)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_sets_cudnn_first left torch backend flags changed*"])


def _fake_torch(
    initialized: bool = True,
    capability: tuple[int, int] = (9, 0),
    cudnn: int | None = 91000,
) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(
        is_initialized=lambda: initialized, get_device_capability=lambda: capability
    )
    cudnn_ns = types.SimpleNamespace(is_available=lambda: cudnn is not None, version=lambda: cudnn)
    return types.SimpleNamespace(cuda=cuda, backends=types.SimpleNamespace(cudnn=cudnn_ns))


@pytest.mark.parametrize(
    ("fake", "env", "expected"),
    [
        (_fake_torch(), {}, True),
        (_fake_torch(capability=(10, 0)), {}, True),
        (_fake_torch(capability=(9, 3)), {}, True),
        (_fake_torch(initialized=False), {}, False),
        (_fake_torch(capability=(8, 0)), {}, False),
        (_fake_torch(capability=(8, 9)), {}, False),
        (_fake_torch(capability=(12, 0)), {}, False),
        (_fake_torch(capability=(9, 1)), {}, False),
        (_fake_torch(cudnn=90800), {}, False),
        (_fake_torch(cudnn=None), {}, False),
        (_fake_torch(), {"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"}, False),
        (_fake_torch(), {"TORCH_CUDNN_SDPA_PREFERRED": "0"}, False),
        (_fake_torch(), {"TORCH_CUDNN_SDPA_PREFERRED": "1"}, True),
    ],
)
def test_the_machines_on_which_torch_puts_cudnn_attention_first(
    fake: types.SimpleNamespace,
    env: dict[str, str],
    expected: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TORCH_CUDNN_SDPA_DEPRIORITIZED", "TORCH_CUDNN_SDPA_PREFERRED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert first_use.prefers_cudnn_attention(fake) is expected
    assert all(os.environ.get(k) == v for k, v in env.items())


def test_only_torchs_exact_value_is_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(first_use, "prefers_cudnn_attention", lambda torch: True)
    record = first_use.FirstUse()
    other = [STATIC[1], STATIC[0], *STATIC[2:]]
    assert record.claim({"sdp.priority_order": (STATIC, other)}) == {}
    assert record.claim({"cudnn.enabled": (True, False)}) == {}
    assert record.claim({"sdp.priority_order": (STATIC, CUDNN_FIRST)}) == {
        "sdp.priority_order": CUDNN_FIRST
    }
    # torch makes the change once per process
    assert record.claim({"sdp.priority_order": (STATIC, CUDNN_FIRST)}) == {}


IMPORTED_EARLY = f"""
import torch

# a model warmed up at import, where torch makes its first SDPA call
torch._C._set_sdp_priority_order({CUDNN_FIRST!r})


def test_uses_torchs_order():
    assert list(torch._C._get_sdp_priority_order()) == {CUDNN_FIRST!r}
"""

OTHER_MODULE = f"""
import torch


def test_other_module_keeps_torchs_order():
    assert list(torch._C._get_sdp_priority_order()) == {CUDNN_FIRST!r}
"""


@pytest.mark.parametrize("where", ["conftest", "test module"])
def test_a_first_call_at_import_is_no_module_change_and_no_baseline_line(
    pytester: pytest.Pytester, where: str
) -> None:
    if where == "conftest":
        pytester.makeconftest(FAKE_GPU + IMPORTED_EARLY.split("\n\ndef ")[0])
    else:
        pytester.makeconftest(FAKE_GPU)
    pytester.makepyfile(test_a_early=IMPORTED_EARLY, test_b_other=OTHER_MODULE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=2)
    text = result.stdout.str()
    assert "changed torch backend flags while it was imported" not in text
    assert "session baseline differs" not in text
