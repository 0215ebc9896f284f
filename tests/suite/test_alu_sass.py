"""Static SASS analysis: parsing cuobjdump/nvdisasm listings, finding the main loop,
counting per class and per KV element."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from suite.alu import sass
from suite.alu.sass import (Loop, SassError, analyze_function, cfg_body, find_loops, main_loop, parse_sass,
                            static_alu)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def probe():
    return {f.name: f for f in parse_sass((DATA / "sass_probe_sm90a.txt").read_text())}


@pytest.fixture(scope="module")
def demo():
    return parse_sass((DATA / "sass_demo_decode_sm90a.txt").read_text())


def test_parse_functions_and_trim(probe):
    assert set(probe) == {"probe_kv_loop", "probe_plain", "probe_zoo"}
    f = probe["probe_kv_loop"]
    assert f.arch == "sm_90a"
    assert f.instructions[0].mnemonic == "LDC" and f.instructions[-1].mnemonic == "EXIT"  # NOP/trap cut
    bra = [i for i in f.instructions if i.opcode == "BRA"]
    assert [(i.predicate, i.target) for i in bra] == [("@!P0", 0x2B0), ("@!P0", 0x1B0)]


def test_probe_main_loop_counts(probe):
    res = analyze_function(probe["probe_kv_loop"], 8)
    assert res.loop == (0x1B0, 0x2A0) and res.n_instructions == 16
    c = res.by_class
    assert (c["alu"], c["fma"], c["tensor"], c["memory"], c["control"], c["uniform"]) == (8, 2, 1, 2, 2, 1)
    assert res.by_opcode["LOP3"] == 4 and res.by_opcode["SHF"] == 2
    assert res.tensor_elems_per_body == 8.0 and res.unroll == 1.0
    assert res.alu_per_elem == pytest.approx(1.0)  # a shift plus a LOP3 per bf16x2 register
    assert res.inst_per_elem == pytest.approx(2.0)
    assert res.per_elem["fma"] == pytest.approx(0.25)
    assert res.notes == []


def test_loop_without_tensor_work_and_loop_free_kernel(probe):
    zoo = analyze_function(probe["probe_zoo"])
    assert zoo.loop is not None and zoo.by_class["tensor"] == 0 and zoo.per_elem == {}
    plain = analyze_function(probe["probe_plain"], 8)
    assert plain.scope == "kernel" and plain.n_instructions == 16
    assert "no loop found" in plain.notes[0]


def test_whole_kernel_scope(probe):
    res = analyze_function(probe["probe_kv_loop"], scope="kernel")
    assert res.scope == "kernel" and res.loop is None
    assert res.n_instructions == len(probe["probe_kv_loop"].instructions) == 57
    assert sum(res.by_class.values()) == res.n_instructions
    assert res.by_pipe["alu"] == 20 and res.half_rate_fma == 3  # IMAD.WIDE x3


def test_nested_and_remainder_loops(demo):
    f = demo[0]
    assert find_loops(f) == [Loop(0x40, 0x90), Loop(0xA0, 0x260), Loop(0xC0, 0x230), Loop(0x270, 0x2E0)]
    # the page loop holds the tile loop; the producer loop has no tensor work; the
    # remainder loop has fewer tensor instructions
    assert main_loop(f) == Loop(0xC0, 0x230)
    res = analyze_function(f, 16)
    assert res.tensor_elems_per_body == 32.0 and res.unroll == 2.0 and res.elems_per_body == 32.0
    assert res.by_class["tensor"] == 4 and res.by_opcode["LOP3"] == 5
    assert res.alu_per_elem == pytest.approx(res.by_class["alu"] / 32)
    by_tpi = analyze_function(f, 16, tensor_per_iter=2)
    assert by_tpi.unroll == 2.0 and by_tpi.per_elem == res.per_elem


def test_metadata_mismatch_is_noted(demo):
    res = analyze_function(demo[0], 24)  # 32 tensor elements are not a multiple of 24
    assert res.unroll == 1.0 and res.elems_per_body == 24.0
    assert any("cover 32" in n for n in res.notes)


def test_marker_and_explicit_loop(demo):
    marked = demo[1]
    assert main_loop(marked) == Loop(0xC0, 0x230)
    assert main_loop(marked, marker=True) == Loop(0x280, 0x2F0)
    with pytest.raises(SassError, match="pmevent"):
        main_loop(demo[0], marker=True)
    res = analyze_function(demo[0], 8, loop=(0x270, 0x2E0))
    assert res.by_class["tensor"] == 1 and res.alu_per_elem == pytest.approx(5 / 8)  # LOP3 x2, SHF, IADD3, ISETP


def test_nvdisasm_labels_resolve():
    f = parse_sass((DATA / "sass_nvdisasm_labels_sm90a.txt").read_text())[0]
    assert f.name == "k" and f.instructions[-1].mnemonic == "EXIT"
    assert main_loop(f) == Loop(0x160, 0x4D0)  # the unrolled-by-16 loop, the largest
    assert sass.marker_region(f) == (0x10, 0x980)


def test_tensor_shapes():
    e = sass.tensor_kv_elems_per_thread
    assert e("HMMA.16816.F32.BF16") == 8 and e("HMMA.1688.F32") == 4
    assert e("HGMMA.64x8x16.F32.BF16") == 8 and e("QGMMA.64x16x32.F32.E4M3.E4M3") == 16
    assert e("IMMA.16832.S32.S8.S8") == 16 and e("HMMA.999") is None


def test_static_alu_on_text_and_errors():
    text = (DATA / "sass_probe_sm90a.txt").read_text()
    [res] = static_alu("unused", "kv_loop", 8, sass_text=text)
    assert res.kernel == "probe_kv_loop" and res.alu_per_elem == pytest.approx(1.0)
    with pytest.raises(SassError, match="probe_kv_loop"):
        static_alu("unused", "no_such_kernel", sass_text=text)
    with pytest.raises(SassError, match="does not exist"):
        sass.disassemble("/nonexistent/x.cubin")


def test_missing_cuobjdump_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sass, "find_tool", lambda name: None)
    f = tmp_path / "x.cubin"
    f.write_bytes(b"\x7fELF")
    with pytest.raises(SassError, match="nvidia-cuda-cuobjdump"):
        sass.disassemble(f)


def _tools():
    return shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists(), sass.find_tool("cuobjdump")


@pytest.mark.skipif(not all(_tools()), reason="needs nvcc and cuobjdump")
def test_nvcc_cuobjdump_probe(tmp_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cubin = tmp_path / "probe.cubin"
    subprocess.run([nvcc, "-cubin", "-O3", "-gencode=arch=compute_90a,code=sm_90a",
                    str(DATA / "alu_probe.cu"), "-o", str(cubin)], check=True, capture_output=True)
    results = {r.kernel: r for r in static_alu(cubin, "probe", 8)}
    kv = results["probe_kv_loop"]
    assert kv.by_class["tensor"] == 1 and kv.by_opcode["LOP3"] == 4
    assert kv.alu_per_elem == pytest.approx(1.0)
    assert results["probe_plain"].scope == "kernel"


NESTED_REBUILD = """
	code for sm_90a
		Function : rebuild_demo
        /*0000*/                    LDC R1, c[0x0][0x28] ;
        /*0010*/                    LDS.128 R8, [R5] ;
        /*0020*/                    LOP3.LUT R12, R8, 0xf000f, R4, 0xea, !PT ;
        /*0030*/                    LOP3.LUT R13, R9, 0xf000f, R4, 0xea, !PT ;
        /*0040*/                @P1 BRA 0x90 ;
        /*0050*/                    LDS R20, [R6] ;
        /*0060*/                    FMUL R20, R20, R21 ;
        /*0070*/                    STS [R6], R20 ;
        /*0080*/                @P2 BRA 0x50 ;
        /*0090*/                    WARPGROUP.ARRIVE ;
        /*00a0*/                    HGMMA.64x8x16.F32 R24, R12, gdesc[UR12], R24 ;
        /*00b0*/                    HGMMA.64x8x16.F32 R24, R14, gdesc[UR12], R24, gsb0 ;
        /*00c0*/                    WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00d0*/                @P0 BRA 0x10 ;
        /*00e0*/                    LDG.E R2, desc[UR4][R6.64] ;
        /*00f0*/                    LOP3.LUT R12, R2, 0xf000f, R4, 0xea, !PT ;
        /*0100*/                    HMMA.16816.F32.BF16 R24, R12, R16, R24 ;
        /*0110*/                    HMMA.16816.F32.BF16 R28, R12, R18, R28 ;
        /*0120*/                @P3 BRA 0xe0 ;
        /*0130*/                    EXIT ;
