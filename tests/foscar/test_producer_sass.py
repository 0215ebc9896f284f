"""The producer's stage loops in SASS: on the uniform datapath, with no local memory.

The producer runs at 24 registers (setmaxnreg). v31's `produce()`, thread 0 alone, keeps the page
and address arithmetic of its stage loop in uniform registers. v36's producer ran on the whole
warp 0 and steered its loop by values it read from memory: ptxas moved that arithmetic to vector
registers, the loop spilled, and every trip at batch 128 ran 7-18 % slower (docs/PERFORMANCE.md,
eighteenth session). Built like the library (foscar.build's flags, sm_90a): the paired K
token-wise / V token-wise INT2 kernel, every loop that issues bulk copies (UBLKCP)."""
from __future__ import annotations

import pytest

from suite.alu import sass

INSTANCE = "2, 128, false, false, false, 2"
COPIES = 8  # bulk copies a pass of the stage loop issues: the two stages of a paired trip


def stage_loops(listing: str) -> list[list[sass.Instruction]]:
    """The bodies of the innermost loops that issue a paired trip's bulk copies, from a
    `cuobjdump -sass` listing of one kernel (suite.alu.sass's parser and loops). A body is the
    loop's instructions by control flow (sass.cfg_body): ptxas lays some of the consumers' split
    merge inside the address range of a producer loop (v39's merge put 20 more non-uniform
    instructions there, none of them the producer's)."""
    func = sass.parse_sass(listing)[0]
    bodies = {lp: sass.cfg_body(func, lp) for lp in sass.find_loops(func)}
    loops = [lp for lp, b in bodies.items() if sum(i.opcode == "UBLKCP" for i in b) == COPIES]
    return [bodies[lp] for lp in loops if not any(lp.contains(other) for other in loops)]


@pytest.fixture
def producer_sass(library_compile):
    if sass.find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")

    cubin = library_compile('#include "foscar_decode.cuh"\n'
                            f"template __global__ void foscar::foscar_decode_kernel<{INSTANCE}>("
                            "const __grid_constant__ foscar::DecodeParams);\n", output="cubin")
    return sass.disassemble(cubin)


def test_stage_loops_stay_uniform_without_local_memory(producer_sass):
    loops = stage_loops(producer_sass)
    assert loops, f"no loop with {COPIES} bulk copies in foscar_decode_kernel<{INSTANCE}>"
    for body in loops:
        local = [i.text for i in body if i.opcode in sass.LOCAL_OPCODES]
        uniform = [i for i in body if i.opcode.startswith("U") and i.opcode != "UBLKCP"]
        where = f"a stage loop of {len(body)} instructions"
        assert not local, f"{where} reads or writes local memory (spills): {local[:4]}"
        assert len(uniform) >= len(body) // 2, (f"{where} has {len(uniform)} uniform instructions: its address "
                                                 "arithmetic left the uniform datapath")
