"""The batch_invariant marker in real pytest sessions: census section, baseline gate, configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not hasattr(torch.library, "custom_op"), reason="torch.library.custom_op needs torch >= 2.4"
)

PLANTED = """
import pytest
import torch

from pytest_backends import assert_batch_invariant


@torch.library.custom_op("suite::by_batch", mutates_args=())
def by_batch(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + 1e-3 * x.shape[0])


@by_batch.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("suite::other", mutates_args=())
def other(x: torch.Tensor) -> torch.Tensor:
    return x + 1e-3 * x.shape[0]


@other.register_fake
def _(x):
    return torch.empty_like(x)
"""

OLD_TESTS = """

@pytest.mark.batch_invariant
def test_old_variant_op():
    assert_batch_invariant(lambda t: torch.relu(by_batch(t)), torch.randn(8, 4))


@pytest.mark.batch_invariant(sizes=[1, 3])
def test_softmax():
    result = assert_batch_invariant(lambda t: t.softmax(-1), torch.randn(8, 4))
    assert result.sizes == (1, 3, 8)
"""

NEW_TEST = """

@pytest.mark.batch_invariant
def test_new_variant_op():
    assert_batch_invariant(lambda t: other(t) * 2, torch.randn(8, 4))
"""

TOLERANCE_TEST = """

@pytest.mark.batch_invariant(tolerance="report")
def test_new_op_in_tolerance_mode():
    result = assert_batch_invariant(lambda t: other(t) * 2, torch.randn(8, 4))
    assert result.max_abs > 0
"""


AT_ONE = """
@torch.library.custom_op("suite::at_one", mutates_args=())
def at_one(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + 1e-3 * (x.shape[0] == 1))


@at_one.register_fake
def _(x):
    return torch.empty_like(x)
"""

AT_TWO = """
@torch.library.custom_op("suite::at_two", mutates_args=())
def at_two(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + 1e-3 * (x.shape[0] == 2))


@at_two.register_fake
def _(x):
    return torch.empty_like(x)
"""


def _baseline(path: Path, *ops: str) -> Path:
    """A batch baseline at ``path`` accepting ``ops`` on the CPU."""
    accepted = [{"op": op, "device": "cpu"} for op in ops]
    path.write_text(
        json.dumps({"format": "pytest-backends-baseline", "version": 1, "accepted": accepted})
    )
    return path


def _census(path: Path) -> dict[str, dict[str, object]]:
    data = json.loads(path.read_text())
    assert data["format"] == "pytest-backends-census"
    return {row["op"]: row for row in data["batch_invariance"]["entries"]}


@pytest.mark.slow
def test_baseline_gate_fails_only_on_a_new_batch_variant_op(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=PLANTED + OLD_TESTS)
    # Without a baseline the planted op fails its test, naming the op and the line.
    plain = pytester.runpytest_subprocess()
    plain.assert_outcomes(passed=1, failed=1)
    source = (pytester.path / "test_suite.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "torch.relu(by_batch(t))" in text)
    plain.stdout.fnmatch_lines(
        [
            f"*first batch-variant op: suite::by_batch (cpu, float32) at test_suite.py:{line} *",
            "*suite::by_batch (cpu, float32): BATCH-VARIANT; batch-variant at sizes 1, 4*",
        ]
    )
    baseline = pytester.path / "batch-baseline.json"
    update = pytester.runpytest_subprocess(
        f"--backends-batch-baseline={baseline}", "--backends-batch-baseline-update"
    )
    update.assert_outcomes(passed=2)
    accepted = json.loads(baseline.read_text())["accepted"]
    assert [(e["op"], e["device"]) for e in accepted] == [("suite::by_batch", "cpu")]

    again = pytester.runpytest_subprocess(f"--backends-batch-baseline={baseline}")
    again.assert_outcomes(passed=2)
    assert again.ret == pytest.ExitCode.OK
    again.stdout.fnmatch_lines(["*suite::by_batch (cpu, float32): accepted by the baseline*"])

    pytester.makepyfile(test_suite=PLANTED + OLD_TESTS + NEW_TEST)
    new = pytester.runpytest_subprocess(f"--backends-batch-baseline={baseline}")
    new.assert_outcomes(passed=2, failed=1)
    new.stdout.fnmatch_lines(
        [
            "*first batch-variant op: suite::other (cpu, float32) at test_suite.py:*",
            "*suite::other (cpu, float32): NEW, not in the baseline*",
            "*FAILED: 1 batch-variant op(s) not in the baseline*: suite::other (cpu, float32)",
        ]
    )
    assert "FAILED test_suite.py::test_old_variant_op" not in new.stdout.str()


def test_tolerance_mode_test_passes_but_a_new_op_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=PLANTED + OLD_TESTS + TOLERANCE_TEST)
    baseline = _baseline(pytester.path / "b.json", "suite::by_batch")
    result = pytester.runpytest_subprocess(f"--backends-batch-baseline={baseline}")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*FAILED: 1 batch-variant op(s) not in the baseline*other*"])
    # Accepting the op makes the same run pass.
    data = json.loads(baseline.read_text())
    data["accepted"].append({"op": "suite::other", "device": "cpu", "note": "known"})
    baseline.write_text(json.dumps(data))
    accepted = pytester.runpytest_subprocess(f"--backends-batch-baseline={baseline}")
    accepted.assert_outcomes(passed=3)
    assert accepted.ret == pytest.ExitCode.OK


def test_census_section_names_real_batch_variant_and_invariant_ops(
    pytester: pytest.Pytester,
) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 512, generator=gen), torch.randn(512, 1024, generator=gen)
    if torch.equal(torch.mm(a[:1], b), torch.mm(a, b)[:1]):
        pytest.skip("torch.mm is batch-invariant here at 64x512 (row 0 measured equal)")
    pytester.makepyfile(
        test_census="""
