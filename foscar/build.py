"""Builds the FOSCAR CUDA kernels with nvcc into a shared library, cached by a content hash.

The key hashes the sources, the flags, the target architecture and the nvcc version, so a
changed header or flag rebuilds and nothing else does (FlashInfer's JIT cache works alike).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

CSRC = Path(__file__).resolve().parent / "csrc"
TRANSLATION_UNITS = ("foscar_api.cu", "foscar_int4.cu", "foscar_int2.cu")
# Hidden visibility: only the C API is exported, so two builds loaded in one process (the
# kernel lab's variants) cannot bind each other's template statics (GCC makes those
# process-wide "unique" symbols otherwise, and a variant then skipped its own setup).
NVCC_FLAGS = ("-std=c++17", "-O3", "--use_fast_math", "-Xptxas", "-v", "-Xcompiler", "-fPIC",
              "-Xcompiler", "-fvisibility=hidden")
DEFAULT_ARCH = "sm_90a"

# What one trip of each decode kernel's main loop consumes, per consumer thread and KV head of
# the item: a chunk of 64 tokens x 128 channels of K and of V, shared by the 128 threads of the
# consumer warpgroup (a paired kernel's trip takes the chunk of both its heads). The
# instruction analysis divides its loop counts by this.
KV_ELEMS_PER_LOOP_ITER_PER_THREAD = 64 * 128 * 2 // 128


class BuildError(RuntimeError):
    """nvcc failed or is missing; the message carries its output."""


@dataclass
class KernelResources:
    name: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass
class BuildResult:
    so_path: Path
    objects: list[Path]
    arch: str
    key: str
    cached: bool
    resources: list[KernelResources] = field(default_factory=list)

    @property
    def cubin(self) -> Path:
        """The shared library holds the sm_90a SASS; cuobjdump reads it directly."""
        return self.so_path

    def _entry(self, name: str, nargs: int):
        """An int-returning C entry point of the built library (loading it needs no GPU), or
        None when it cannot be loaded here."""
        import ctypes

        try:
            fn = getattr(ctypes.CDLL(str(self.so_path)), name)
        except (OSError, AttributeError):
            return None
        fn.argtypes = [ctypes.c_int] * nargs
        fn.restype = ctypes.c_int
        return fn

    def kv_heads_per_item(self, num_q_heads: int, num_kv_heads: int) -> int | None:
        """The library's foscar_kv_heads_per_item (the most KV heads an item of this build can
        hold for the head layout), or None when the library cannot be loaded here."""
        query = self._entry("foscar_kv_heads_per_item", 2)
        return None if query is None else query(num_q_heads, num_kv_heads)

    def smem_bytes(self) -> dict[str, int]:
        """Dynamic shared memory per CTA of each decode kernel, asked of the built library
        (loading it needs no GPU); {} when it cannot be loaded here."""
        query = self._entry("foscar_decode_smem_bytes", 6)
        if query is None:
            return {}
        out = {}
        for res in self.resources:
            args = decode_template_args(res.name)
            if args is not None:
                out[res.name] = query(*args)
        return out

    @property
    def kernels(self) -> dict:
        """Per-kernel metadata for the instruction analysis."""
        meta = {}
        for res in self.resources:
            entry = asdict(res)
            if "decode_kernel" in res.name:
                args = decode_template_args(res.name)
                heads = args[5] if args else 1
                entry["kv_elems_per_iter_per_thread"] = KV_ELEMS_PER_LOOP_ITER_PER_THREAD * heads
            meta[res.name] = entry
        return meta


_TEMPLATE = re.compile(
    r"foscar_decode_kernel<(\d+), (\d+), (true|false), (true|false), (true|false), (\d+)(?:, (\d+))?>")


def decode_template_args(name: str) -> tuple[int, int, int, int, int, int] | None:
    """(bits, group_size, k_channel, v_channel, dequant, kv_heads_per_item) of a demangled
    decode kernel name: the instance the C API's queries name (a second instance, whose last
    template argument is its CTAs per SM, shares its first's shared memory)."""
    m = _TEMPLATE.search(name)
    if not m:
        return None
    bits, group, kch, vch, deq, heads, _ = m.groups()
    return int(bits), int(group), int(kch == "true"), int(vch == "true"), int(deq == "true"), int(heads)


def find_nvcc() -> str:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    raise BuildError("nvcc was not found: install the CUDA toolkit or set NVCC=/path/to/nvcc.")


