"""Determinism verdicts on ordinary user code, under both recorders.

Each case is a real pytest session (``runpytest_subprocess``) run once with
the native recorder and once with the Python recorder
(``PYTEST_BACKENDS_NATIVE=off``). The rule they check: an op is blamed only
when every input it received is proven equal between runs; an input that
cannot be proven equal makes the test "not checked" with its reason; and the
check never changes a test's outcome unless it blames an op.
"""

from __future__ import annotations

import re

import pytest
from sessions import session, unchecked

RECORDERS = ["native", "python"]


def _session(
    pytester: pytest.Pytester,
    recorder: str,
    monkeypatch: pytest.MonkeyPatch,
    *args: str,
) -> pytest.RunResult:
    return session(pytester, recorder, monkeypatch, "--backends-determinism-all", *args)


def _assert_recorder(result: pytest.RunResult, recorder: str) -> None:
    expected = "recorder: native*" if recorder == "native" else "recorder: Python*not native*"
    result.stdout.fnmatch_lines([expected])


def _no_blame(result: pytest.RunResult) -> None:
    out = result.stdout.str()
    assert "nondeterministic op" not in out, out
    assert "Segmentation fault" not in out + result.stderr.str()


@pytest.mark.parametrize("recorder", RECORDERS)
def test_deepcopy_and_storages_are_not_blamed(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 1: ``set_`` with a storage (deepcopy, Conv+BatchNorm reference) is never blamed."""
    planted_conftest.makepyfile(
        test_storages="""
        import copy
        import torch
        from pytest_backends import assert_close, reference

        def test_deepcopy_tensor():
            y = copy.deepcopy(torch.zeros(3))
            assert y.sum() == 0

        def test_reference_conv_bn():
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4))
            x = torch.randn(2, 2, 8, 8)
            assert_close(m(x), reference(m, x))

        def test_fresh_untyped_storage():
            t = torch.empty(0).set_(torch.UntypedStorage(64))
            assert t.numel() == 16

        def test_planted_after_deepcopy():
            y = copy.deepcopy(torch.ones(4))
            assert torch.ops.pbtest.noisy(y).shape == (4,)
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*nondeterministic op pbtest::noisy*"])
    out = result.stdout.str()
    assert "nondeterministic op aten::set_" not in out, out


@pytest.mark.parametrize("recorder", RECORDERS)
def test_dataloader_with_workers(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 2: batches from worker processes arrive through ``set_`` on shared memory."""
    planted_conftest.makepyfile(
        test_loader="""
        import pytest
        import torch
        from torch.utils.data import DataLoader

        @pytest.mark.parametrize("workers", [0, 2])
        def test_sum(workers):
            ds = torch.arange(32.0).reshape(16, 2)
            loader = DataLoader(ds, batch_size=4, num_workers=workers)
            assert sum(b.sum() for b in loader) == ds.sum()
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    _no_blame(result)
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("recorder", RECORDERS)
def test_explicit_generators_are_restored(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 3: a generator from a fixture or a global is restored; one out of reach is a reason."""
    planted_conftest.makepyfile(
        test_gens="""
        import pytest
        import torch

        GEN = torch.Generator().manual_seed(0)
        HIDDEN = type("Holder", (), {"gen": torch.Generator().manual_seed(2)})()

        @pytest.fixture
        def gen():
            return torch.Generator().manual_seed(1)

        def test_fixture_generator(gen):
            assert torch.randn(8, generator=gen).shape == (8,)

        def test_global_generator():
            assert torch.randperm(10, generator=GEN).shape == (10,)
            p = torch.full((4,), 0.5)
            assert torch.bernoulli(p, generator=GEN).shape == (4,)

        def test_unreached_generator():
            assert torch.randn(8, generator=HIDDEN.gen).shape == (8,)

        def test_planted_with_generator(gen):
            x = torch.randn(8, generator=gen)
            assert torch.ops.pbtest.noisy(x).shape == (8,)
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch, "-rA")
    _assert_recorder(result, recorder)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*3 test(s) checked, 1 not checked*",
            "*not checked: test_gens.py::test_unreached_generator:*torch.Generator*",
        ]
    )
    result.stdout.fnmatch_lines(["*nondeterministic op pbtest::noisy*"])
    out = result.stdout.str()
    for op in ("aten::randn", "aten::randperm", "aten::bernoulli"):
        assert f"nondeterministic op {op}" not in out, out