import pytest
import torch
from pytest_backends import assert_batch_invariant

@pytest.mark.batch_invariant(rtol=1e-3, atol=1e-3)
def test_mm():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 512, generator=gen), torch.randn(512, 1024, generator=gen)
    assert_batch_invariant(torch.mm, a, b, dim=(0, None), sizes=(1, 2), permute=False)

@pytest.mark.batch_invariant
def test_softmax():
    x = torch.randn(16, 32, requires_grad=True)
    assert_batch_invariant(lambda t: torch.softmax(t, -1), x)
"""
    )
    census = pytester.path / "census.json"
    result = pytester.runpytest_subprocess(f"--backends-census={census}")
    result.assert_outcomes(passed=2)
    rows = _census(census)
    assert rows["aten::mm"]["verdict"] == "batch_variant"
    assert rows["aten::mm"]["batch_variant_in"] == ["test_census.py::test_mm"]
    softmax = rows["aten::_softmax"]
    assert softmax["verdict"] == "no_difference"
    assert softmax["description"] == "no difference in 2 sizes"
    assert softmax["sizes_compared"] == [1, 8]
    assert rows["aten::_softmax_backward_data"]["verdict"] == "no_difference"
    assert softmax["configs"] == {"default": "no_difference"}
    result.stdout.fnmatch_lines(["*aten::mm (cpu, float32): BATCH-VARIANT*per config: default*"])


@pytest.mark.slow
def test_verdicts_per_matrix_config_over_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(
        PLANTED
        + """

@pytest.mark.backends("mkldnn")
@pytest.mark.batch_invariant
def test_rows(backend_config):
    assert_batch_invariant(lambda t: torch.relu(t) * 2, torch.randn(8, 4))
"""
    )
    census = pytester.path / "census.json"
    result = pytester.runpytest_subprocess(
        "--backends-matrix", "-n", "2", f"--backends-census={census}"
    )
    result.assert_outcomes(passed=2)
    relu = _census(census)["aten::relu"]
    assert relu["configs"] == {"mkldnn-off": "no_difference", "mkldnn-on": "no_difference"}
    assert len(relu["tests"]) == 2  # type: ignore[arg-type]


def test_marker_errors_and_unchecked_marked_tests_fail_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        PLANTED
        + """

@pytest.mark.batch_invariant(size=[1])
def test_bad_marker():
    assert_batch_invariant(torch.sin, torch.randn(4, 2))

@pytest.mark.batch_invariant(sizes=[0])
def test_bad_size():
    assert_batch_invariant(torch.sin, torch.randn(4, 2))

@pytest.mark.batch_invariant
def test_never_checks():
    assert torch.ones(2).sum() == 2

