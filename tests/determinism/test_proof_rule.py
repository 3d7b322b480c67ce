"""The proof rule, one input kind at a time, under both recorders, and the gates around it.

An op is blamed only when every input it received is proven equal between
runs. Each test here covers one input kind the rule must see (memory shared
outside torch, a generator another thread draws from, the flags in force) or
one gate that must not end green on a finding (xfail, a shared baseline file,
a blamed op in a loop). Every case runs in a real pytest session; the cases of
one recorder share a session to keep the suite cheap.
"""

from __future__ import annotations

import re

import pytest
from sessions import RECORDERS, checked_session, session, unchecked

from pytest_backends.determinism.record_native import native_module

_KINDS = """
import threading

import numpy as np
import pytest
import torch


def test_numpy_buffer_unseeded():
    buf = torch.zeros(4)
    view = buf.numpy()
    (buf + 1).sum()
    view[:] = np.random.default_rng().random(4)
    (buf * 2).sum()


def test_from_numpy_buffer_unseeded():
    arr = np.zeros(4, dtype=np.float32)
    buf = torch.from_numpy(arr)
    (buf + 1).sum()
    arr[:] = np.random.default_rng().random(4)
    (buf * 2).sum()


def test_numpy_buffer_seeded_is_checked():
    buf = torch.zeros(4)
    view = buf.numpy()
    (buf + 1).sum()
    view[:] = np.random.default_rng(0).random(4)
    (buf * 2).sum()


RUNS = [0]


def test_thread_draws_from_global_generator():
    # The augmenter draws as many numbers before each of the test's draws as the
    # run's number: the interleaving differs between runs on every scheduler.
    RUNS[0] += 1
    go, done = threading.Semaphore(0), threading.Semaphore(0)

    def augment():
        while go.acquire() and RUNS[0]:
            for _ in range(RUNS[0]):
                torch.rand(1)
            done.release()

    worker = threading.Thread(target=augment, name="augmenter", daemon=True)
    worker.start()
    try:
        for _ in range(20):
            go.release()
            done.acquire()
            torch.randn(8)
    finally:
        runs, RUNS[0] = RUNS[0], 0
        go.release()
        worker.join()
        RUNS[0] = runs


def test_mkldnn_disabled_after_conv():
    x = torch.randn(1, 3, 16, 16)
    w = torch.randn(4, 3, 3, 3)
    torch.nn.functional.conv2d(x, w).sum()
    torch.backends.mkldnn.enabled = False


def test_flush_denormal_after_denormals():
    x = torch.full((4,), 1e-40)
    (x * 1).sum()
    torch.set_flush_denormal(True)


def test_python_value_from_outside():
    import os

    torch.full((2,), float(int.from_bytes(os.urandom(4), "little"))).sum()


_RANGES = [0]


def test_profiler_ranges_differ_between_runs():
    _RANGES[0] += 1
    x = torch.ones(4)
    for _ in range(_RANGES[0]):
        with torch.autograd.profiler.record_function("x"):
            pass
    with torch.autograd.profiler.record_function("step"):
        (x * 2).sum()
"""


