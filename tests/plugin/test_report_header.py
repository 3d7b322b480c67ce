"""The report header tells what this torch and machine can run, as torch itself reports it.

Each run is a real pytest subprocess whose conftest asks torch directly
(``torch.backends.mkl.is_available()``, ``torch.backends.cpu.get_cpu_capability()``,
...) and writes the answers to ``truth.json``; the header and the skip reasons
of that same process must agree with them.
"""

from __future__ import annotations

import json
import re

import pytest

# Imported before any pytester snapshot: importing torch twice in one process corrupts it.
import torch

pytest_plugins = ["pytester"]

TRUTH_CONFTEST = """
import json
import platform

import torch
import torch.backends.opt_einsum

def _yes(module):
    return bool(module.is_available())

cuda = torch.cuda.is_available()
cudnn = cuda and _yes(torch.backends.cudnn)
truth = {
    "version": torch.__version__,
    "cuda": cuda,
    "cuda_built": torch.version.cuda or getattr(torch.version, "hip", None),
    "cudnn": cudnn,
    "cudnn_version": torch.backends.cudnn.version() if cudnn else None,
    "cuSPARSELt": _yes(torch.backends.cusparselt),
    "mps": _yes(torch.backends.mps),
    "mps_built": bool(torch.backends.mps.is_built()),
    "MKL": _yes(torch.backends.mkl),
    "MKL-DNN": _yes(torch.backends.mkldnn),
    "NNPACK": _yes(torch.backends.nnpack),
    "OpenMP": _yes(torch.backends.openmp),
    "opt_einsum": _yes(torch.backends.opt_einsum),
    "capability": torch.backends.cpu.get_cpu_capability(),
    "machine": platform.machine(),
}
with open("truth.json", "w") as f:
    json.dump(truth, f)
"""

MARKED_TESTS = """
import pytest

@pytest.mark.backends(device=["cpu", "cuda", "mps"])
def test_device(backend_device):
    assert backend_device.type in ("cpu", "cuda", "mps")

@pytest.mark.backends(cudnn="on")
def test_cudnn(backend_config):
    assert backend_config.id == "cudnn-on"

def test_plain():
    pass
"""


def _header(result: pytest.RunResult) -> dict[str, str]:
    """``{name: value}`` of the two availability lines (the torch version under ``torch``)."""
    lines = [line for line in result.outlines if line.startswith("backends: ")]
    gpu = next(line for line in lines if line.startswith("backends: torch "))
    cpu = next(line for line in lines if line.startswith("backends: CPU capability: "))
    fields: dict[str, str] = {}
    for part in (gpu + "; " + cpu).replace("backends: ", "").split("; "):
        name, sep, value = part.partition(": ")
        if sep:
            fields[name] = value
        else:
            fields["torch"] = part.removeprefix("torch ")
    return fields


def _skip_reasons(result: pytest.RunResult) -> dict[str, str]:
    """Config id -> skip reason, from the ``-rs`` short summary."""
    reasons: dict[str, str] = {}
    for line in result.outlines:
        m = re.match(r"SKIPPED \[\d+\] \S+:\d+: (\S+) (.*)$", line)
        if m:
            reasons[m.group(1)] = f"{m.group(1)} {m.group(2)}"
    return reasons


def _expected_cuda_reason(truth: dict[str, object]) -> str:
    version = truth["version"]
    if truth["cuda_built"]:
        build = f"torch {version} was built for CUDA {truth['cuda_built']} but sees no GPU"
    else:
        build = f"torch {version} is a CPU-only build"
    return f"needs CUDA: torch.cuda.is_available() is False ({build})"


