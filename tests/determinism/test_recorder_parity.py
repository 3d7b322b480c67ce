"""The two recorders record the same ops, and locate them, in ordinary code paths.

Each case is a pytester session under the native recorder and under the Python
recorder (``PYTEST_BACKENDS_NATIVE=off``); both must give the same census rows
and the same failure message. The cases are code paths where a Python
``TorchDispatchMode`` meets what the native hook does not, or meets it
differently: ``CompositeImplicitAutograd`` ops under ``torch.inference_mode``
(autograd, which decomposes them, is off there), outputs in a sparse layout
without strides, and ``record_function`` range markers (a DataLoader opens one
per batch) before a blamed op, which the locating re-run must not count.
"""

from __future__ import annotations

import json
import sys

import pytest
from sessions import RECORDERS, session


def _census_ops(pytester: pytest.Pytester, nodeid: str) -> set[str]:
    census = json.loads((pytester.path / "census.json").read_text(encoding="utf-8"))
    return {row["op"] for row in census["entries"] if nodeid in row["tests"]}


def _not_checked(pytester: pytest.Pytester) -> dict[str, str]:
    census = json.loads((pytester.path / "census.json").read_text(encoding="utf-8"))
    found: dict[str, str] = census["not_checked"]
    return found


@pytest.mark.parametrize("recorder", RECORDERS)
def test_composite_ops_under_inference_mode_are_looked_through(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``linear`` and ``dropout`` under ``inference_mode`` are recorded as the ops they run."""
    planted_conftest.makepyfile(
        test_inference="""
        import torch

        def test_inference_model():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
            with torch.inference_mode():
                h = model(torch.ones(3, 4))
                y = torch.ops.pbtest.noisy(h)
            assert y.shape == (3, 4)
        """
    )
    result = session(
        planted_conftest,
        recorder,
        monkeypatch,
        "--backends-determinism-all",
        "--backends-determinism=3",
        "--backends-census=census.json",
    )
    result.assert_outcomes(failed=1)
    # The blamed op is found again by the locating re-run, so its line is named.
    result.stdout.fnmatch_lines(
        ["*nondeterministic op pbtest::noisy (cpu, float32) at test_inference.py:8 in*"]
    )
    ops = _census_ops(planted_conftest, "test_inference.py::test_inference_model")
    assert {"aten::addmm", "aten::t", "aten::bernoulli_", "pbtest::noisy"} <= ops, ops
    assert not ops & {"aten::linear", "aten::dropout", "aten::native_dropout"}, ops


@pytest.mark.parametrize("recorder", RECORDERS)
def test_sparse_layouts_are_recorded(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COO and CSR outputs (no strides) are keyed as unreadable; the test is checked."""
    planted_conftest.makepyfile(
        test_sparse="""
        import torch

        def test_sparse_matmul():
            i = torch.tensor([[0, 1, 1], [2, 0, 2]])
            s = torch.sparse_coo_tensor(i, torch.tensor([3.0, 4.0, 5.0]), (2, 3))
            csr = s.to_sparse_csr()
            d = torch.randn(3, 4)
            assert (csr @ d).shape == (2, 4)
            assert torch.sparse.mm(s, d).shape == (2, 4)

        def test_planted_after_csr():
            csr = torch.eye(3).to_sparse_csr()
            y = torch.ops.pbtest.noisy(csr.to_dense())
            assert y.shape == (3, 3)
        """
    )
    result = session(
        planted_conftest,
        recorder,
        monkeypatch,
        "--backends-determinism-all",
        "--backends-determinism=3",
        "--backends-census=census.json",
        "-W",
        "ignore::UserWarning",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*nondeterministic op pbtest::noisy*", "*2 test(s) checked*"])
    assert _not_checked(planted_conftest) == {}
    assert "aten::_to_sparse_csr" in _census_ops(
        planted_conftest, "test_sparse.py::test_sparse_matmul"
    )


@pytest.mark.parametrize("recorder", RECORDERS)
def test_blamed_op_after_range_markers_is_located(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DataLoader's ``record_function`` ranges do not shift the located op indices."""
    planted_conftest.makepyfile(
        test_loader="""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def test_batches():
            for (x,) in DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=4):
                y = torch.ops.pbtest.noisy(x)
            assert y.shape == (4, 2)
        """
    )
    result = session(planted_conftest, recorder, monkeypatch, "--backends-determinism-all", "-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*nondeterministic op pbtest::noisy (cpu, float32) at test_loader.py:6 in test_batc*",
            "*also: nondeterministic op pbtest::noisy (cpu, float32) at test_loader.py:6 in*",
        ]
    )


def test_a_baseline_accepts_the_form_either_recorder_sees(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``index_select``'s backward runs ``index_add_`` natively, ``index_add`` under a mode.

    Torch's backward formulas take the out-of-place form while a Python
    dispatch mode is active, so the two recorders name the op differently; a
    baseline made under one recorder must accept what the other one records.
    The census here is the Python recorder's, with the op's verdict made
    nondeterministic (no CPU kernel is), checked against the native name.
    """
    planted_conftest.makepyfile(
        test_index="""
        import torch

        def test_embedding_like():
            w = torch.randn(10, 4, requires_grad=True)
            out = w.index_select(0, torch.tensor([1, 2, 2, 7]))
            out.backward(torch.randn(4, 4))
        """
    )
    seen: dict[str, set[str]] = {}
    for recorder in RECORDERS:
        session(
            planted_conftest,
            recorder,
            monkeypatch,
            "--backends-determinism-all",
            "--backends-determinism=2",
            "--backends-census=census.json",
        ).assert_outcomes(passed=1)
        ops = _census_ops(planted_conftest, "test_index.py::test_embedding_like")
        seen[recorder] = {op for op in ops if op.startswith("aten::index_add")}
    assert seen["python"] and all(seen.values()), seen
    census = json.loads((planted_conftest.path / "census.json").read_text(encoding="utf-8"))
    for row in census["entries"]:
        if row["op"].startswith("aten::index_add"):
            row["verdict"], row["device"] = "nondeterministic", "cuda"
            row["observations"] = {"nondeterministic": len(row["tests"])}
            row["nondeterministic_in"] = row["tests"]
    (planted_conftest.path / "census.json").write_text(json.dumps(census), encoding="utf-8")
    (planted_conftest.path / "baseline.json").write_text(
        json.dumps(
            {
                "format": "pytest-backends-baseline",
                "version": 1,
                "accepted": [{"op": "aten::index_add_", "device": "cuda", "dtype": "float32"}],
            }
        ),
        encoding="utf-8",
    )
    check = planted_conftest.run(
        sys.executable,
        "-m",
        "pytest_backends",
        "baseline",
        "--check",
        "--census",
        "census.json",
        "baseline.json",
    )
    assert check.ret == 0, check.stdout.str()
    check.stdout.fnmatch_lines(["every nondeterministic op of census.json is in the baseline*"])


@pytest.mark.parametrize("recorder", RECORDERS)
def test_strided_nested_tensors_are_keyed_by_their_components(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nested tensor has no sizes; the recorder keys it by its components' shapes.

    ``nn.TransformerEncoder`` in eval mode with a padding mask runs its fast
    path on nested tensors. Reading ``sizes()`` there broke both recorders, and
    the test was "not checked", hiding the planted op after it.
    """
    planted_conftest.makepyfile(
        test_nested="""
        import torch

        def _encoder():
            torch.manual_seed(0)
            layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
            return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()

        MASK = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])

        def test_encoder_fast_path():
            with torch.no_grad():
                y = _encoder()(torch.randn(3, 5, 16), src_key_padding_mask=MASK)
            assert y.shape == (3, 5, 16)

        def test_planted_after_fast_path():
            with torch.inference_mode():
                y = _encoder()(torch.randn(3, 5, 16), src_key_padding_mask=MASK)
            torch.ops.pbtest.noisy(y)

        def test_nested_tensor():
            nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)])
            assert (nt * 2).to_padded_tensor(0.0).shape == (2, 3, 4)
        """
    )
    result = session(
        planted_conftest,
        recorder,
        monkeypatch,
        "--backends-determinism-all",
        "--backends-determinism=3",
        "--backends-census=census.json",
        "-W",
        "ignore::UserWarning",
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*nondeterministic op pbtest::noisy*", "*3 test(s) checked, 0 not checked*"]
    )
    assert _not_checked(planted_conftest) == {}
