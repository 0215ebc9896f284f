"""The producer's stage loops in SASS: on the uniform datapath, with no local memory.

The producer runs at 24 registers (setmaxnreg). v31's `produce()`, thread 0 alone, keeps the page
and address arithmetic of its stage loop in uniform registers. v36's stealing producer ran on the
whole warp 0 and used its claims' results as they came: ptxas moved that arithmetic to vector
registers, the loop spilled, and every trip at batch 128 ran 7-18 % slower (docs/PERFORMANCE.md,
eighteenth session). v36b is thread 0 alone again and passes what it reads from memory through
`lone_uniform`. Built like the library (foscar.build's flags, sm_90a): the default build and the
`FOSCAR_STEAL=1` build of the paired K token-wise / V token-wise INT2 kernel, every loop that issues
bulk copies (UBLKCP)."""
from __future__ import annotations

import re
import subprocess

import pytest

from foscar.build import CSRC, DEFAULT_ARCH, NVCC_FLAGS, BuildError, find_nvcc
from suite.alu import sass

INSTANCE = "2, 128, false, false, false, 2"
_INS = re.compile(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
_BRA = re.compile(r"\bBRA\s+(?:`\()?(?:0x)?([0-9a-f]+)")


def copy_loops(listing: str) -> list[list[str]]:
    """The bodies of the innermost loops (a backward branch and what it jumps over, holding no
    other such loop) that issue a bulk copy, from a `cuobjdump -sass` listing of one kernel."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in map(_INS.match, listing.splitlines()) if m]
    at = {addr: i for i, (addr, _) in enumerate(ins)}
    spans = []
    for i, (addr, text) in enumerate(ins):
        m = _BRA.search(text)
        if m and int(m.group(1), 16) <= addr and int(m.group(1), 16) in at:
            first = at[int(m.group(1), 16)]
            if any("UBLKCP" in t for _, t in ins[first:i + 1]):
                spans.append((first, i))
    inner = [(a, b) for a, b in spans if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]
    return [[t for _, t in ins[a:b + 1]] for a, b in inner]


def test_copy_loops_are_found_in_a_listing():
    listing = """
        /*0100*/                   UIADD3 UR4, UR4, 0x1, URZ ;
        /*0110*/                   UBLKCP.S.G [UR8], [UR10], UR12 ;
        /*0120*/                   LDL R2, [R1] ;
        /*0130*/               @P0 BRA 0x100 ;
        /*0140*/                   BRA 0x160 ;
        /*0150*/                   BRA 0x100 ;
    """
    loops = copy_loops(listing)  # the loop to 0x130 holds none other; the one to 0x150 holds it
    assert [len(body) for body in loops] == [4]
    assert loops[0][-1].endswith("BRA 0x100") and "LDL" in loops[0][2]


@pytest.fixture
def producer_sass(tmp_path):
    try:
        nvcc = find_nvcc()
    except BuildError:
        pytest.skip("nvcc is not installed")
    if sass.find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")

    def build(*defines: str) -> str:
        src, cubin = tmp_path / "producer.cu", tmp_path / "producer.cubin"
        src.write_text('#include "foscar_decode.cuh"\n'
                       f"template __global__ void foscar::foscar_decode_kernel<{INSTANCE}>("
                       "const __grid_constant__ foscar::DecodeParams);\n")
        run = subprocess.run([nvcc, *NVCC_FLAGS, f"-arch={DEFAULT_ARCH}", f"-I{CSRC}", *defines, "-cubin", str(src),
                              "-o", str(cubin)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        return sass.disassemble(cubin)

    return build


@pytest.mark.parametrize("defines", [(), ("-DFOSCAR_STEAL=1",)], ids=["default", "steal"])
def test_stage_loops_stay_uniform_without_local_memory(producer_sass, defines):
    loops = copy_loops(producer_sass(*defines))
    assert loops, f"no loop with a bulk copy in foscar_decode_kernel<{INSTANCE}> {defines}"
    # the innermost: each streams the two stages of a paired trip (eight copies)
    for body in [b for b in loops if sum("UBLKCP" in t for t in b) == 8]:
        local = [t for t in body if re.search(r"\b(LDL|STL)\b", t)]
        uniform = [t for t in body if re.match(r"(@!?U?P\w+\s+)?U(?!BLKCP)[A-Z0-9]+", t)]
        where = f"{defines}: a stage loop of {len(body)} instructions"
        assert not local, f"{where} reads or writes local memory (spills): {local[:4]}"
        assert len(uniform) >= len(body) // 2, (f"{where} has {len(uniform)} uniform instructions: its address "
                                                 "arithmetic left the uniform datapath")