@pytest.mark.parametrize("recorder", RECORDERS)
def test_every_input_kind_is_covered(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each input kind: no op blamed; an input that differed is named, with its kind."""
    pytest.importorskip("numpy")
    planted_conftest.makepyfile(test_kinds=_KINDS)
    result, out, reasons = unchecked(planted_conftest, recorder, monkeypatch)
    assert "nondeterministic op" not in out, out
    assert "NONDETERMINISTIC" not in out, out
    result.assert_outcomes(passed=8)
    # Memory shared with NumPy: read at the op, and named with the line that read it.
    source = (planted_conftest.path / "test_kinds.py").read_text(encoding="utf-8").splitlines()
    reads = [n for n, line in enumerate(source, 1) if line.strip() == "(buf * 2).sum()"]
    for name, line in zip(("test_numpy_buffer_unseeded", "test_from_numpy_buffer_unseeded"), reads):
        assert "input 0 of aten::mul changed outside torch ops" in reasons.get(name, ""), out
        assert f"(NumPy, DLPack or another process?) at test_kinds.py:{line} " in reasons[name], (
            line,
            out,
        )
    assert "test_numpy_buffer_seeded_is_checked" not in reasons, out
    # The global generator drawn by another thread: not checked, the thread named.
    thread = reasons.get("test_thread_draws_from_global_generator", "")
    assert "'augmenter'" in thread and "aten::randn" in thread, out
    assert "generator" in thread, out
    # Flags changed after use: every run starts from the same flags, so checked.
    assert "test_mkldnn_disabled_after_conv" not in reasons, out
    assert "test_flush_denormal_after_denormals" not in reasons, out
    # A record_function range is no op: a different number of them per run changes nothing.
    assert "test_profiler_ranges_differ_between_runs" not in reasons, out
    # A Python value from outside torch: named as such.
    assert "a Python value passed to aten::full" in reasons.get(
        "test_python_value_from_outside", ""
    ), out


_GATES = """
import pytest
import torch


@pytest.mark.xfail(reason="a known bug elsewhere")
def test_finding_in_xfail():
    x = torch.ones(3)
    torch.ops.pbtest.noisy(x)


@pytest.mark.xfail(reason="a known bug elsewhere")
def test_expected_failure_stays_xfail():
    assert False


def test_blamed_in_loop():
    x = torch.ones(3)
    for _ in range(300):
        torch.ops.pbtest.noisy(x)
"""


def test_findings_fail_xfail_tests_and_loops_are_counted(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finding in an xfail test fails it; a blamed op in a loop is one line with its count."""
    planted_conftest.makepyfile(test_gates=_GATES)
    result = session(
        planted_conftest,
        "python",
        monkeypatch,
        "--backends-determinism-all",
        "--backends-census=census.json",
        "--junitxml=junit.xml",
    )
    out = result.stdout.str()
    result.assert_outcomes(failed=2, xfailed=1)
    assert "not the failure the marker expects" in out, out
    assert out.count("also:") <= 6, out
    assert re.search(r"and \d+ more call\(s\) like it", out), out
    size = (planted_conftest.path / "junit.xml").stat().st_size
    assert size < 40_000, size
    census = (planted_conftest.path / "census.json").read_text(encoding="utf-8")
    assert "test_finding_in_xfail" in census


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["serial", "xdist"])
def test_leak_in_xfail_test_fails(planted_conftest: pytest.Pytester, workers: list[str]) -> None:
    """A leak under --backends-leaks=fail fails an xfail test too (never one more xfailed)."""
    planted_conftest.makepyfile(
        test_leak="""
        import pytest
        import torch

        @pytest.mark.xfail(reason="a known bug elsewhere")
        def test_leaks():
            torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
            assert False

        @pytest.mark.xfail(reason="a known bug elsewhere")
        def test_xpass_leaks():
            torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark

        @pytest.mark.xfail(reason="a known bug elsewhere")
        def test_xfail_clean():
            assert False
        """
    )
    result = planted_conftest.runpytest_subprocess(*workers, "--backends-leaks=fail", "-rA")
    result.assert_outcomes(xfailed=2, xpassed=1, errors=2)
    errors = [line for line in result.outlines if line.startswith("ERROR ")]
    assert len(errors) == 2 and all("leak" in line for line in errors), result.outlines[-20:]


