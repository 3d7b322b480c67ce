"""A level's worker checks oneDNN's ISA, not only ATen's, before it runs a test.

oneDNN reads ``ONEDNN_MAX_CPU_ISA`` once, when it first runs, and says which
ISA it dispatches to in its verbose log. Each case starts a fresh Python
process with a real oneDNN and reads that line.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from pytest_backends.capability import levels

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or levels.machine_arch() != "x86_64",
    reason="needs an x86_64 torch built with oneDNN",
)

PROBE = """
from pytest_backends.capability import levels
import json, sys
level = sys.argv[1]
print(json.dumps([levels.onednn_isa(), levels.verify_onednn(level)]))
"""


def _probe(level: str, cap: str | None) -> tuple[str | None, str | None]:
    import json

    env = dict(os.environ)
    env.pop("ONEDNN_VERBOSE", None)
    env.pop("DNNL_VERBOSE", None)
    if cap is None:
        env.pop("ONEDNN_MAX_CPU_ISA", None)
    else:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    out = subprocess.run(
        [sys.executable, "-c", PROBE, level],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    isa, mismatch = json.loads(out.stdout.strip().splitlines()[-1])
    return isa, mismatch


def _needs(level: str) -> None:
    reason = levels.unsupported_reason(level)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("level", ["default", "avx2"])
def test_a_worker_started_with_the_level_environment_passes(level: str) -> None:
    _needs(level)
    env = levels.level_env(level)
    isa, mismatch = _probe(level, env["ONEDNN_MAX_CPU_ISA"])
    assert mismatch is None
    assert isa == levels._ONEDNN_ISA_REPORTED[env["ONEDNN_MAX_CPU_ISA"]]


def test_the_avx512_level_runs_the_same_onednn_isa_as_a_plain_run() -> None:
    # the machine's top ISA (AMX, BF16, VNNI: whatever a run without levels uses)
    _needs("avx512")
    env = levels.level_env("avx512")
    isa, mismatch = _probe("avx512", env["ONEDNN_MAX_CPU_ISA"])
    plain, _ = _probe("avx512", None)
    assert mismatch is None
    assert isa is not None and isa == plain


def test_an_avx512_worker_capped_below_the_cpus_own_isa_is_refused() -> None:
    _needs("avx512")
    isa, mismatch = _probe("avx512", "AVX2")
    assert isa == "Intel AVX2"
    assert mismatch is not None and "ONEDNN_MAX_CPU_ISA=AVX2" in mismatch


def test_a_worker_whose_onednn_runs_a_wider_isa_is_refused() -> None:
    _needs("avx2")
    _needs("avx512")
    isa, mismatch = _probe("avx2", "AVX512_CORE")
    assert isa is not None and "AVX-512" in isa
    assert mismatch is not None
    assert "cap-avx2" in mismatch and "runs oneDNN's" in mismatch
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE" in mismatch


def test_a_worker_whose_onednn_runs_a_narrower_isa_is_refused() -> None:
    _needs("avx2")
    isa, mismatch = _probe("avx2", "SSE41")
    assert isa == "Intel SSE4.1"
    assert mismatch is not None and "not 'Intel AVX2'" in mismatch


def test_the_isa_line_is_read_from_both_log_formats() -> None:
    v1 = "onednn_verbose,v1,info,cpu,isa:Intel AVX2\nonednn_verbose,v1,primitive,exec,cpu,x"
    old = "onednn_verbose,info,cpu,isa:Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ"
    assert levels.parse_onednn_isa(v1) == "Intel AVX2"
    assert levels.parse_onednn_isa(old) == ("Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ")
    assert levels.parse_onednn_isa("onednn_verbose,v1,primitive,exec,cpu,isa:x") is None
    assert levels.parse_onednn_isa("") is None


def test_an_unreadable_isa_is_not_a_mismatch() -> None:
    assert levels.verify_onednn("avx2", actual=None, arch="aarch64") is None
    assert levels.verify_onednn("avx2", actual="Intel AVX2", arch="x86_64") is None
    message = levels.verify_onednn("avx2", actual="Intel SSE4.1", arch="x86_64")
    assert message is not None and "'Intel SSE4.1'" in message
