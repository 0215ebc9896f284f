"""The CUDA kernels' own source, run on the CPU: `foscar.emu.decode` takes CPU tensors.

foscar/csrc/foscar_emu.h gives the CUDA and Hopper features the kernels use (each CUDA thread a
fiber on the calling thread, warp collectives, wgmma in its fragment layouts with the H200's
accumulation, mbarriers, named barriers and the bulk copy engine with their real semantics) and
foscar_emu.cpp runs the persistent CTAs one after another, through the same dispatch as the GPU
library.
It is slow (seconds for a few hundred tokens) and checks indexing, folding and control flow,
not speed; the tests run it on every commit, with no GPU (tests/foscar/test_kernels_emu.py).

Building needs a host C++20 compiler (g++ or clang++, or $CXX) and the CUDA headers for the
bf16/fp16 types (found next to nvcc, or under $CUDA_HOME); the library is cached like
libfoscar.so, keyed by sources, flags and compiler.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Sequence

import torch

from foscar import kernels
from foscar.build import CSRC, BuildError, cache_dir, check_defines, hash_sources
from foscar.cache import QuantizedKVCache

SOURCE = "foscar_emu.cpp"
CXX_FLAGS = ("-std=c++20", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", "-pedantic-errors")
# -O1 by default; -O0 compiles in about 40 % of the time and runs several times slower, for builds
# that run a case or two (the tests' lab-knob builds).
OPT_LEVELS = (0, 1)
DEFAULT_NUM_SMS = 132  # the split plan of an H200, so the emulator runs the splits the GPU would


def find_cxx() -> str:
    for cand in (os.environ.get("CXX"), shutil.which("g++"), shutil.which("clang++"), shutil.which("c++")):
        if cand and Path(cand).exists():
            return cand
    raise BuildError("no host C++ compiler was found: install g++ or set CXX=/path/to/compiler.")


def find_cuda_include() -> Path:
    """A folder holding cuda_bf16.h: $CUDA_HOME/include, next to nvcc, or /usr/local/cuda."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    roots.append("/usr/local/cuda")
    for root in filter(None, roots):
        for inc in (Path(root) / "include", Path(root) / "targets" / "x86_64-linux" / "include"):
            if (inc / "cuda_bf16.h").exists():
                return inc
    raise BuildError("the CUDA headers (cuda_bf16.h) were not found: install the CUDA toolkit or set CUDA_HOME.")


def _flags(opt_level: int) -> tuple[str, ...]:
    if opt_level not in OPT_LEVELS or isinstance(opt_level, bool):
        raise ValueError(f"opt_level={opt_level!r} is not one the emulator builds with; expected 0 or 1.")
    return (*CXX_FLAGS, f"-O{opt_level}")


def _key(cxx: str, inc: Path, defines: Sequence[str], flags: Sequence[str]) -> str:
    h = hash_sources(hashlib.sha256(), (".cu", ".cuh", ".h", ".cpp"))
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    for part in (" ".join(flags), " ".join(defines), version, str(inc)):
        h.update(part.encode())
    return h.hexdigest()[:16]


