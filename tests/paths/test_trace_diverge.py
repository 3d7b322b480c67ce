"""``--backends-trace`` at two CPU levels, compared offline by ``pytest-backends diverge``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_backends.__main__ import main

pytest_plugins = ["pytester"]

SUITE = """
import pytest, torch

@torch.library.custom_op("trace_tests::level_bump", mutates_args=())
def level_bump(x: torch.Tensor) -> torch.Tensor:
    return x + (1e-2 if torch.backends.cpu.get_cpu_capability() == "DEFAULT" else 0.0)

def _body(x):
    y = torch.nn.functional.gelu(x * 1.7).exp() - torch.tanh(x)
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        y = y.clone()  # an op on one path only
    return torch.nn.functional.linear(y, torch.ones(3, 37)).sigmoid()

@pytest.mark.backends("mkldnn")
def test_agrees():
    torch.manual_seed(0)
    _body(torch.randn(64, 37))

@pytest.mark.backends("mkldnn")
def test_planted():
    torch.manual_seed(0)
    y = _body(torch.randn(64, 37))
    level_bump(y)  # PLANTED
"""


def _levels() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@pytest.mark.skipif(not _levels(), reason="needs a CPU that runs the avx2 level")
def test_default_and_avx2_traces_agree_and_a_planted_level_op_is_named(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = pytester.makepyfile(test_levels=SUITE)
    planted = next(
        i for i, line in enumerate(SUITE.splitlines()[1:], 1) if line.endswith("# PLANTED")
    )
    for level in ("default", "avx2"):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", level)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--backends-trace=tr_{level}"
        )
        result.assert_outcomes(passed=2)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    a, b = pytester.path / "tr_default", pytester.path / "tr_avx2"
    assert main(["diverge", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    # An op on one level only (the clone) is a divergence of its own, never "agree".
    agrees = next(line for line in out.splitlines() if "test_agrees" in line)
    assert "agree within bounds" not in agrees, out
    assert f"the paths part at aten::clone ({path}:" in agrees, out
    assert "ran under default@default only" in agrees, out
    assert "on one side only" in agrees and ", 0 on one side only" not in agrees
    parted = next(line for line in out.splitlines() if "test_planted" in line)
    assert f"the paths part at trace_tests::level_bump ({path}:{planted}," in parted, out
    assert "tolerance certificate" in out and "dtype eps" in out
    # The counts of a parting pair are those of the whole traces: the planted test runs the
    # agreeing test's ops and one more, on both levels.
    counts = {
        name: tuple(int(w) for w in line.split(": ", 1)[1].split()[:4:3])
        for name in ("test_agrees", "test_planted")
        for line in out.splitlines()
        if name in line and "ops aligned" in line
    }
    assert counts["test_planted"] == (counts["test_agrees"][0] + 1, counts["test_agrees"][1])
    # Wherever the parting op sits: moved first, the pair still counts every op.
    from pytest_backends.paths.trace import Trace, compare

    fa, fb = (sorted((root).rglob("*planted*/*.jsonl"))[0] for root in (a, b))
    ta, tb = Trace.load(fa), Trace.load(fb)
    first = Trace(tb.path, tb.header, tb.ops[-1:] + tb.ops[:-1])
    assert compare(ta, first)[0] is not None
    assert compare(ta, first)[1:] == compare(ta, tb)[1:] == (len(tb.ops), len(ta.ops) - len(tb.ops))
    assert main(["diverge", str(a / "nothing"), str(b)]) == 2
    # Nothing in common (a wrong path, or empty directories) compares nothing: not "agree".
    (pytester.path / "empty_a").mkdir()
    (pytester.path / "empty_b").mkdir()
    assert main(["diverge", str(pytester.path / "empty_a"), str(pytester.path / "empty_b")]) == 2
    assert main(["diverge", str(a), str(pytester.path / "empty_b")]) == 2
    assert "nothing compared" in capsys.readouterr().err


def test_bad_trace_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    (pytester.path / "afile").write_text("x")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--backends-trace=afile")
    assert "--backends-trace" in result.stderr.str() and "not a directory" in result.stderr.str()
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


ZOO_SUITE = """
import pytest, torch
import zoo

@pytest.mark.backends("mkldnn")
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_entry(name):
    torch.manual_seed(0)
    zoo.run_entry(name, "cpu")
"""


@pytest.mark.skipif(not _levels(), reason="needs a CPU that runs the avx2 level")
def test_zoo_traced_at_default_and_avx2_has_no_false_blames(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    zoo = Path(__file__).parents[1] / "determinism" / "zoo.py"
    pytester.makepyfile(zoo=zoo.read_text(), test_zoo_levels=ZOO_SUITE)
    for level in ("default", "avx2"):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", level)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--backends-trace=z_{level}"
        )
        assert result.ret == 0, result.stdout.str()
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    code = main(["diverge", str(pytester.path / "z_default"), str(pytester.path / "z_avx2")])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "ops aligned" in line]
    parted = [line for line in lines if "agree within bounds" not in line]
    assert len(lines) >= 40 and parted == [] and code == 0, out


UNSAMPLED_SUITE = """
import pytest, torch