@pytest.mark.parametrize("level", [None, "default"], ids=["detected-level", "ATEN-default"])
def test_header_and_skips_match_what_torch_reports(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, level: str | None
) -> None:
    if level is None:
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", level)
    pytester.makeconftest(TRUTH_CONFTEST)
    pytester.makepyfile(test_marked=MARKED_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--backends-matrix", "-rs")
    truth = json.loads((pytester.path / "truth.json").read_text())
    header = _header(result)

    assert header["torch"] == truth["version"] == torch.__version__
    cuda = header["CUDA"]
    assert cuda.startswith("yes" if truth["cuda"] else "no"), cuda
    if truth["cuda_built"]:
        assert f"CUDA {truth['cuda_built']}" in cuda
    else:
        assert "CPU-only build" in cuda
    assert header["cuDNN"].split()[0] == ("yes" if truth["cudnn"] else "no")
    if truth["cudnn"]:
        assert str(truth["cudnn_version"]) in header["cuDNN"]
    assert header["MPS"].split()[0] == ("yes" if truth["mps"] else "no")
    if not truth["mps_built"]:
        assert header["MPS"] == "no (not built)"
    for name in ("cuSPARSELt", "MKL", "MKL-DNN", "NNPACK", "OpenMP", "opt_einsum"):
        assert header[name] == ("yes" if truth[name] else "no"), name
    # the level this process runs: torch's own answer (also under ATEN_CPU_CAPABILITY)
    capability = str(truth["capability"]).replace(" ", "").upper()
    if level is not None:
        assert capability == level.upper()
    assert header["CPU capability"] == f"{capability} ({truth['machine']})"

    # availability drives the skips, each naming the backend and why
    reasons = _skip_reasons(result)
    expected_skips = {"device-cuda", "cudnn-on"} if not truth["cuda"] else set()
    if truth["cuda"] and not truth["cudnn"]:
        expected_skips.add("cudnn-on")
    if not truth["mps"]:
        expected_skips.add("device-mps")
    assert set(reasons) == expected_skips, result.stdout.str()[-2000:]
    if not truth["cuda"]:
        for config in ("device-cuda", "cudnn-on"):
            assert reasons[config] == f"{config} {_expected_cuda_reason(truth)}"
    if not truth["mps"]:
        assert reasons["device-mps"].startswith(
            "device-mps needs MPS: torch.backends.mps.is_available() is False ("
        )
        if not truth["mps_built"]:
            assert reasons["device-mps"].endswith(
                f"(torch {truth['version']} was built without MPS)"
            )
    result.assert_outcomes(passed=5 - len(expected_skips), skipped=len(expected_skips))


NO_TORCH_CONFTEST = """
import sys

# The flag API names can be bound without importing torch.
from pytest_backends import diff_flags, flag_names, override_flags, restore_flags, snapshot_flags

with open("torch_at_conftest.txt", "w") as f:
    f.write(str("torch" in sys.modules))
"""

LAZY_TESTS = """
import sys

import pytest

@pytest.mark.backends("mkldnn")
def test_marked(backend_config):
    assert backend_config.id == "default"
    assert "torch" in sys.modules  # the plugin probed torch after collection
"""


@pytest.mark.fresh_interpreter
def test_header_is_deferred_until_a_marked_test_is_collected(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(NO_TORCH_CONFTEST)
    pytester.makepyfile(test_lazy=LAZY_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1)
    # the plugin and the flag API loaded, the conftest ran: torch was still not imported
    assert (pytester.path / "torch_at_conftest.txt").read_text() == "False"
    lines = result.outlines
    hint = next(i for i, line in enumerate(lines) if "availability not probed" in line)
    collected = next(i for i, line in enumerate(lines) if line.startswith("collected "))
    probed = next(i for i, line in enumerate(lines) if line.startswith("backends: torch "))
    assert hint < collected < probed
    assert lines[hint] == (
        "backends: availability not probed (torch is not imported yet); it is shown with "
        "--backends-matrix or when a collected test carries @pytest.mark.backends"
    )
    assert _header(result)["torch"] == torch.__version__
    assert sum(line.startswith("backends: torch ") for line in lines) == 1


def test_quiet_drops_the_lines_but_not_the_skips(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TRUTH_CONFTEST)
    pytester.makepyfile(test_marked=MARKED_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--backends-matrix", "-rs", "-q")
    truth = json.loads((pytester.path / "truth.json").read_text())
    assert not [line for line in result.outlines if line.startswith("backends: ")]
    if not truth["cuda"]:
        reasons = _skip_reasons(result)
        assert reasons["device-cuda"] == f"device-cuda {_expected_cuda_reason(truth)}"
    assert result.ret == pytest.ExitCode.OK


def test_disabled_plugin_prints_nothing_and_guards_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_off="""
        import torch

        def test_leak():
            torch.backends.cudnn.benchmark = True

        def test_sees_the_leak():
            assert torch.backends.cudnn.benchmark is True

        def test_no_fixture(request):
            import pytest
            with pytest.raises(pytest.FixtureLookupError):
                request.getfixturevalue("backend_flags")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:backends")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "backends: " not in out
    assert "left torch backend flags changed" not in out
    plugins = next(line for line in result.outlines if line.startswith("plugins:"))
    assert "backends-" not in plugins
