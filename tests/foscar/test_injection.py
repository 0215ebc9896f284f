"""The kernels' mantissa injection, compiled from the CUDA header for the host with nvcc: every
position of both halves must read as fp16 1024 + f * code (K and V; docs/FORMAT.md),
and the kernels' schedule must be foscar/packing.py's, position by position."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from foscar import packing
from foscar.build import CSRC, BuildError, find_nvcc

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def injection_run(tmp_path_factory):
    try:
        nvcc = find_nvcc()
    except BuildError:
        pytest.skip("nvcc is not installed")
    exe = tmp_path_factory.mktemp("inject") / "inject_check"
    build = subprocess.run([nvcc, "-std=c++17", "-O1", f"-I{CSRC}", str(HERE / "data" / "inject_check.cu"),
                            "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)


def test_every_position_reads_as_bias_plus_factor_times_code(injection_run):
    assert injection_run.returncode == 0, injection_run.stdout[-3000:]
    assert "0 mismatches" in injection_run.stdout


def test_the_kernels_schedule_is_the_packing_schedule(injection_run):
    rows = [line.split()[1:] for line in injection_run.stdout.splitlines() if line.startswith("schedule")]
    assert len(rows) == 2 * (4 + 8)  # "schedule" lines
    for kind, bits, k, shift, mask, factor in rows:
        bits, k = int(bits), int(k)
        assert (int(shift), int(mask)) == packing.extraction_schedule(bits, kind)[k], (kind, bits, k)
        assert float(factor) == packing.radix_factors(bits, kind)[k]


def test_the_kernels_int8_k_read_is_the_packing_one(injection_run):
    """The int8 K operands (v24): the channel each k-column's Q~ is built for, and the shift and
    mask extract_k8 applies, are packing.k8_channels and packing.k8_schedule."""
    rows = [list(map(int, line.split()[1:])) for line in injection_run.stdout.splitlines() if line.startswith("k8 ")]
    assert len(rows) == 2 * 4 * 32
    for bits, ks, col, channel, shift, mask in rows:
        assert channel == packing.k8_channels(bits)[ks, col], (bits, ks, col)
        sched = packing.k8_schedule(bits)
        assert (shift, mask) == sched[(2 * ks + col // 16) % len(sched)], (bits, ks, col)


def test_the_p_conversions_keep_fp16_subnormals_under_fast_math(library_ptx):
    """P~ = p s is often below fp16's smallest normal: the kernels convert it with pack_f16x2,
    built like the library (--use_fast_math, sm_90a), whose PTX must be cvt.rn.f16x2.f32 and never
    a flushing .ftz form of an fp16 conversion."""
    text = library_ptx('#include "foscar_common.cuh"\n'
                       "__global__ void k(const float* x, unsigned* y) { y[0] = foscar::pack_f16x2(x[0], x[1]); }\n")
    assert "cvt.rn.f16x2.f32" in text
    assert "cvt.rn.ftz.f16" not in text and "cvt.ftz.rn.f16" not in text
