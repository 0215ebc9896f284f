"""Static figures for our own kernels: which template instance of libfoscar.so a FOSCAR
backend runs for a case, and the build's per-kernel metadata (elements per main-loop trip).

foscar.build.build(arch) gives `.cubin` (a file cuobjdump reads: the .so) and `.kernels`,
{demangled kernel name: {..., 'kv_elems_per_iter_per_thread': N, optional 'tensor_per_iter',
'loop': (start, end), 'marker': True}}; the decode kernel is
foscar::foscar_decode_kernel<BITS, D, G, K_CHANNELWISE, V_CHANNELWISE, DEQUANT>.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
from typing import Any, Sequence

from suite.alu.sass import StaticCounts, analyze_function, disassemble, parse_sass

ELEMS_KEYS = ("kv_elems_per_iter_per_thread", "elems_per_iter_per_thread")


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Mangled -> demangled through c++filt (one call); names map to themselves without it."""
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False)
    out = res.stdout.splitlines()
    if res.returncode or len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out))


def kernel_meta(kernels: dict, mangled: str, demangled: str) -> dict:
    return kernels.get(demangled) or kernels.get(mangled) or {}


def elems_of(meta: dict) -> float | None:
    for key in ELEMS_KEYS:
        if meta.get(key):
            return float(meta[key])
    return None


def decode_kernel_regex(case: Any, dequant: bool, max_heads: int | None) -> str:
    """Mangled-name regex of the foscar_decode_kernel<bits, group, kch, vch, deq, heads> that
    runs `case`: heads as foscar.kernels plans them from `max_heads` (the build's
    foscar_kv_heads_per_item; None: any), the kernel's own instance (a second one, at other CTAs
    per SM, foscar_ctas_per_sm_alt, runs the same code at fewer registers)."""
    from baselines.foscar import quant_config
    from foscar.kernels import CHUNK_TOKENS, planned_kv_heads_per_item

    b = lambda flag: "1" if flag else "0"  # noqa: E731 - Itanium mangling of bool template args
    if max_heads is None:
        heads = r"\d+"
    else:  # as the planner pairs on this GPU, over the chunks held in pages
        packed = case.kv_len - quant_config(case).tail_len(case.kv_len)
        heads = planned_kv_heads_per_item(case.batch, case.num_kv_heads, max_heads, bits=case.bits,
                                          max_chunks=math.ceil(packed / CHUNK_TOKENS), gpu_name=_gpu_name())
    return (
        f"foscar_decode_kernelILi{case.bits}ELi{case.group_size}E"
        f"Lb{b(case.k_mode == 'channel')}ELb{b(case.v_mode == 'channel')}ELb{b(dequant)}ELi{heads}ELi0E"
    )


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no torch or no driver: the default pairing rule
        return None


def analyze_build(build: Any, kernel_regex: str | None = None, *, arch: str | None = None,
                  scope: str = "loop", sass_text: str | None = None) -> list[tuple[str, StaticCounts]]:
    """(demangled name, counts) for every kernel of a BuildResult (or those matching the
    regex, searched in mangled and demangled names), each with its own metadata."""
    text = sass_text if sass_text is not None else disassemble(build.cubin, arch)
    funcs = parse_sass(text)
    if arch:
        funcs = [f for f in funcs if f.arch in (None, arch)]
    names = demangle([f.name for f in funcs])
    kernels = getattr(build, "kernels", None) or {}
    pat = re.compile(kernel_regex) if kernel_regex else None
    out = []
    for f in funcs:
        pretty = names.get(f.name, f.name)
        if pat and not (pat.search(f.name) or pat.search(pretty)):
            continue
        meta = kernel_meta(kernels, f.name, pretty)
        loop = tuple(meta["loop"]) if meta.get("loop") else "auto"
        out.append((pretty, analyze_function(
            f, elems_of(meta), scope=scope, tensor_per_iter=meta.get("tensor_per_iter"),
            loop=loop, marker=bool(meta.get("marker")),
        )))
    return out


def static_for_backend(backend: Any, case: Any, build: Any, *, sass_text: str | None = None) -> StaticCounts | None:
    """The static counts of the decode kernel a FOSCAR backend runs for `case`, or None for
    backends that are not ours."""
    if getattr(backend, "family", "") != "foscar" and not str(getattr(backend, "name", "")).startswith("foscar"):
        return None
    dequant = getattr(backend, "variant", "fold") == "dequant"
    max_heads = build.kv_heads_per_item(case.num_q_heads, case.num_kv_heads)
    hits = analyze_build(build, decode_kernel_regex(case, dequant, max_heads), sass_text=sass_text)
    return hits[0][1] if hits else None
