"""The determinism harness on real nondeterministic CUDA kernels (skipped without a GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from pytest_backends import (
    NotReproducibleError,
    assert_reproducible,
    expect_nondeterministic_alert,
    override_flags,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _native_cache() -> str:
    from pytest_backends import _native

    return str(_native._cache_root())


# Resolved at import, before pytester points HOME elsewhere.
NATIVE_CACHE = _native_cache() if torch.cuda.is_available() else ""


def _index() -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(0)
    # Many duplicates: the backward scatters 200k rows into 64 with atomic adds.
    return torch.randint(0, 64, (200_000,), device="cuda", generator=gen)


@pytest.mark.parametrize("op", ["index_select", "gather"])
def test_backward_atomics_caught_with_random_upstream_grads(op: str) -> None:
    x = torch.randn(64, 32, device="cuda", requires_grad=True)
    idx = _index()

    def fn(t: torch.Tensor) -> torch.Tensor:
        if op == "index_select":
            return t.index_select(0, idx)
        return t.gather(0, idx[:, None].expand(-1, 32))

    with pytest.raises(NotReproducibleError) as info:
        assert_reproducible(fn, x, runs=10)
    assert info.value.what == "grad of args[0]"
    with override_flags({"deterministic_algorithms": True}):
        assert_reproducible(fn, x, runs=10)


def test_histc_alerts_and_index_add_does_not() -> None:
    expect_nondeterministic_alert(lambda: torch.histc(torch.rand(1000, device="cuda")))
    idx = _index()
    src = torch.randn(idx.numel(), device="cuda")
    expect_nondeterministic_alert(
        lambda: torch.zeros(64, device="cuda").index_add_(0, idx, src), should_alert=False
    )


def test_suite_mode_names_the_cuda_op(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_BACKENDS_CACHE_DIR", NATIVE_CACHE)
    pytester.makeini("[pytest]\nmarkers =\n    backends: configs\n")
    pytester.makepyfile(
        test_cuda="""
        import pytest
        import torch

        @pytest.mark.backends(deterministic="on")
        def test_index_add():
            gen = torch.Generator(device="cuda").manual_seed(0)
            idx = torch.randint(0, 64, (200_000,), device="cuda", generator=gen)
            src = torch.randn(200_000, 32, device="cuda")
            torch.zeros(64, 32, device="cuda").index_add_(0, idx, src).sum()
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--backends-determinism=10", "--backends-census=census.json"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["nondeterministic op aten::index_add_ (cuda, float32)*"])
    census = json.loads((pytester.path / "census.json").read_text())
    verdicts = {(e["op"], e["device"]): e["verdict"] for e in census["entries"]}
    assert verdicts[("aten::index_add_", "cuda")] == "nondeterministic"
    assert census["cuda"] == torch.version.cuda
