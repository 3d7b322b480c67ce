"""The backend_tolerance fixture, end to end through pytest."""

from __future__ import annotations

import pytest

TEST_FILE = """
import pytest
import torch

from pytest_backends import assert_close, reference, tolerance_for


@pytest.mark.backends("mkldnn_precision")
def test_matrix(backend_config, backend_tolerance):
    tol = backend_tolerance(torch.float32, op="matmul", k=1024)
    assert tol == tolerance_for(torch.float32, op="matmul", k=1024,
                                flags=dict(backend_config.flags))
    precision = backend_config.axes["mkldnn_precision"]
    assert dict(tol.flags)["mkldnn.matmul.fp32_precision"] == precision
    worst = backend_tolerance(torch.float32, op="matmul", k=1024, kernel=False)
    if precision == "ieee":
        assert tol.atol < 1e-3 and worst == tol
    else:
        # the flag allows the reduced path; the bound widens where the kernel took it
        assert worst.atol > 1e-2
        reduced = any(line.startswith("inputs rounded") for line in tol.path)
        assert (tol.atol > 1e-2) == reduced
        assert tol.precision_source in ("probe", "primitive log")
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 1024, generator=gen), torch.randn(1024, 64, generator=gen)
    rtol, atol = tol
    torch.testing.assert_close((a @ b).double(), reference(torch.matmul, a, b),
                               rtol=rtol, atol=atol)
    print("CONFIG", backend_config.id, precision, f"{worst.atol:.3e}")


def test_defaults(backend_tolerance):
    rtol, atol = backend_tolerance
    assert (rtol, atol) == tuple(tolerance_for(torch.get_default_dtype()))
    assert backend_tolerance.device == "cpu"
    torch.set_default_dtype(torch.float64)
    try:
        assert tuple(backend_tolerance) == tuple(tolerance_for(torch.float64))
    finally:
        torch.set_default_dtype(torch.float32)


def test_flags_are_read_when_asked(backend_tolerance, backend_flags):
    before = backend_tolerance(op="matmul", k=256)
    backend_flags.set({"mkldnn.matmul.fp32_precision": "bf16"})
    after = backend_tolerance(op="matmul", k=256, kernel=False)
    assert after.atol > 100 * before.atol
    followed = backend_tolerance(op="matmul", k=256)
    assert followed.precision_source in ("probe", "primitive log")
    assert followed.atol in (before.atol, after.atol)
"""


def test_backend_tolerance_follows_the_configs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tol=TEST_FILE)
    result = pytester.runpytest_subprocess("--backends-matrix", "-p", "no:randomly", "-s", "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, result.stdout.str()
    configs = [
        line.split("CONFIG ", 1)[1].split() for line in result.stdout.lines if "CONFIG " in line
    ]
    seen = {fields[1] for fields in configs}
    assert "ieee" in seen, result.stdout.str()
    assert outcomes["passed"] == len(configs) + 2
    atols = {fields[1]: float(fields[2]) for fields in configs}
    if "bf16" in atols:
        assert atols["bf16"] > 100 * atols["ieee"]