@torch.library.custom_op("trace_tests::bump_one", mutates_args=())
def bump_one(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    if torch.backends.mkldnn.enabled:
        y.view(-1)[1] += 100.0  # flat index 1: between the samples of a 128-element tensor
    return y

@torch.library.custom_op("trace_tests::flip_one", mutates_args=())
def flip_one(x: torch.Tensor) -> torch.Tensor:
    mask = x > 0
    if torch.backends.mkldnn.enabled:
        mask.view(-1)[1] = ~mask.view(-1)[1]
    return mask

@pytest.mark.backends("mkldnn")
def test_float(backend_config):
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    (bump_one(x) * 2).sum()  # BUMP

@pytest.mark.backends("mkldnn")
def test_mask(backend_config):
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    m = flip_one(x)  # FLIP
    x.where(m, 0.0).sum()
"""


def test_a_change_the_samples_miss_is_blamed_on_its_op_and_two_files_pair(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sketch's norms see every element, a discrete tensor's digest every value.

    The op that changed an element between the samples (a float) or a bool is
    the one named, not the reduction after it; and two files given by name are
    one pair, never also "only in" either side.
    """
    path = pytester.makepyfile(test_unsampled=UNSAMPLED_SUITE)
    lines = UNSAMPLED_SUITE.splitlines()[1:]
    bump = next(i for i, line in enumerate(lines, 1) if line.endswith("# BUMP"))
    flip = next(i for i, line in enumerate(lines, 1) if line.endswith("# FLIP"))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--backends-matrix", "--backends-trace=tr"
    )
    result.assert_outcomes(passed=4)
    for test, op, line in (("float", "bump_one", bump), ("mask", "flip_one", flip)):
        on, off = (
            next((pytester.path / "tr").glob(f"*test_{test}_mkldnn-{v}/*.jsonl"))
            for v in ("on", "off")
        )
        assert main(["diverge", str(on), str(off)]) == 1
        out = capsys.readouterr().out
        assert f"the paths part at trace_tests::{op} ({path}:{line}," in out, out
        assert "only in" not in out, out


_PLANT = {"index": -1, "by": 100.0}


@torch.library.custom_op("trace_tests::plant", mutates_args=())
def plant(x: torch.Tensor) -> torch.Tensor:
    """Adds ``_PLANT["by"]`` to one flat element while ``_PLANT["index"]`` names one."""
    y = x.clone()
    if _PLANT["index"] >= 0:
        y.view(-1)[int(_PLANT["index"])] += _PLANT["by"]
    return y


def _planted_traces(root: Path, shape: tuple[int, int], index: int) -> list[Path]:
    """Two traces of ``plant``: untouched, then with element ``index`` planted."""
    from pytest_backends.paths.trace import header, tracing

    torch.manual_seed(0)
    x = torch.randn(shape)
    paths = []
    try:
        for name, planted in (("a", -1), ("b", index)):
            _PLANT["index"] = planted
            paths.append(root / f"{name}.jsonl")
            with tracing(paths[-1], header(name, {}, "cpu", "t")):
                plant(x)
    finally:
        _PLANT["index"] = -1
    return paths


@pytest.mark.parametrize(
    ("shape", "index", "shown"),
    [
        ((8, 16), 1, "max abs >= {} (the samples agree; the norms differ)"),
        ((8, 16), 0, "max abs >= {} (32 of 128 values sampled)"),
        ((4, 4), 5, "(max abs {}), bound"),
    ],
    ids=["norms-only", "sampled", "every-value"],
)
def test_a_max_abs_the_sketch_only_bounds_is_shown_as_a_lower_bound(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shape: tuple[int, int],
    index: int,
    shown: str,
) -> None:
    """A sketch keeps 32 values: the max abs error of a larger tensor is a lower bound
    (from the samples, or only from the norms when the samples agree), never "the max"."""
    from pytest_backends.paths.trace import Trace, compare

    paths = _planted_traces(tmp_path, shape, index)
    assert main(["diverge", *map(str, paths)]) == 1
    out = capsys.readouterr().out
    found = compare(*(Trace.load(p) for p in paths))[0]
    assert found is not None and found.op == "trace_tests::plant", out
    assert shown.format(f"{found.max_abs:.3g}") in out, out
    assert found.max_abs <= 100.0 * (1 + 1e-6)
    exact = shape == (4, 4)
    assert (found.max_abs == pytest.approx(100.0, rel=1e-6)) if exact else found.max_abs > 0
    assert found.lower_bound == ("" if exact else shown.split("(")[1].rstrip(")"))
    assert ("max rel error >= " in out) != exact, out


