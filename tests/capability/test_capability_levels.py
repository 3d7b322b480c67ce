"""CPU capability levels: table, hardware check, environment and verification (pure parts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_backends.capability import levels as capability
from pytest_backends.capability import runner

X86_FULL = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "sse42"})


def test_parse_cpuinfo_reads_x86_flags_and_arm_features() -> None:
    x86 = "processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16\nbogomips\t: 1\n"
    assert capability.parse_cpuinfo(x86) == {"fpu", "sse42", "avx2", "avx512f", "avx512bf16"}
    arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU part\t: 0xd40\n"
    assert capability.parse_cpuinfo(arm) == {"fp", "asimd", "sve", "bf16"}
    assert capability.parse_cpuinfo("processor : 0\n") == frozenset()


def test_fake_features_remove_and_add() -> None:
    edited = capability.apply_fake_features(X86_FULL, "-avx512f, +sve ,bf16,-AVX512_BW")
    assert "avx512f" not in edited and "avx512bw" not in edited
    assert {"sve", "bf16", "avx2"} <= edited


def test_unsupported_reason_names_the_missing_feature() -> None:
    features = X86_FULL - {"avx512bw"}
    reason = capability.unsupported_reason("avx512", arch="x86_64", features=features)
    assert reason is not None
    assert reason.startswith("cap-avx512: this CPU lacks avx512bw;")
    assert "ATEN_CPU_CAPABILITY=avx512 needs avx512f, avx512bw" in reason
    assert capability.unsupported_reason("avx2", arch="x86_64", features=features) is None
    assert capability.unsupported_reason("default", arch="s390x", features=frozenset()) is None


def test_unsupported_reason_names_another_architecture() -> None:
    reason = capability.unsupported_reason("sve256", arch="x86_64", features=X86_FULL)
    assert reason == "cap-sve256: sve256 is a CPU level of aarch64, this machine is x86_64"


def test_unsupported_reason_says_when_features_are_faked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(capability.FAKE_FEATURES_ENV, "-avx512f")
    reason = capability.unsupported_reason("avx512")
    assert reason is not None
    assert "lacks avx512f (PYTEST_BACKENDS_FAKE_CPU_FEATURES is set)" in reason


@pytest.mark.parametrize(
    ("arch", "features", "expected"),
    [
        ("x86_64", X86_FULL, ("default", "avx2", "avx512")),
        ("x86_64", X86_FULL - {"avx512vl"}, ("default", "avx2")),
        ("x86_64", frozenset({"sse42"}), ("default",)),
        ("aarch64", frozenset({"sve", "bf16", "svevl256"}), ("default", "sve256")),
        ("aarch64", frozenset({"sve", "bf16", "svevl128"}), ("default",)),
        ("ppc64le", frozenset(), ("default", "vsx")),
        ("s390x", frozenset({"vx", "vxe"}), ("default", "zvector")),
    ],
)
def test_supported_levels_per_machine(
    arch: str, features: frozenset[str], expected: tuple[str, ...]
) -> None:
    assert capability.supported_levels(arch=arch, features=features) == expected


def test_parse_levels_keeps_order_and_drops_duplicates() -> None:
    assert capability.parse_levels(" AVX2 ,default,avx2", "--x") == ("avx2", "default")


def test_parse_levels_all_is_what_this_cpu_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(capability.FAKE_FEATURES_ENV, "-avx2,-avx512f")
    assert capability.parse_levels("all", "--x") == ("default",)
    assert capability.parse_levels("all,avx512", "--x") == ("default", "avx512")


@pytest.mark.parametrize("value", ["avx9", "", " , "])
def test_parse_levels_rejects_bad_input(value: str) -> None:
    with pytest.raises(pytest.UsageError, match=r"--backends-cpu-capability: .*default, avx2"):
        capability.parse_levels(value, "--backends-cpu-capability")


def test_level_env_caps_onednn_and_mkl_on_x86() -> None:
    assert capability.level_env("default", arch="x86_64") == {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    }
    assert capability.level_env("avx2", arch="x86_64")["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    env = capability.level_env("avx512", arch="x86_64")
    assert (env["ONEDNN_MAX_CPU_ISA"], env["MKL_ENABLE_INSTRUCTIONS"]) == ("AVX512_CORE", "AVX512")


def test_level_env_elsewhere_sets_what_exists() -> None:
    assert capability.level_env("sve256", arch="aarch64") == {
        "ATEN_CPU_CAPABILITY": "sve256",
        "ONEDNN_MAX_CPU_ISA": "SVE_256",
    }
    assert capability.level_env("vsx", arch="ppc64le") == {"ATEN_CPU_CAPABILITY": "vsx"}
    with pytest.raises(ValueError, match="avx9"):
        capability.level_env("avx9")


def test_verify_level_compares_what_torch_reports() -> None:
    assert capability.verify_level("avx2", actual="AVX2") is None
    assert capability.verify_level("zvector", actual="Z VECTOR") is None
    message = capability.verify_level("avx2", actual="AVX512")
    assert message is not None
    assert "runs torch's AVX512 kernels, not AVX2" in message
    assert "none of this level's tests were run" in message


def test_child_env_sets_the_level_and_drops_xdist_identity() -> None:
    base = {"PATH": "/bin", "PYTEST_XDIST_WORKER": "gw0", "ATEN_CPU_CAPABILITY": "avx512"}
    env = runner.child_env("default", base)
    assert env["PATH"] == "/bin"
    assert env["ATEN_CPU_CAPABILITY"] == "default"
    assert "PYTEST_XDIST_WORKER" not in env


def test_describe_exit() -> None:
    assert runner.describe_exit(1) == "exit code 1"
    assert runner.describe_exit(-11) == "killed by signal SIGSEGV"


def test_tail_drops_the_session_header(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text(
        "==== test session starts ====\nplatform linux\nrootdir: /x\ncollected 3 items\n\n"
        "t.py::a PASSED\nt.py::b \n"
    )
    tail = runner._tail(log)
    assert "rootdir" not in tail
    assert tail.splitlines() == ["    t.py::a PASSED", "    t.py::b "]


def test_feed_reads_complete_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "avx2.events.jsonl"
    feed = runner.LevelFeed("avx2", path)
    assert feed.poll() is False
    events = [
        {"ev": "hello", "pid": 42},
        {"ev": "start", "nodeid": "t.py::a"},
        {"ev": "report", "nodeid": "t.py::a", "data": {"when": "call"}},
        {"ev": "finish", "nodeid": "t.py::a"},
        {"ev": "start", "nodeid": "t.py::b"},
        {"ev": "crash", "nodeid": "t.py::b", "message": "boom"},
        {"ev": "lost", "nodeids": ["t.py::a", "t.py::c"], "message": "not run"},
        {"ev": "end"},
    ]
    text = "".join(json.dumps(e) + "\n" for e in events)
    cut = text.index("t.py::b") + 3
    path.write_text(text[:cut])
    assert feed.poll() is True
    assert feed.child_pid == 42
    assert feed.record("t.py::a").done and feed.record("t.py::a").reports == [{"when": "call"}]
    assert not feed.record("t.py::b").started
    with path.open("a") as f:
        f.write(text[cut:])
    assert feed.poll() is True
    assert feed.record("t.py::b").crash == "boom" and feed.record("t.py::b").done
    assert feed.record("t.py::c").lost == "not run"
    assert feed.record("t.py::a").lost is None, "a finished item must keep its reports only"
    assert feed.ended


def test_child_args_replace_paths_and_override_outputs(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_a="def test_a(): pass")
    config = pytester.parseconfig(
        "-p",
        "no:randomly",
        "-x",
        "--backends-report=r.json",
        "-k",
        "a",
        "test_a.py",
        "-W",
        "error",
        "--backends-matrix",
    )
    args = runner.child_args(
        config, ["test_a.py::test_a[cap-avx2]"], tmp_path / "spec.json", None, tmp_path / "c"
    )
    assert "test_a.py" not in args
    # The file comes first, so the bare --backends-matrix cannot take it as its value.
    assert args[:10] == [
        str(pytester.path / "test_a.py"),
        "-p",
        "no:randomly",
        "-x",
        "--backends-report=r.json",
        "-k",
        "a",
        "-W",
        "error",
        "--backends-matrix",
    ]
    tail = args[10:]
    assert f"{runner.CHILD_OPTION}={tmp_path / 'spec.json'}" in tail
    assert "--maxfail=0" in tail and "--junit-xml=" in tail and "--backends-report=" in tail
    assert tail[tail.index("-n") + 1] == "0"


def test_widen_matrix_turns_on_only_the_capability_axis(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("--backends-cpu-capability=default")
    assert runner.widen_matrix(config, False, None) == (True, ("cpu_capability",))
    assert runner.widen_matrix(config, True, ("mkldnn",)) == (True, ("mkldnn", "cpu_capability"))
    assert runner.widen_matrix(config, True, None) == (True, None)
    plain = pytester.parseconfig()
    assert runner.widen_matrix(plain, False, None) == (False, None)


def test_ini_twins_and_command_line_precedence(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nbackends_cpu_capability = avx2, default\nbackends_cpu_capability_jobs = 2\n"
    )
    settings = runner.resolve_settings(pytester.parseconfig())
    assert (settings.levels, settings.jobs) == (("avx2", "default"), 2)
    cli = pytester.parseconfig(
        "--backends-cpu-capability=default", "--backends-cpu-capability-jobs=3"
    )
    settings = runner.resolve_settings(cli)
    assert (settings.levels, settings.jobs) == (("default",), 3)


@pytest.mark.parametrize("value", ["0", "-1", "two", ""])
def test_parse_jobs_rejects_non_positive(value: str) -> None:
    with pytest.raises(pytest.UsageError, match="--backends-cpu-capability-jobs: expected a"):
        runner.parse_jobs(value, "--backends-cpu-capability-jobs")


def test_modules_do_not_import_torch() -> None:
    code = (
        "import sys, pytest_backends.capability.levels, pytest_backends.capability.runner;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_tail_keeps_the_start_of_a_fatal_error(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    frames = "".join(f'  File "x.py", line {i} in f{i}\n' for i in range(40))
    log.write_text(f"collected 1 item\nt.py::a Fatal Python error: Segmentation fault\n{frames}")
    tail = runner._tail(log).splitlines()
    assert tail[0] == "    Fatal Python error: Segmentation fault"
    assert tail[1].endswith("in f0") and tail[-1] == "    ..."
