"""Build BitDecoding's extension (bit_decode_cuda) from its source tree, for sm_90 only, with
torch's JIT builder: nothing is installed and its setup.py is not run (it builds sm_80 too).

The source tree is github.com/DD-DuDa/BitDecoding with CUTLASS's include/ at its submodule's
commit in libs/cutlass/include (kept out of git, e.g. in .bitdecoding/). Its nvcc flags are
its setup.py's; the include path adds CUDA's include/cccl, where CUDA 13 keeps cub, thrust
and libcu++. Prints the two folders to put on PYTHONPATH (the built module, the Python
wrapper). GPU machine only:

    python scripts/bitdecoding_build.py --src .bitdecoding
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

SOURCES = (
    "csrc/bit_decode/decode_api.cpp",
    "csrc/bit_decode/src/genfile/flash_fwd_hdim128_fp16_sm80.cu",
    "csrc/bit_decode/src/genfile/flash_qpack_hdim128_fp16_sm80_2bit.cu",
    "csrc/bit_decode/src/genfile/flash_qpack_hdim128_fp16_sm80_4bit.cu",
    "csrc/bit_decode/src/genfile/flash_fwd_split_hdim128_fp16_sm80_2bit.cu",
    "csrc/bit_decode/src/genfile/flash_fwd_split_hdim128_fp16_sm80_4bit.cu",
)
NVCC_FLAGS = [  # BitDecoding's setup.py, minus its -gencode list (TORCH_CUDA_ARCH_LIST sets sm_90)
    "-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr",
    "--expt-extended-lambda", "--use_fast_math", "--threads", "4",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path(".bitdecoding"))
    ap.add_argument("--out", type=Path, help="build folder (default: SRC/build)")
    args = ap.parse_args()
    src = args.src.resolve()
    out = (args.out or src / "build").resolve()
    missing = [s for s in SOURCES if not (src / s).exists()]
    cutlass = src / "libs" / "cutlass" / "include"
    if missing or not (cutlass / "cute").is_dir():
        raise SystemExit(f"{src} is not a BitDecoding tree with CUTLASS's include/ in libs/cutlass "
                         f"(missing: {missing or [str(cutlass)]}).")
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("MAX_JOBS", str(min(8, os.cpu_count() or 1)))
    from torch.utils.cpp_extension import CUDA_HOME, load

    includes = [src / "csrc" / "bit_decode", src / "csrc" / "bit_decode" / "src", cutlass]
    cccl = Path(CUDA_HOME or "/usr/local/cuda") / "include" / "cccl"
    if cccl.is_dir():
        includes.append(cccl)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    load(name="bit_decode_cuda", sources=[str(src / s) for s in SOURCES], extra_cflags=["-O3", "-std=c++17"],
         extra_cuda_cflags=NVCC_FLAGS, extra_include_paths=[str(p) for p in includes],
         build_directory=str(out), verbose=False)
    print(f"built bit_decode_cuda in {time.time() - t0:.0f} s")
    print(f"PYTHONPATH={out}:{src}")


if __name__ == "__main__":
    main()
