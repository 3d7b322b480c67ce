"""A session forked from the suite's zygote behaves as a new interpreter would."""

from __future__ import annotations

import json
import signal

import pytest
import zygote

PROBE = """
import json, os, sys
TORCH_BEFORE = "torch" in sys.modules
import numpy, torch

def test_probe():
    facts = {
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "pythonpath": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0],
        "argv0": os.path.basename(sys.argv[0]),
        "home": os.environ.get("HOME"),
        "probe": os.environ.get("PYTEST_BACKENDS_PROBE"),
        "threads": torch.get_num_threads(),
        "seed": torch.initial_seed(),
        "draw": torch.randn(3).tolist(),
        "cudnn": torch.backends.cudnn.enabled,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "numpy": float(numpy.random.rand()),
        "torch_before": TORCH_BEFORE,
    }
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump(facts, f)
"""


def _facts(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str
) -> dict[str, object]:
    out = pytester.path / f"{name}.json"
    monkeypatch.setenv("PYTEST_BACKENDS_PROBE", name)
    monkeypatch.setenv("PYTEST_PROBE_OUT", str(out))
    monkeypatch.setenv("PYTEST_BACKENDS_TESTS_FORK", "0" if name == "real" else "1")
    pytester.makepyfile(test_probe=PROBE.replace('"PROBE_OUT"', '"PYTEST_PROBE_OUT"'))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    facts: dict[str, object] = json.loads(out.read_text())
    return facts


def test_a_forked_session_sees_what_a_new_interpreter_sees(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _facts(pytester, monkeypatch, "real")
    forked = _facts(pytester, monkeypatch, "forked")
    again = _facts(pytester, monkeypatch, "forked")
    assert real.pop("torch_before") is False
    assert forked.pop("torch_before") is True, "the session was not a fork of the zygote"
    again.pop("torch_before")
    assert (real.pop("probe"), forked.pop("probe")) == ("real", "forked")
    for seeded_by_the_os in ("numpy", "seed", "draw"):
        real_value, forked_value = real.pop(seeded_by_the_os), forked.pop(seeded_by_the_os)
        assert forked_value != again.pop(seeded_by_the_os), f"forks share {seeded_by_the_os}"
        assert real_value != forked_value
    assert forked == real


def test_a_forked_session_reports_exit_codes_and_signals(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, signal
        def test_fails():
            assert False
        def test_dies():
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert pytester.runpytest_subprocess("-k", "fails").ret == pytest.ExitCode.TESTS_FAILED
    died = pytester.runpytest_subprocess("-k", "dies")
    assert died.ret == -signal.SIGKILL


def test_a_forked_session_times_out_and_the_next_one_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_slow="import time\ndef test_slow():\n    time.sleep(60)\n")
    with pytest.raises(pytester.TimeoutExpired):
        pytester.runpytest_subprocess("test_slow.py", timeout=3)
    pytester.makepyfile(test_quick="def test_quick():\n    pass\n")
    pytester.runpytest_subprocess("test_quick.py").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("change", "forkable"),
    [
        ({"HOME": "/elsewhere", "PYTEST_BACKENDS_X": "1", "PYTHONPATH": "/p"}, True),
        ({"PLANT": "1", "TORCHINDUCTOR_CACHE_DIR": "/c"}, True),
        ({"PYTHONHASHSEED": "0"}, False),
        ({"ATEN_CPU_CAPABILITY": "default"}, False),
        ({"OMP_NUM_THREADS": "1"}, False),
        ({"TMPDIR": "/elsewhere"}, False),
    ],
)
def test_only_variables_read_after_torch_import_may_differ(
    change: dict[str, str], forkable: bool
) -> None:
    base = {"HOME": "/home", "PATH": "/bin"}
    assert (not zygote.unforkable({**base, **change}, base)) is forkable


@pytest.mark.fresh_interpreter
def test_the_marker_starts_a_new_interpreter(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import sys\nBEFORE = 'torch' in sys.modules\ndef test_x():\n    assert not BEFORE\n"
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
