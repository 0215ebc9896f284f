"""The kernels' mantissa injection, compiled from the CUDA header for the host with nvcc: every
position of both halves must read as bias + f * code (bf16 and both fp16 schedules, docs/FORMAT.md)."""
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
    for schedule in ("-DFOSCAR_KF16_HIGH=0", "-DFOSCAR_KF16_HIGH=1"):  # both fp16 schedules
        exe = tmp_path / f"inject_check{schedule[-1]}"
        build = subprocess.run([nvcc, "-std=c++17", "-O1", schedule, f"-I{CSRC}",
                                str(HERE / "data" / "inject_check.cu"), "-o", str(exe)],
                               capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-3000:]
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, schedule + "\n" + run.stdout[-3000:]
        assert "0 mismatches" in run.stdout, schedule
