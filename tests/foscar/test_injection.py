"""The kernels' mantissa injection, compiled from the CUDA header for the host with nvcc: every
position of both halves must read as 128 + f * code (the bf16 schedule of docs/FORMAT.md)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from foscar.build import BuildError, CSRC, find_nvcc

HERE = Path(__file__).resolve().parent


def test_every_position_reads_as_bias_plus_factor_times_code(tmp_path):
    try:
        nvcc = find_nvcc()
    except BuildError:
        pytest.skip("nvcc is not installed")
    exe = tmp_path / "inject_check"
    build = subprocess.run([nvcc, "-std=c++17", "-O1", f"-I{CSRC}", str(HERE / "data" / "inject_check.cu"),
                            "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "0 mismatches" in run.stdout