def test_unmarked():
    assert_batch_invariant(torch.sin, torch.randn(4, 2))
"""
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1, errors=2)
    result.stdout.fnmatch_lines_random(
        [
            "*@pytest.mark.batch_invariant on *test_bad_marker: got an unexpected keyword "
            "argument 'size'*",
            "*@pytest.mark.batch_invariant on *test_bad_size: sizes must be a non-empty list of "
            "positive ints, got [[]0[]]*",
            "*test_never_checks is marked @pytest.mark.batch_invariant but never called "
            "assert_batch_invariant*",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()


def test_bad_baseline_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    bad = pytester.path / "bad.json"
    bad.write_text("{not json")
    result = pytester.runpytest_subprocess(f"--backends-batch-baseline={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--backends-batch-baseline: *bad.json*"])
    update = pytester.runpytest_subprocess("--backends-batch-baseline-update")
    assert update.ret == pytest.ExitCode.USAGE_ERROR
    update.stderr.fnmatch_lines(["*--backends-batch-baseline=PATH*"])


def test_ops_without_batch_rows_stay_out_of_the_census_and_new_ops_fail_their_test(
    pytester: pytest.Pytester,
) -> None:
    # Picking a target logit with torch.arange(t.shape[0]): arange has no batch-row input,
    # so it can never be blamed; with an empty baseline the run passes and exits 0.
    pytester.makepyfile(
        test_pick="""
import pytest, torch, torch.nn as nn, torch.nn.functional as F
from pytest_backends import assert_batch_invariant

def test_channels_last_pool():
    x = torch.randn(8, 64, 14, 14).to(memory_format=torch.channels_last)
    assert_batch_invariant(lambda t: F.adaptive_avg_pool2d(t, 1).flatten(1), x, sizes=(1,))

@pytest.mark.batch_invariant
def test_pick_target_logit():
    x, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    assert_batch_invariant(lambda t, l: t[torch.arange(t.shape[0]), l], x, labels)
"""
    )
    empty = _baseline(pytester.path / "empty.json")
    census = pytester.path / "census.json"
    result = pytester.runpytest_subprocess(
        f"--backends-batch-baseline={empty}", f"--backends-census={census}", "test_pick.py"
    )
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    assert "aten::arange" not in result.stdout.str()
    assert "aten::arange" not in census.read_text()
    assert "aten::index" in _census(census)

    # The row alone hits an accepted op; a slice of two hits a new one: the test fails.
    pytester.makepyfile(
        test_behind=PLANTED
        + AT_ONE
        + """


@torch.library.custom_op("suite::at_two", mutates_args=())
def at_two(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + 1e-3 * (x.shape[0] == 2))


@at_two.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.batch_invariant(sizes=[1, 2], permute=False)
def test_new_op_behind_an_accepted_one():
    assert_batch_invariant(lambda t: at_two(at_one(t)), torch.randn(8, 4))
"""
    )
    baseline = _baseline(pytester.path / "accepts-a.json", "suite::at_one")
    behind = pytester.runpytest_subprocess(
        f"--backends-batch-baseline={baseline}", "test_behind.py"
    )
    behind.assert_outcomes(failed=1)
    behind.stdout.fnmatch_lines(
        [
            "*first batch-variant op: suite::at_two (cpu, float32)*",
            "*suite::at_two (cpu, float32): NEW, not in the baseline*",
        ]
    )


CAUSES_ELSEWHERE = """

class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * g.shape[0]


@pytest.mark.batch_invariant(sizes=[1, 2], permute=False)
def test_a_value_from_the_batch_size_beside_an_accepted_op():
    def f(t):
        return {"a": at_one(t), "b": t * (2.0 if t.shape[0] == 2 else 1.0)}

    assert_batch_invariant(f, torch.randn(8, 4))


@pytest.mark.batch_invariant(sizes=[1, 2], permute=False)
def test_a_gradient_beside_an_accepted_op():
    x = torch.randn(8, 4, requires_grad=True)
    assert_batch_invariant(lambda t: (at_one(t.detach()), Scale.apply(t)), x)


@pytest.mark.batch_invariant(sizes=[1, 2], permute=False)
def test_an_unused_op_is_not_the_cause():
    def f(t):
        at_one(t)  # its result is never used
        return t * (2.0 if t.shape[0] == 2 else 1.0)

    assert_batch_invariant(f, torch.randn(8, 4))