def test_a_nan_against_a_number_is_an_infinite_error_not_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampled NaN where the other trace has a number: "max abs inf", as in process."""
    monkeypatch.setitem(_PLANT, "by", float("nan"))
    paths = _planted_traces(tmp_path, (4, 4), 5)
    assert main(["diverge", *map(str, paths)]) == 1
    assert "max rel error inf (max abs inf), bound" in capsys.readouterr().out


def _two_traces(root: Path, body: object) -> list[Path]:
    """Two traces of ``body(variant)``: variant ``"a"``, then ``"b"``."""
    from pytest_backends.paths.trace import header, tracing

    paths = []
    for name in ("a", "b"):
        paths.append(root / name / "t" / "cfg.jsonl")
        with tracing(paths[-1], header("cfg", {}, "cpu", "t")):
            torch.manual_seed(0)
            body(name)  # type: ignore[operator]
    return paths


def _extra_op(variant: str) -> None:
    x = torch.randn(8, 16)
    h = x * 2.0
    if variant == "b":
        h = h * 1.01  # ONE-SIDED
    torch.tanh(h).sum(1)


def test_an_op_on_one_side_only_parts_the_paths_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every op after a one-sided op differs: never "agree", the one-sided op is named."""
    paths = _two_traces(tmp_path, _extra_op)
    line = next(
        i
        for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
        if text.endswith("# ONE-SIDED")
    )
    for pair in (paths, [tmp_path / "a", tmp_path / "b"]):
        assert main(["diverge", *map(str, pair)]) == 1
        out = capsys.readouterr().out
        assert "agree within bounds" not in out, out
        # the line, then the calls that led to it (this test's own frames, up to pytest)
        assert f"the paths part at aten::mul ({__file__}:{line} (called from " in out, out
        assert "on one side only" in out and "ran under" in out, out
        assert "aten::tanh" in out, out  # the downstream op that differs, not blamed


def _nan_on_one_side(variant: str) -> None:
    x = torch.tensor([1.0, float("nan"), float("inf"), -1.0] * 4)
    if variant == "b":
        x[3] = float("nan")
    torch.exp(x)


def _other_shape(variant: str) -> None:
    torch.randn(8 if variant == "a" else 9, 4).sum(0)


@pytest.mark.parametrize("body", [_nan_on_one_side, _other_shape], ids=["nan", "shape"])
def test_outputs_that_differ_from_inputs_that_differ_never_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: object
) -> None:
    paths = _two_traces(tmp_path, body)
    assert main(["diverge", *map(str, paths)]) == 1
    out = capsys.readouterr().out
    assert "agree within bounds" not in out and "the paths part" in out, out


def test_a_trace_in_one_directory_only_fails_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_backends.paths.trace import diverge

    paths = _two_traces(tmp_path, lambda v: torch.ones(3).sum())
    extra = tmp_path / "a" / "u" / "cfg.jsonl"
    extra.parent.mkdir()
    extra.write_text(paths[0].read_text())
    assert main(["diverge", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "u/cfg.jsonl: only in" in out and "not compared" in out, out
    assert diverge(tmp_path / "a", tmp_path / "b", allow_unpaired=True)[1] == 0
    args = ["diverge", "--allow-unpaired", str(tmp_path / "a"), str(tmp_path / "b")]
    assert main(args) == 0
    assert "u/cfg.jsonl: only in" in capsys.readouterr().out


def test_an_empty_trace_file_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert main(["diverge", str(empty), str(empty)]) == 2
    err = capsys.readouterr().err
    assert "empty file" in err and "list index" not in err, err


def _scalar(variant: str) -> None:
    x = torch.randn(8, 16)
    (x * (1.0 if variant == "a" else 1.001)).sum()


def test_a_blamed_op_says_its_non_tensor_arguments_are_not_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _two_traces(tmp_path, _scalar)
    assert main(["diverge", *map(str, paths)]) == 1
    out = capsys.readouterr().out
    assert "the paths part at aten::mul" in out, out
    assert "non-tensor arguments are not recorded in traces" in out, out


def _mask(variant: str) -> None:
    x = torch.arange(100)
    (x % 7 == (0 if variant == "a" else 1)).sum()


def test_a_bool_result_counts_the_elements_that_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _two_traces(tmp_path, _mask)
    assert main(["diverge", *map(str, paths)]) == 1
    out = capsys.readouterr().out
    assert "the paths part at aten::eq" in out and "elements differ" in out, out
    assert "inf" not in out.splitlines()[0], out


def _sdpa(variant: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(2, 4, 16, 32, dtype=torch.bfloat16) for _ in range(3))
    chosen = SDPBackend.MATH if variant == "a" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel([chosen]):
        torch.nn.functional.scaled_dot_product_attention(q, k, v)  # ONE CALL


def test_ops_torch_chose_for_one_call_are_named_on_both_sides_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _two_traces(tmp_path, _sdpa)
    assert main(["diverge", *map(str, paths)]) == 1
    out = capsys.readouterr().out
    assert "torch chose other ops for the same call" in out, out
    assert "_scaled_dot_product_flash_attention_for_cpu" in out, out
    assert "branches on a flag in Python" not in out, out
