"""Fixtures of the kernel tests."""
from __future__ import annotations

import subprocess

import pytest

from foscar.build import CSRC, DEFAULT_ARCH, NVCC_FLAGS, BuildError, find_nvcc


@pytest.fixture
def library_compile(tmp_path):
    """A function compiling CUDA source text (the kernels' headers on the include path, extra
    nvcc flags such as -D knobs) to PTX or a cubin as foscar.build builds the library (its flags,
    sm_90a) and returning the output's path; the test skips where nvcc is not installed."""
    try:
        nvcc = find_nvcc()
    except BuildError:
        pytest.skip("nvcc is not installed")

    def compile_to(source: str, *flags: str, output: str = "ptx"):
        src, out = tmp_path / "snippet.cu", tmp_path / f"snippet.{output}"
        src.write_text(source)
        build = subprocess.run([nvcc, *NVCC_FLAGS, f"-arch={DEFAULT_ARCH}", f"-I{CSRC}", *flags, f"-{output}", str(src),
                                "-o", str(out)], capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-3000:]
        return out

    return compile_to


@pytest.fixture
def library_ptx(library_compile):
    """library_compile's PTX, as text."""
    return lambda source: library_compile(source).read_text()