@pytest.mark.batch_invariant(sizes=[1, 2], permute=False)
def test_an_unused_variant_op_in_the_failing_sub_batch():
    def f(t):
        at_two(t)  # batch-variant in the slices of two, its result never used
        return t * (2.0 if t.shape[0] == 2 else 1.0)

    assert_batch_invariant(f, torch.randn(8, 4))


@pytest.mark.batch_invariant(sizes=[1, 2], permute=False)
def test_a_new_op_where_the_rows_are_equal():
    def f(t):
        at_two(t)  # batch-variant at size 2, its result never used
        return at_one(t)

    assert_batch_invariant(f, torch.randn(8, 4))
"""


def test_an_accepted_op_explains_only_the_rows_it_changed(pytester: pytest.Pytester) -> None:
    """A failing part passes only when every cause in its own sub-batch is accepted, and the
    message names a cause of the failing sub-batch, never one from another."""
    pytester.makepyfile(test_causes=PLANTED + AT_ONE + AT_TWO + CAUSES_ELSEWHERE)
    baseline = _baseline(pytester.path / "accepts-at-one.json", "suite::at_one")
    accepted = pytester.runpytest_subprocess(
        f"--backends-batch-baseline={baseline}", "test_causes.py"
    )
    accepted.assert_outcomes(failed=5)
    text = accepted.stdout.str()
    assert text.count("a value computed from the batch size") >= 3, text
    for line in (
        "output['b'] row 0 differs between the full batch (size 8) and a sub-batch of size 2 "
        "(rows 0..1)",
        "grad of input 0 row 0 differs between the full batch (size 8) and a sub-batch of "
        "size 1 (row 0 alone)",
        "its argument `other` is 8 in the full batch and 1 in the sub-batch",
    ):
        assert line in text, line
    # A new op where the compared rows are equal fails the test, named with its own case.
    assert (
        "an op outside the batch baseline ran too: first batch-variant op: suite::at_two "
        "(cpu, float32)" in text
    ), text
    # Without a baseline the unused op is new, and still not the failing sub-batch's cause.
    plain = pytester.runpytest_subprocess("test_causes.py", "-k", "unused_op_is_not")
    plain.assert_outcomes(failed=1)
    plain.stdout.fnmatch_lines(
        [
            "*output row 0 differs between the full batch (size 8) and a sub-batch of size 2 "
            "(rows 0..1)*",
            "*aten::mul (cpu, float32) at test_causes.py:* got equal tensor inputs but its "
            "argument `other` is 1.0 in the full batch and 2.0 in the sub-batch between the "
            "full batch and rows 0..1*",
        ]
    )
    assert "first batch-variant op: suite::at_one" not in plain.stdout.str()
    # An op whose output reaches nothing compared is not the cause, even in the failing slice.
    unused = pytester.runpytest_subprocess("test_causes.py", "-k", "unused_variant")
    unused.assert_outcomes(failed=1)
    unused.stdout.fnmatch_lines(
        [
            "*output row 0 differs between the full batch (size 8) and a sub-batch of size 2 "
            "(rows 0..1)*",
            "*aten::mul (cpu, float32) at test_causes.py:* got equal tensor inputs*",
        ]
    )
    assert "first batch-variant op: suite::at_two" not in unused.stdout.str()


ONLY_ALONE = """

@torch.library.custom_op("suite::alone", mutates_args=())
def alone(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + 1e-3 * (x.shape[0] == 1))


@alone.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.batch_invariant(sizes=[1, 4], tolerance="report", permute=False)
def test_alone():
    assert_batch_invariant(alone, torch.randn(8, 4))
"""


def test_a_variant_ops_census_lists_the_sizes_it_was_the_same_at(pytester: pytest.Pytester) -> None:
    """Compared at 1 (differs) and 4 (the same): both are sizes compared."""
    pytester.makepyfile(test_suite=PLANTED + ONLY_ALONE)
    census = pytester.path / "census.json"
    result = pytester.runpytest_subprocess("-p", "no:randomly", f"--backends-census={census}")
    assert result.ret != pytest.ExitCode.INTERNAL_ERROR
    row = _census(census)["suite::alone"]
    assert row["sizes_differing"] == [1]
    assert row["sizes_compared"] == [1, 4]
