"""Compile-check the CUDA kernel with nvcc on a machine without a GPU.

Opt-in (``PYTEST_BACKENDS_NVCC_CHECK=1``): one nvcc compile of the torch
headers takes about half a minute. A CPU build of torch ships the CUDA headers
but not the generated ``c10/cuda/impl/cuda_cmake_macros.h``; a one-line stand-in
is written for the check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from pytest_backends import _native

NVCC = shutil.which("nvcc") or (
    str(Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc") if cpp_extension.CUDA_HOME else None
)


@pytest.mark.skipif(NVCC is None or not Path(NVCC).exists(), reason="nvcc not found")
@pytest.mark.skipif(
    os.environ.get("PYTEST_BACKENDS_NVCC_CHECK") != "1",
    reason="set PYTEST_BACKENDS_NVCC_CHECK=1 to compile-check the CUDA source (~30 s)",
)
def test_cuda_kernel_compiles_with_nvcc(tmp_path: Path) -> None:
    assert NVCC is not None
    includes = [*cpp_extension.include_paths(), str(_native.source_dir())]
    macros = Path(includes[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not macros.exists():
        stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
        stub.mkdir(parents=True)
        (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
        includes.insert(0, str(tmp_path / "stub"))
    sources = sorted((_native.source_dir() / "cuda").glob("*.cu"))
    assert sources
    for source in sources:
        cmd = [
            NVCC, "-c", "-std=c++20", "-O1", "-arch=sm_90",
            *(f"-I{p}" for p in includes),
            f"-I{sysconfig.get_paths()['include']}",
            str(source), "-o", str(tmp_path / f"{source.stem}.o"),
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        assert (tmp_path / f"{source.stem}.o").stat().st_size > 0
