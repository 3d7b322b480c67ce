"""CPU capability levels: table, hardware check, environment and verification (pure parts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_backends import _process
from pytest_backends.capability import feature as levels_plugin
from pytest_backends.capability import levels as capability
from pytest_backends.capability import notes
from pytest_backends.capability import plan as planning

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


def test_unsupported_reason_names_the_missing_feature(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(capability.FAKE_FEATURES_ENV, raising=False)
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


@pytest.mark.skipif(capability.machine_arch() != "x86_64", reason="avx512 is an x86_64 level")
def test_unsupported_reason_says_when_features_are_faked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(capability.FAKE_FEATURES_ENV, "-avx512f")
    # what this CPU lacks once avx512f is faked away: avx512f alone on an AVX-512 CPU,
    # every avx512 feature on an AVX2-only one
    have = capability.cpu_features()
    missing = [f for f in capability.LEVELS["avx512"].requires if f not in have]
    assert "avx512f" in missing
    reason = capability.unsupported_reason("avx512")
    assert reason is not None
    assert f"lacks {', '.join(missing)} (PYTEST_BACKENDS_FAKE_CPU_FEATURES is set)" in reason


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
    # the top x86 level runs oneDNN and MKL at this CPU's own ISA (AMX, BF16, VNNI)
    assert capability.level_env("avx512", arch="x86_64") == {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "ALL",
    }


# /proc/cpuinfo flags of the project's two CPU machines (canonical names)
_AMD_EPYC = frozenset(
    [
        "avx2",
        "fma",
        "avx512f",
        "avx512dq",
        "avx512cd",
        "avx512bw",
        "avx512vl",
        "avx512bf16",
        "avx512vnni",
    ]
)
_XEON_AMX = _AMD_EPYC | {"amxtile", "amxbf16", "amxint8", "avx512fp16"}


@pytest.mark.parametrize(
    ("features", "isa"),
    [
        (_XEON_AMX, "AVX10_1_512_AMX"),
        (_XEON_AMX | {"amxfp16"}, "AVX10_1_512_AMX_FP16"),
        (_AMD_EPYC, "AVX512_CORE_BF16"),
        (_AMD_EPYC - {"avx512bf16"}, "AVX512_CORE_VNNI"),
        (_AMD_EPYC - {"avx512bf16", "avx512vnni"}, "AVX512_CORE"),
        (frozenset({"avx2", "fma"}), "AVX2"),
        (frozenset(), "SSE41"),
    ],
    ids=["xeon-amx", "amx-fp16", "epyc-bf16", "vnni", "avx512-core", "avx2", "none"],
)
def test_the_header_names_the_onednn_isa_each_level_runs(
    features: frozenset[str], isa: str
) -> None:
    assert capability.native_onednn_isa(features) == isa
    of = capability.onednn_isa_of
    assert of("avx512", arch="x86_64", features=features) == f"{isa} (this CPU's own)"
    assert of("avx2", arch="x86_64", features=features) == "AVX2"
    assert of("default", arch="x86_64", features=features) == "SSE41"
    assert of("vsx", arch="ppc64le", features=features) is None


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


def test_level_spec_sets_the_level_the_library_caps_and_an_inductor_cache() -> None:
    spec = planning.level_spec("avx2", {"TORCHINDUCTOR_CACHE_DIR": "/cache"})
    parts = spec.split("//")
    assert parts[0] == "popen"
    env = dict(part.removeprefix("env:").split("=", 1) for part in parts[1:])
    assert env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/cache/cap-avx2"
    for name, value in capability.level_env("avx2").items():
        assert env[name] == value


def test_each_level_gets_its_own_inductor_cache() -> None:
    dirs = {planning.inductor_cache_dir(lv, {}) for lv in ("default", "avx2", "avx512")}
    assert len(dirs) == 3
    assert all("torchinductor_" in d for d in dirs)
    assert planning.inductor_cache_dir("default", {"TORCHINDUCTOR_CACHE_DIR": "/c/"}) == (
        "/c/cap-default"
    )


def test_a_spec_cannot_carry_a_double_slash() -> None:
    with pytest.raises(pytest.UsageError, match="contains '//'"):
        planning.level_spec("default", {"TORCHINDUCTOR_CACHE_DIR": "//server/share"})


def test_plan_starts_n_workers_per_runnable_level() -> None:
    plan = planning.plan_workers(
        ("default", "avx2", "avx512"), 2, {"default": None, "avx2": None, "avx512": "no avx512f"}
    )
    assert plan.runnable == ("default", "avx2")
    assert plan.unsupported == {"avx512": "no avx512f"}
    assert len(plan.specs) == 4
    assert [s.split("//")[1] for s in plan.specs] == [
        "env:ATEN_CPU_CAPABILITY=default",
        "env:ATEN_CPU_CAPABILITY=default",
        "env:ATEN_CPU_CAPABILITY=avx2",
        "env:ATEN_CPU_CAPABILITY=avx2",
    ]
    assert plan.worker_levels == ("default", "avx2")


def test_plan_without_a_runnable_level_starts_one_plain_worker() -> None:
    plan = planning.plan_workers(("avx512",), 3, {"avx512": "no avx512f"})
    assert plan.specs == ("popen",)
    assert plan.worker_levels == (None,)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("default, avx2", ("default", "avx2")),
        ("off", None),
        ("none", None),
        ("", None),
        ("NO", None),
    ],
)
def test_parse_settings_accepts_levels_and_the_off_words(
    value: str, expected: tuple[str, ...] | None
) -> None:
    assert levels_plugin.parse_settings(value, "--x").levels == expected


def test_levels_require_only_the_capability_axis() -> None:
    assert levels_plugin.parse_settings("default", "--x").required_axes == ("cpu_capability",)
    assert levels_plugin.parse_settings("off", "--x").required_axes == ()


def test_ini_twin_and_command_line_precedence(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nbackends_cpu_capability = avx2, default\n")
    settings = levels_plugin.Settings.from_config(pytester.parseconfig())
    assert settings.levels == ("avx2", "default")
    cli = pytester.parseconfig("--backends-cpu-capability=default")
    assert levels_plugin.Settings.from_config(cli).levels == ("default",)
    off = pytester.parseconfig("--backends-cpu-capability=off")
    assert levels_plugin.Settings.from_config(off).levels is None


def test_describe_exit_reads_wait_statuses() -> None:
    assert _process.describe_exit(1 << 8) == "exit code 1"
    assert _process.describe_exit(11) == "killed by signal SIGSEGV"
    assert _process.describe_exit(11 | 0x80) == "killed by signal SIGSEGV"
    assert _process.describe_exit(0) == "exit code 0"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_exit_status_of_a_dead_child_is_read_without_reaping_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import os; os._exit(3)"])
    try:
        status = _process.exit_status(child.pid, wait_s=10)
        assert status is not None and _process.describe_exit(status) == "exit code 3"
    finally:
        assert child.wait() == 3, "the child was reaped by someone else"
    assert _process.exit_status(child.pid, wait_s=0) is None


def test_fault_tail_keeps_the_start_of_a_fatal_error() -> None:
    frames = "".join(f'  File "x.py", line {i} in f{i}\n' for i in range(40))
    text = f"noise\nFatal Python error: Segmentation fault\n\n{frames}"
    tail = notes.fault_tail(text).splitlines()
    assert tail[0] == "    Fatal Python error: Segmentation fault"
    assert tail[1].endswith("in f0") and tail[-1] == "    ..."
    assert notes.fault_tail("") == ""


def test_modules_do_not_import_torch() -> None:
    code = (
        "import sys, pytest_backends.capability.levels, pytest_backends.capability.feature,"
        "pytest_backends.capability.scheduler;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--pdb",), "--pdb cannot debug a test that runs in a CPU capability level's worker"),
        (("--tx", "popen"), "use -n N (N workers for each level) instead of --tx"),
    ],
)
def test_options_that_cannot_work_with_level_workers_are_usage_errors(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest_inprocess("--backends-cpu-capability=default", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_levels_the_option_does_not_name_get_one_worker_each() -> None:
    plan = planning.plan_workers(
        ("avx2",), 3, {"avx2": None}, supported=("default", "avx2", "avx512")
    )
    assert plan.marker_only == ("default", "avx512")
    assert plan.worker_levels == ("avx2", "default", "avx512")
    levels_of = [spec.split("ATEN_CPU_CAPABILITY=")[1].split("//")[0] for spec in plan.specs]
    assert levels_of == ["avx2", "avx2", "avx2", "default", "avx512"]
    # With no runnable level, a plain worker reports the skips, and a marker still keeps
    # the levels this CPU can run.
    plan = planning.plan_workers(("avx512",), 1, {"avx512": "no"}, supported=("default",))
    assert plan.marker_only == ("default",) and plan.worker_levels == (None, "default")
    assert plan.specs[0] == "popen"


def test_a_marker_keeps_its_levels_when_the_option_names_none_this_cpu_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marked test's runnable level runs in a worker of its own, not skipped."""
    monkeypatch.setenv("PYTEST_BACKENDS_FAKE_CPU_FEATURES", "-avx512f")
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.backends(cpu_capability=["default"])
        def test_level():
            assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-rs", "--backends-cpu-capability=avx512"
    )
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*cap-avx512 cannot run on this machine*"])


