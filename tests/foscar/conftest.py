"""Fixtures of the kernel tests."""
from __future__ import annotations

import subprocess

import pytest

from foscar.build import CSRC, DEFAULT_ARCH, NVCC_FLAGS, BuildError, find_nvcc


@pytest.fixture
def library_ptx(tmp_path):
    """A function compiling CUDA source text (the kernels' headers on the include path) to PTX
    as foscar.build builds the library (its flags, sm_90a) and returning the PTX; the test skips
    where nvcc is not installed."""
    try:
        nvcc = find_nvcc()
    except BuildError:
        pytest.skip("nvcc is not installed")

    def compile_ptx(source: str) -> str:
        src, ptx = tmp_path / "snippet.cu", tmp_path / "snippet.ptx"
        src.write_text(source)
        build = subprocess.run([nvcc, *NVCC_FLAGS, f"-arch={DEFAULT_ARCH}", f"-I{CSRC}", "-ptx", str(src), "-o", str(ptx)],
                               capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-3000:]
        return ptx.read_text()

    return compile_ptx