"""


def test_a_wgmma_main_loop_beats_a_tail_loop_though_a_rebuild_loop_nests_in_it():
    # The channel-wise-K kernels: the main loop (HGMMA) holds a rarely taken per-group rebuild
    # loop; the BF16 tail loop after it does as much tensor work on mma.sync with no loop inside.
    (f,) = parse_sass(NESTED_REBUILD)
    assert Loop(0x50, 0x80) in find_loops(f) and Loop(0xE0, 0x120) in find_loops(f)
    assert main_loop(f, 16) == Loop(0x10, 0xD0)


SPILLING_ROLES = """
	code for sm_90a
		Function : roles_demo
        /*0000*/                    LDC R1, c[0x0][0x28] ;
        /*0010*/                    STL [R1], R4 ;
        /*0020*/                    LDS.128 R8, [R5] ;
        /*0030*/                    LDL R4, [R1] ;
        /*0040*/                    WARPGROUP.ARRIVE ;
        /*0050*/                    HGMMA.64x8x16.F32 R24, R8, gdesc[UR12], R24, gsb0 ;
        /*0060*/                    WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/                @P0 BRA 0x20 ;
        /*0080*/                    STL [R1+0x4], R9 ;
        /*0090*/                    LDL.LU R9, [R1+0x4] ;
        /*00a0*/                    STL.64 [R1+0x8], R10 ;
        /*00b0*/                    EXIT ;