def test_same_file_for_both_baselines_is_refused(planted_conftest: pytest.Pytester) -> None:
    """One file for both baselines: a usage error naming both options, nothing written."""
    planted_conftest.makepyfile(test_a="def test_a():\n    pass\n")
    result = planted_conftest.runpytest_subprocess(
        "-p",
        "no:xdist",
        "--backends-baseline=b.json",
        "--backends-baseline-update",
        "--backends-batch-baseline=b.json",
        "--backends-batch-baseline-update",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--backends-baseline and --backends-batch-baseline*same file*"])
    assert not (planted_conftest.path / "b.json").exists()


def test_corpus_both_recorders_agree_with_the_oracle(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user corpus under both recorders: same verdicts, and blame only where the oracle does.

    The oracle (``oracle.py``) reruns every op alone on clones of its inputs, its
    generators put back: an op is nondeterministic only where two such tries differ.
    """
    from pathlib import Path

    if native_module() is None:
        pytest.skip("the native extension is not built here")
    pytest.importorskip("numpy")
    here = Path(__file__).parent
    planted_conftest.makepyfile(
        test_corpus=(here / "user_corpus.py").read_text(encoding="utf-8"),
        oracle=(here / "oracle.py").read_text(encoding="utf-8"),
    )
    monkeypatch.setenv("PLANT", "1")
    monkeypatch.setenv("ORACLE_OUT", str(planted_conftest.path / "oracle.json"))
    monkeypatch.setenv("PYTHONPATH", str(planted_conftest.path))
    planted_conftest.runpytest_subprocess("-p", "no:xdist", "-p", "oracle", "--backends-leaks=off")
    import json

    oracle = set(json.loads((planted_conftest.path / "oracle.json").read_text(encoding="utf-8")))
    monkeypatch.delenv("ORACLE_OUT")
    seen = {}
    expected_thread = {}
    for recorder in RECORDERS:
        thread_log = planted_conftest.path / f"thread-{recorder}.txt"
        monkeypatch.setenv("THREAD_LOG", str(thread_log))
        _, found, blamed_ops, blamed_in = checked_session(planted_conftest, recorder, monkeypatch)
        # "nondeterministic" only where rerunning the op alone gives different bits.
        assert blamed_ops <= oracle, (recorder, blamed_ops - oracle)
        seen[recorder] = (found, blamed_in)
        # The augmentation thread's draws interleave with the test's as the scheduler
        # lets them; the test logs, per run, how many of the thread's draws preceded
        # each of its own, which fixes the generator's state at each of its draws.
        # Every run saw a different interleaving: "not checked" (naming the thread);
        # the same interleaving in every run: checked (so the planted op is blamed).
        # Two runs alike and one different: a recorder that compares the two alike
        # proves the planted op's inputs equal and rightly blames it, so either holds.
        runs = thread_log.read_text(encoding="utf-8").splitlines()[:3]
        distinct = len(set(runs))
        expected_thread[recorder] = (
            "FAILED" if distinct == 1 else "not checked" if distinct == len(runs) else "either"
        )
    cases = len(seen["python"][0])
    thread = "test_corpus.py::test_augmentation_thread"
    # With two DataLoader workers the batches reach the main process in the order the
    # workers finish them, and it rebuilds each one it takes off the queue
    # (aten::empty, aten::set_), so where those ops fall among the test's own varies:
    # runs alike are compared (the planted op is blamed), runs not alike are "not
    # checked". Either is right, a pass never is; with one worker the order is fixed.
    workers = "test_corpus.py::test_dataloader[2]"
    racy = {thread, workers}
    disagreements = {
        k
        for k in seen["python"][0]
        if k not in racy and seen["python"][0][k] != seen["native"][0].get(k)
    }
    if expected_thread["python"] == expected_thread["native"] != "either":
        racy.discard(thread)
        if seen["python"][0].get(thread) != seen["native"][0].get(thread):
            disagreements.add(thread)
    false_verdicts = {r: seen[r][0].get(thread) for r in RECORDERS}
    false_verdicts = {
        r: v
        for r, v in false_verdicts.items()
        if v != expected_thread[r]
        and not (expected_thread[r] == "either" and v in ("FAILED", "not checked"))
    }
    false_verdicts.update(
        {
            f"{r} {workers}": v
            for r in RECORDERS
            if (v := seen[r][0].get(workers)) not in ("FAILED", "not checked")
        }
    )
    print(
        f"corpus: {cases} cases per recorder, oracle-nondeterministic ops {sorted(oracle)}, "
        f"blamed in {len(seen['python'][1])} tests, {len(disagreements)} disagreements, "
        f"thread: expected {expected_thread}, false {false_verdicts}, "
        f"verdicts: { {r: sorted(seen[r][0].items()) for r in RECORDERS} }"
    )
    assert cases >= 20
    assert not false_verdicts, (false_verdicts, expected_thread)
    assert not disagreements, {
        k: (seen["python"][0][k], seen["native"][0].get(k)) for k in disagreements
    }
    assert seen["python"][1] - racy == seen["native"][1] - racy