@pytest.mark.parametrize("recorder", RECORDERS)
def test_persistent_dataloader_names_the_state_it_keeps(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module-scoped DataLoader with persistent workers is not checked, and the
    reason names it (its workers and iterator outlive the runs), not the worker threads
    nor its generator (restored before every run, as generators held in objects are); a
    differing size is shown, not "?"."""
    planted_conftest.makepyfile(
        test_persist="""
        import pytest
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        @pytest.fixture(scope="module")
        def loader():
            g = torch.Generator().manual_seed(0)
            ds = TensorDataset(torch.arange(32.0).reshape(16, 2))
            return DataLoader(
                ds, batch_size=4, shuffle=True, num_workers=2,
                persistent_workers=True, generator=g,
            )

        def test_first(loader):
            for (b,) in loader:
                assert b.shape == (4, 2)
                break

        def test_again(loader):
            assert len([b[:, 0] * 2 for (b,) in loader]) == 4
        """
    )
    result, out, reasons = unchecked(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    result.assert_outcomes(passed=2)
    assert set(reasons) == {"test_first", "test_again"}, out
    for name, reason in reasons.items():
        assert "fixture 'loader'" in reason and "persistent workers" in reason, (name, reason)
        assert "loader.generator" not in reason, (name, reason)
        assert "other threads" not in reason, (name, reason)
        assert "? in run" not in reason, (name, reason)


@pytest.mark.parametrize("recorder", RECORDERS)
def test_rng_objects_kept_between_runs_are_restored(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NumPy and ``random.Random`` RNG objects a test reuses (module globals, a fixture's
    attribute, a class attribute) start every run where they were: the tests are checked,
    and a nondeterministic op fed from one is caught, not "not checked"."""
    planted_conftest.makepyfile(
        test_rngs="""
        import random
        import numpy as np
        import pytest
        import torch

        NP_RNG = np.random.default_rng(0)
        PY_RNG = random.Random(0)

        class Holder:
            def __init__(self):
                self.rng = np.random.RandomState(0)

        @pytest.fixture(scope="module")
        def holder():
            return Holder()

        def test_numpy_generator():
            assert torch.from_numpy(NP_RNG.standard_normal(4)).mul(2).shape == (4,)

        def test_python_random():
            assert torch.full((2,), PY_RNG.random()).mul(2).shape == (2,)

        def test_held_random_state(holder):
            assert torch.from_numpy(holder.rng.standard_normal(4)).mul(2).shape == (4,)

        class TestOnClass:
            RNG = random.Random(1)

            def test_class_attribute(self):
                assert torch.full((2,), self.RNG.random()).mul(2).shape == (2,)

        def test_planted_fed_from_numpy_rng():
            x = torch.from_numpy(NP_RNG.standard_normal(4)).float()
            assert torch.ops.pbtest.noisy(x).shape == (4,)
        """
    )
    result, out, reasons = unchecked(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    assert reasons == {}, out
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*nondeterministic op pbtest::noisy*"])
    assert re.search(r"FAILED \S+::test_planted_fed_from_numpy_rng", out), out


@pytest.mark.parametrize("recorder", RECORDERS)
def test_storage_swapped_between_runs(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 4: ``weight.data = other`` between runs is seen by content, not blamed on mm."""
    planted_conftest.makepyfile(
        test_swap="""
        import itertools
        import torch

        CKPTS = [torch.randn(4, 4) for _ in range(20)]
        NEXT = itertools.count()
        LAYER = torch.nn.Linear(4, 4, bias=False)

        def test_swap():
            LAYER.weight.data = CKPTS[next(NEXT)]
            assert LAYER(torch.ones(2, 4)).shape == (2, 4)
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    _no_blame(result)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*not checked: test_swap.py::test_swap: its inputs differ*"])


@pytest.mark.parametrize("recorder", RECORDERS)
def test_padding_buffers(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 5: circular padding copies parts of a partly written buffer; nothing is blamed."""
    planted_conftest.makepyfile(
        test_pad="""
        import pytest
        import torch
        import torch.nn.functional as F

        @pytest.mark.parametrize("mode", ["circular", "reflect", "replicate"])
        @pytest.mark.parametrize("dims", [2, 3])
        def test_pad(mode, dims):
            x = torch.arange(float(4 ** dims)).reshape(1, 1, *([4] * dims))
            y = F.pad(x, (1, 1) * dims, mode=mode)
            assert y.shape[-1] == 6
            assert torch.isfinite(y * 2).all()

        def test_planted_after_circular_pad():
            x = torch.arange(16.0).reshape(1, 1, 4, 4)
            y = torch.ops.pbtest.noisy(F.pad(x, (1, 1, 1, 1), mode="circular"))
            assert y.shape == (1, 1, 6, 6)
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(
        ["*nondeterministic op pbtest::noisy*", "*7 test(s) checked, 0 not checked*"]
    )
    assert "nondeterministic op aten::copy_" not in result.stdout.str()


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
def test_subtests_of_a_test_that_is_not_repeatable(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 6: subtests keep their plain outcomes; the test is not checked, as without them."""
    planted_conftest.makepyfile(
        test_sub="""
        import itertools
        import torch

        C = itertools.count()
        D = itertools.count()

        def test_with_subtests(subtests):
            for k in range(4):
                with subtests.test(k=k):
                    assert (torch.ones(3) * next(C))[0].item() < 4

        def test_without_subtests():
            for k in range(4):
                assert (torch.ones(3) * next(D))[0].item() < 4
        """
    )
    plain = planted_conftest.runpytest_subprocess("-p", "no:xdist")
    plain.assert_outcomes(passed=2)
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    out = result.stdout.str()
    assert "SUBFAILED" not in out and "failed subtest" not in out, out
    result.assert_outcomes(passed=2)
    summary = re.compile(r"=+ (.*) in [\d.]+s")
    result.stdout.fnmatch_lines(
        [
            "*not checked: test_sub.py::test_with_subtests: run 1 raised*not repeatable",
            "*not checked: test_sub.py::test_without_subtests: run 1 raised*not repeatable",
        ],
        consecutive=False,
    )
    # The same counts as the plain run (subtests of later runs are not counted).
    expected = summary.search(plain.stdout.lines[-1])
    got = summary.search(result.stdout.lines[-1])
    assert expected is not None and got is not None
    assert got.group(1) == expected.group(1), (plain.stdout.lines[-1], result.stdout.lines[-1])


@pytest.mark.parametrize("recorder", RECORDERS)
def test_wrapper_subclasses_and_jagged_nested_tensors(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 7: ops inside ``__torch_dispatch__`` are unseen: the test is "not checked"."""
    planted_conftest.makepyfile(
        test_wrap="""
        import torch
        from torch.utils._pytree import tree_map

        class Wrap(torch.Tensor):
            @staticmethod
            def __new__(cls, elem):
                r = torch.Tensor._make_wrapper_subclass(
                    cls, elem.size(), dtype=elem.dtype, device=elem.device
                )
                r.elem = elem
                return r

            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
                def unwrap(t):
                    return t.elem if isinstance(t, Wrap) else t

                def wrap(t):
                    return Wrap(t) if isinstance(t, torch.Tensor) else t

                out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
                return tree_map(wrap, out)

        def test_planted_in_wrapper():
            y = torch.ops.pbtest.noisy(Wrap(torch.ones(3)) * 2)
            assert y.shape == (3,)

        def test_jagged():
            nt = torch.nested.nested_tensor(
                [torch.ones(2), torch.ones(3)], layout=torch.jagged
            )
            assert (nt * 2).sin().is_nested
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*0 test(s) checked, 2 not checked*",
            "*not checked: test_wrap.py::test_jagged: ops on NestedTensor tensors*",
            "*not checked: test_wrap.py::test_planted_in_wrapper: ops on Wrap tensors*",
        ]
    )


@pytest.mark.parametrize("recorder", RECORDERS)
def test_freed_storages_and_expanded_views(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repros 9 and 10: a freed storage is never read; an expanded view is never materialised."""
    planted_conftest.makepyfile(
        test_memory="""
        import resource
        import pytest
        import torch

        W = torch.randn(4, 4)

        @pytest.fixture
        def big():
            return torch.zeros(1).expand(2 * 10**8)

        def test_freed_storage():
            v = W.view(16)
            W.untyped_storage().resize_(0)
            assert v.shape == (16,)
            assert (torch.ones(2) + 1).sum() == 4

        def test_expanded(big):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            assert big[:3].sum() == 0
            assert (big[:5] + 1).sum() == 5
            grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            assert grown_kib < 256 * 1024, grown_kib  # materialised, it would be 800 MB

        def test_planted_on_expanded(big):
            assert torch.ops.pbtest.noisy(big[:4]).shape == (4,)
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch, "--backends-determinism=2")
    assert result.ret != -11 and "Segmentation fault" not in result.stderr.str()
    _assert_recorder(result, recorder)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*nondeterministic op pbtest::noisy*"])


def test_overlapping_views_are_keyed_by_the_memory_they_cover() -> None:
    """Expanded views with different strides or contents get different keys; no copy is made."""
    import torch

    from pytest_backends.determinism.keys import covered_memory

    big = torch.zeros(1).expand(10**9)
    covered = covered_memory(big)
    assert covered is not None
    view, extra = covered
    assert view.numel() == 1 and extra == ("strided", (10**9,), (0,))
    x = torch.arange(6.0)
    assert covered_memory(x) == (x, ())
    freed = torch.randn(4)
    alias = freed.view(2, 2)
    freed.untyped_storage().resize_(0)
    assert covered_memory(alias) is None


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
def test_testcase_outcomes_under_the_check(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repro 11: a TestCase's failures, skips, xfails and successes count as in a plain run."""
    planted_conftest.makepyfile(
        test_case="""
        import itertools
        import unittest
        import pytest
        import torch

        C = itertools.count()

        class T(unittest.TestCase):
            def test_fail(self):
                self.assertEqual(1, 2)

            def test_error(self):
                raise RuntimeError("x")

            def test_ok(self):
                self.assertEqual((torch.ones(2) * 2).sum().item(), 4.0)

            def test_skip(self):
                self.skipTest("no")

            @unittest.skip("decorated")
            def test_skip_decorated(self):
                pass

            @unittest.expectedFailure
            def test_xfail(self):
                self.assertEqual(1, 2)

            @unittest.expectedFailure
            def test_unexpected_success(self):
                pass

            def test_not_repeatable(self):
                self.assertLess(next(C), 1)

        @pytest.mark.backends(deterministic="on")
        class Marked(unittest.TestCase):
            def test_planted(self):
                torch.ops.pbtest.noisy(torch.ones(2))

            def test_fail(self):
                self.assertEqual(1, 2)
        """
    )
    plain = planted_conftest.runpytest_subprocess("-p", "no:xdist")
    plain.assert_outcomes(failed=4, passed=3, skipped=2, xfailed=1)
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    # The planted op is the one difference: that test fails under the check.
    result.assert_outcomes(failed=5, passed=2, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*not checked: test_case.py::T::test_not_repeatable: run 1 raised*",
            "*not checked: test_case.py::T::test_skip: it was skipped in its first run*",
            "*not checked: test_case.py::T::test_xfail: it xfailed in its first run*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(["*nondeterministic op pbtest::noisy*"])
    assert "ERROR" not in result.stdout.str()


def test_unproven_inputs_are_never_blamed() -> None:
    """The proof rule in the comparison: an equal-looking opaque input blames nothing."""
    from pytest_backends.determinism.compare import compare_runs
    from pytest_backends.determinism.record import Digest, OpCall, RunLog

    def digest(value: int) -> Digest:
        d = Digest()
        d.value = (value, value)
        return d

    def run(out: int, *inputs: object) -> RunLog:
        return RunLog([OpCall("aten::foo", "cpu", "float32", tuple(inputs), (digest(out),))])

    opaque = ("opaque", "float32", (4,), "unreadable")
    storage = ("object", "UntypedStorage")
    for weak in (opaque, storage):
        comparison = compare_runs([run(1, digest(0), weak), run(2, digest(0), weak)])
        assert not comparison.blamed
        assert comparison.unexplained is not None
        assert comparison.unexplained.kind == "unproven"
        assert "input 1" in (comparison.unexplained.origin or "")
    proven = compare_runs([run(1, digest(0), 3), run(2, digest(0), 3)])
    assert [d.op for d in proven.blamed] == ["aten::foo"]


@pytest.mark.parametrize("recorder", RECORDERS)
def test_skip_and_xfail_inside_the_body_say_so(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test skipped or xfailed in its body is "not checked" with that reason, not "failed"."""
    planted_conftest.makepyfile(
        test_body="""
        import pytest
        import torch

        def test_skips():
            torch.ones(2) * 2
            pytest.skip("not on this machine")

        def test_xfails():
            torch.ones(2) * 2
            pytest.xfail("known")

        @pytest.mark.xfail(strict=True, raises=AssertionError)
        def test_xfail_marker():
            assert torch.ops.pbtest.noisy(torch.ones(4)).sum() < 0

        @pytest.mark.xfail(raises=KeyError)
        def test_xfail_marker_other_error():
            assert torch.ones(4).sum() < 0
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    _assert_recorder(result, recorder)
    result.assert_outcomes(skipped=1, xfailed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*not checked: test_body.py::test_skips: it was skipped in its first run*",
            "*not checked: test_body.py::test_xfail_marker: it xfailed in its first run*",
            "*not checked: test_body.py::test_xfail_marker_other_error: it failed in its first*",
            "*not checked: test_body.py::test_xfails: it xfailed in its first run*",
        ],
        consecutive=False,
    )


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_hypothesis_test_that_draws_other_examples_names_hypothesis(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason names hypothesis's generator and the fix; a derandomized test is checked.

    ``derandomize=False`` is explicit: hypothesis's CI profile (the ``CI`` variable) derandomizes.
    """
    planted_conftest.makepyfile(
        test_given="""
        import torch
        from hypothesis import given, settings, strategies as st
        from conftest import noisy

        @settings(max_examples=10, deadline=None, database=None, derandomize=False)
        @given(st.integers(1, 6))
        def test_random_examples(n):
            assert torch.randn(n).isfinite().all()

        @settings(max_examples=10, deadline=None, database=None, derandomize=True)
        @given(st.integers(1, 6))
        def test_derandomized(n):
            assert noisy(torch.ones(n)).isfinite().all()
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*nondeterministic op pbtest::noisy*in test_derandomized*",
            "not checked: test_given.py::test_random_examples: *hypothesis's example generator"
            "*@settings(derandomize=True)*",
        ]
    )


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_test_that_reseeds_from_a_clock_is_not_checked_and_told_why(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The global generator reseeded from a clock: not "a generator passed to", the cause."""
    planted_conftest.makepyfile(
        test_clock="""
        import time
        import torch

        def test_seeded_from_the_clock():
            torch.manual_seed(time.perf_counter_ns() % 100003)
            assert torch.randn(3).isfinite().all()
        """
    )
    result = _session(planted_conftest, recorder, monkeypatch)
    result.assert_outcomes(passed=1)
    _no_blame(result)
    result.stdout.fnmatch_lines(
        [
            "not checked: test_clock.py::test_seeded_from_the_clock: *the generator aten::randn*"
            "draws from*is in a different state*reseeds it from a value that changes between "
            "runs*"
        ]
    )