"""


def test_local_memory_is_counted_in_the_loop_and_in_the_kernel():
    # A spill inside the main loop costs every trip; the others (another role's, say) are
    # counted in the kernel's total.
    (f,) = parse_sass(SPILLING_ROLES)
    res = analyze_function(f, 8)
    assert res.loop == (0x20, 0x70)
    assert (res.local_in_body, res.local_in_kernel) == (1, 5)
    assert analyze_function(f, scope="kernel").local_in_body == 5


INTERLEAVED_ROLES = """
	code for sm_90a
		Function : interleaved_demo
        /*0000*/                    ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0010*/                @P0 BRA 0x50 ;
        /*0020*/                    UIADD3 UR4, UR4, 0x1, URZ ;
        /*0030*/                    UBLKCP.S.G [UR8], [UR10], UR12 ;
        /*0040*/                    BRA 0x80 ;
        /*0050*/                    MUFU.EX2 R2, R3 ;
        /*0060*/                    FADD R4, R4, R2 ;
        /*0070*/                    EXIT ;
        /*0080*/                    BRA.DIV UR5, 0xb0 ;
        /*0090*/                @P1 BRA 0x20 ;
        /*00a0*/                    EXIT ;
        /*00b0*/                    UMOV UR6, 0x1 ;
        /*00c0*/                    BRA 0x90 ;
"""


def test_a_loop_body_by_control_flow_leaves_out_code_laid_inside_its_range():
    # ptxas may place another warp role's blocks between a loop's header and its back-edge (here
    # 0x50-0x70, reached only from the entry), and a block of the loop after it (the divergent
    # path at 0xb0): the body by control flow is the loop's own instructions wherever they lie.
    (f,) = parse_sass(INTERLEAVED_ROLES)
    loop = Loop(0x20, 0x90)
    assert loop in find_loops(f)
    assert [i.addr for i in cfg_body(f, loop)] == [0x20, 0x30, 0x40, 0x80, 0x90, 0xB0, 0xC0]