def cache_dir() -> Path:
    root = os.environ.get("FOSCAR_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "foscar"


def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def hash_sources(h, suffixes: Sequence[str] = (".cu", ".cuh", ".h")):
    """Feeds every kernel source with these suffixes (name and bytes) into hash `h`."""
    for src in sorted(CSRC.glob("*")):
        if src.suffix in suffixes:
            h.update(src.name.encode())
            h.update(src.read_bytes())
    return h


def build_key(arch: str, nvcc: str, defines: Sequence[str] = ()) -> str:
    h = hash_sources(hashlib.sha256())
    h.update(" ".join(NVCC_FLAGS).encode())
    h.update(" ".join(defines).encode())
    h.update(arch.encode())
    h.update(_nvcc_version(nvcc).encode())
    return h.hexdigest()[:16]


def gencode(arch: str) -> list[str]:
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise BuildError(f"arch={arch!r} is not an SM target; expected e.g. 'sm_90a'.")
    num = arch[3:]
    # wgmma / setmaxnreg need the arch-specific 'a' target, spelled as -gencode.
    return [f"-gencode=arch=compute_{num},code={arch}"]


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> list[KernelResources]:
    """Registers, stack and spills per kernel from `-Xptxas -v` output."""
    out, name, stack = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            name = m.group(1)
        elif (m := _STACK.search(line)) and name:
            stack = tuple(int(x) for x in m.groups())
        elif (m := _REGS.search(line)) and name:
            out.append(KernelResources(_demangle(name), int(m.group(1)), *stack))
            name, stack = None, (0, 0, 0)
    return out


def _demangle(name: str) -> str:
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool:
        return name
    res = subprocess.run([tool, name], capture_output=True, text=True, check=False)
    return res.stdout.strip() or name


_KNOB_USE = re.compile(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b.*$", re.M)


def known_knobs() -> set[str]:
    """The FOSCAR_* names the kernel sources test in a preprocessor conditional: what a define
    can change."""
    names: set[str] = set()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
            for line in _KNOB_USE.findall(path.read_text()):
                names.update(n for n in re.findall(r"\bFOSCAR_[A-Z0-9_]+\b", line) if not n.endswith("_H_"))
    return names


def check_defines(defines: Sequence[str]) -> list[str]:
    """Kernel build knobs (`-DNAME=VALUE`, see foscar_decode.cuh), for experiments; a name the
    sources never test is refused (it would build the default kernels under another key)."""
    out, known = [], None
    for d in defines:
        if not re.fullmatch(r"-DFOSCAR_[A-Z0-9_]+(=[A-Za-z0-9_]+)?", d):
            raise BuildError(f"define {d!r} is not a kernel knob; expected -DFOSCAR_NAME=VALUE.")
        known = known_knobs() if known is None else known
        name = d[2:].split("=", 1)[0]
        if name not in known:
            raise BuildError(f"define {d!r}: the kernel sources never test {name}, so it would change nothing; "
                             f"expected one of {', '.join(sorted(known))}.")
        out.append(d)
    return out


def _compile(nvcc: str, arch: str, src: Path, obj: Path, defines: Sequence[str] = ()) -> str:
    cmd = [nvcc, *gencode(arch), *NVCC_FLAGS, *defines, "-c", str(src), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        raise BuildError(f"nvcc failed on {src.name}:\n{res.stderr[-6000:]}")
    return res.stderr


def build(arch: str = DEFAULT_ARCH, force: bool = False, verbose: bool = False,
          defines: Sequence[str] = ()) -> BuildResult:
    """Compiles (or finds in the cache) libfoscar.so for `arch`; `defines` are kernel knobs
    for experiments (scripts/kernel_lab.py), hashed into the cache key."""
    nvcc = find_nvcc()
    defines = check_defines(defines)
    key = build_key(arch, nvcc, defines)
    out_dir = cache_dir() / f"{arch}-{key}"
    so_path = out_dir / "libfoscar.so"
    meta_path = out_dir / "resources.json"
    objects = [out_dir / (Path(tu).stem + ".o") for tu in TRANSLATION_UNITS]
    if so_path.exists() and meta_path.exists() and not force:
        resources = [KernelResources(**r) for r in json.loads(meta_path.read_text())]
        return BuildResult(so_path, objects, arch, key, True, resources)

    out_dir.mkdir(parents=True, exist_ok=True)
    # Every file is written under a name of this process's own and moved into place (atomic), so
    # that builds of one key in several processes (a sweep's workers, the lab) never link or load
    # each other's half-written files; the last to finish wins with identical bytes.
    mine = f".{os.getpid()}.tmp"  # before the suffix: nvcc tells inputs by their extension
    tmp_objects = [o.with_name(o.stem + mine + o.suffix) for o in objects]
    with ThreadPoolExecutor(max_workers=min(len(TRANSLATION_UNITS), os.cpu_count() or 1)) as pool:
        logs = list(pool.map(lambda tu: _compile(nvcc, arch, CSRC / tu[0], tu[1], defines),
                             zip(TRANSLATION_UNITS, tmp_objects)))
    tmp = so_path.with_name(so_path.stem + mine + so_path.suffix)
    cmd = [nvcc, *gencode(arch), "-shared", "-Xcompiler", "-fPIC", *map(str, tmp_objects), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        raise BuildError(f"linking libfoscar.so failed:\n{res.stderr[-4000:]}")
    resources = parse_ptxas("\n".join(logs))
    meta_tmp = meta_path.with_name(meta_path.name + mine)
    meta_tmp.write_text(json.dumps([asdict(r) for r in resources], indent=1))
    for t, o in zip(tmp_objects, objects):
        os.replace(t, o)
    os.replace(meta_tmp, meta_path)  # before the library: a library found has its resources
    os.replace(tmp, so_path)  # atomic: a concurrent loader never sees half a library
    if verbose:
        print("\n".join(logs), file=sys.stderr)
    return BuildResult(so_path, objects, arch, key, False, resources)


def detect_arch() -> str | None:
    """sm_XYa for the first visible GPU, or None without one."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"sm_{major}{minor}{'a' if major >= 9 else ''}"
    except Exception:  # noqa: BLE001 - no torch or no driver both mean "no GPU here"
        pass
    return None