def build(defines: Sequence[str] = (), force: bool = False, opt_level: int = 1) -> Path:
    """Compiles (or finds in the cache) libfoscar_emu.so with g++ -O`opt_level`; returns its path."""
    defines, flags = check_defines(defines), _flags(opt_level)
    cxx, inc = find_cxx(), find_cuda_include()
    out_dir = cache_dir() / f"emu-{_key(cxx, inc, defines, flags)}"
    so_path = out_dir / "libfoscar_emu.so"
    if so_path.exists() and not force:
        return so_path
    out_dir.mkdir(parents=True, exist_ok=True)
    # One compile per key at a time across processes (pytest's workers, a sweep's): the others
    # wait on the lock and find the library built. The library moves into place whole.
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so_path.exists() and not force:
            return so_path
        tmp = so_path.with_suffix(f".so.tmp{os.getpid()}.{threading.get_ident()}")
        cmd = [cxx, *flags, *defines, f"-I{inc}", f"-I{CSRC}", str(CSRC / SOURCE), "-o", str(tmp)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise BuildError(f"building the host emulation failed:\n{res.stderr[-6000:]}")
        os.replace(tmp, so_path)
    return so_path


_libs: dict[tuple[str, ...], ctypes.CDLL] = {}
_lock = threading.Lock()


def load(defines: Sequence[str] = (), opt_level: int = 1) -> ctypes.CDLL:
    key = (*defines, opt_level)
    with _lock:
        if key not in _libs:
            _libs[key] = kernels.bind(ctypes.CDLL(str(build(defines, opt_level=opt_level))), "foscar_emu")
        return _libs[key]


def decode(q: torch.Tensor, cache: QuantizedKVCache, *, sm_scale: float | None = None,
           out: torch.Tensor | None = None, variant: str = "fold", num_splits: int | None = None,
           num_sms: int = DEFAULT_NUM_SMS, defines: Sequence[str] = (),
           kv_heads_per_item: int | None = None, timeline: torch.Tensor | None = None,
           workspace: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
           second_instance: bool = True, opt_level: int = 1) -> torch.Tensor:
    """foscar.decode's kernels on the CPU: q and the cache are CPU tensors; same result layout.

    `num_sms` sets the GPU the split plan is made for; `defines` builds with kernel knobs, and
    `opt_level` with g++ -O0 or -O1 (the default);
    `timeline` (a CPU tensor, with -DFOSCAR_TIMELINE=1) as in foscar.kernels.decode, in host
    nanoseconds. `workspace`: (partials fp32, (m, l) fp32, counters int32 zeroed) to use instead
    of fresh ones, large enough for the launch, so that a test sees what a launch leaves in it
    for the next (the counters must be back at zero). The environment's FOSCAR_EMU_CONCURRENT_CTAS
    runs that many CTAs at once (foscar_emu.cpp). `second_instance` as in foscar.kernels.decode.
    """
    kernels._check_inputs(q, cache, out, variant, on_gpu=False)
    lib = load(defines, opt_level)
    out = torch.empty_like(q) if out is None else out
    keep = []

    def workspace_for(n_o, n_ml, n_count):
        if workspace is not None:
            if workspace[0].numel() < n_o or workspace[1].numel() < n_ml or workspace[2].numel() < n_count:
                raise ValueError(f"workspace holds {[t.numel() for t in workspace]} elements; this launch needs "
                                 f"{[n_o, n_ml, n_count]}: pass larger tensors")
            return workspace
        keep.extend([torch.empty(max(n_o, 1), dtype=torch.float32), torch.empty(max(n_ml, 1), dtype=torch.float32),
                     torch.zeros(max(n_count, 1), dtype=torch.int32)])
        return keep[-3], keep[-2], keep[-1]

    args = kernels.launch_args(q, cache, out, sm_scale=sm_scale, variant=variant, num_splits=num_splits,
                               num_sms=num_sms, ctas_per_sm=lib.foscar_emu_ctas_per_sm,
                               alt_ctas_per_sm=lib.foscar_emu_ctas_per_sm_alt, second_instance=second_instance,
                               max_kv_heads_per_item=lib.foscar_emu_kv_heads_per_item(q.shape[1], cache.num_kv_heads),
                               kv_heads_per_item=kv_heads_per_item,
                               workspace=workspace_for, timeline=timeline)
    if lib.foscar_emu_decode(ctypes.byref(args)) != 0:
        raise RuntimeError(f"foscar.emu.decode: {lib.foscar_emu_last_error().decode()}")
    if keep and keep[-1][: q.shape[0] * cache.num_kv_heads].any():  # the counters (the sense words follow)
        raise RuntimeError("foscar.emu.decode: the split-KV arrival counters were not left at zero")
    return out