def test_the_plan_turns_n_into_workers_per_level(pytester: pytest.Pytester) -> None:
    from pytest_backends import plugin as registrar

    config = pytester.parseconfig("--backends-cpu-capability=default,avx512,sve256", "-n", "2")
    config.option.numprocesses = 2
    registrar.resolve(config)
    planning.plan_distribution(config, ("default", "avx512", "sve256"))
    worker_plan = config.stash[planning.WORKER_PLAN_KEY]
    assert "sve256" in worker_plan.unsupported and "sve256" not in worker_plan.runnable
    # Levels the option does not name get one worker each, for the markers naming them.
    marker_only = [lv for lv in capability.supported_levels() if lv not in worker_plan.levels]
    assert worker_plan.marker_only == tuple(marker_only)
    assert len(config.option.tx) == 2 * len(worker_plan.runnable) + len(marker_only)
    assert all(spec.startswith("popen//env:ATEN_CPU_CAPABILITY=") for spec in config.option.tx)
    assert config.option.dist != "no"
    assert config.option.maxworkerrestart == str(4 * len(config.option.tx))


def test_a_testcase_method_marked_with_other_axes_is_warned_as_running_once(
    pytester: pytest.Pytester,
) -> None:
    """The level axis never reaches a TestCase method; a marker of other axes changes nothing."""
    pytester.makepyfile(
        """
        import unittest

        import pytest
        import torch

        class TestConv(unittest.TestCase):
            @pytest.mark.backends("mkldnn")
            def test_marked(self):
                torch.nn.Conv2d(3, 4, 3)(torch.randn(1, 3, 8, 8))

            @pytest.mark.backends(cpu_capability=["default"])
            def test_names_its_level(self):
                assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-v", "--backends-cpu-capability=default"
    )
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*PASSED*test_names_its_level?cap-default?*",
            "*CapabilityWarning: test_*.py::TestConv::test_marked runs once, at CPU capability "
            "level default*it is a unittest.TestCase method*name the levels in its marker, "
            "@pytest.mark.backends(cpu_capability=?'default'?)*",
        ],
        consecutive=False,
    )
