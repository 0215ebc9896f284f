"""scripts/sass_regions.py: a -lineinfo disassembly parsed into instructions with their inline
frames, the chunk loop found, and counts (static, or a profile's) grouped by the call made
from the consumer."""
from __future__ import annotations

import gzip

import pytest

FN = "_ZN6foscar20foscar_decode_kernelILi4ELi128ELb1ELb0ELb0ELi2EEEvNS_12DecodeParamsE"

DISASM = f"""//--------------------- .text.{FN} --------------------------
{FN}:
.text.{FN}:
	//## File "/r/foscar/csrc/foscar_decode.cuh", line 797
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_1:
	//## File "/r/foscar/csrc/foscar_common.cuh", line 22 inlined at "/r/foscar/csrc/foscar_decode.cuh", line 690
	//## File "/r/foscar/csrc/foscar_decode.cuh", line 690 inlined at "/r/foscar/csrc/foscar_consume.cuh", line 543
	//## File "/r/foscar/csrc/foscar_consume.cuh", line 543 inlined at "/r/foscar/csrc/foscar_decode.cuh", line 810
	//## File "/r/foscar/csrc/foscar_decode.cuh", line 810
        /*0010*/                   LOP3.LUT R1, R2, 0xf000f, R3, 0xea, !PT ;
        /*0020*/                   HGMMA.64x8x16.F32 R24, R28, gdesc[UR16], RZ, !UPT ;
	//## File "/r/foscar/csrc/foscar_consume.cuh", line 213 inlined at "/r/foscar/csrc/foscar_consume.cuh", line 545
	//## File "/r/foscar/csrc/foscar_consume.cuh", line 545 inlined at "/r/foscar/csrc/foscar_decode.cuh", line 810
	//## File "/r/foscar/csrc/foscar_decode.cuh", line 810
        /*0030*/                   HMMA.16816.F32 R4, R8, R12, RZ ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/               @P0 BRA `(.L_x_1) ;
        /*0060*/                   EXIT ;
//--------------------- .text.other --------------------------
"""


@pytest.fixture(scope="module")
def mod(script):
    return script("sass_regions")


def test_parse_frames_and_loop(mod):
    ins = mod.parse(DISASM, "ILi4ELi128ELb1")
    assert [x.addr for x in ins] == [0x0, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60]
    assert ins[1].frames[:2] == ["foscar_common.cuh:22", "foscar_decode.cuh:690"]
    assert ins[2].frames == ins[1].frames  # no new location lines: the same frames
    assert mod.opcode("@!P0  BRA 0x10") == "BRA" and ins[5].opcode == "BRA"
    lo, hi = mod.chunk_loop(ins)
    assert (ins[lo].addr, ins[hi].addr) == (0x10, 0x50)
    rows = mod.tabulate(ins[lo:hi + 1], None)  # most instructions first
    assert rows[0]["region"] == "foscar_consume.cuh:213 <- foscar_consume.cuh:545" and rows[0]["count"] == 3
    assert rows[1] == {"region": "foscar_decode.cuh:690 <- foscar_consume.cuh:543", "count": 2, "share": 0.4,
                       "stall_share": 0.0, "opcodes": {"LOP3.LUT": 1, "HGMMA.64x8x16.F32": 1}}


def test_profile_weights_and_mismatch(mod, tmp_path, capsys):
    (tmp_path / "k.sass").write_text(DISASM)
    ops = ["S2R R0, SR_TID.X", "LOP3.LUT R1", "HGMMA.64x8x16.F32 R24", "HMMA.16816.F32 R4", "WARPGROUP.DEPBAR.LE gsb0",
           "@P0 BRA 0x7f0000000010", "EXIT"]
    rows = ["\"Kernel Name\",\"void foscar_decode_kernel<4, 128, 1, 0, 0, 2>(DecodeParams)\"",
            "\"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\",\"Instructions Executed\""]
    rows += [f"\"{0x7f0000000000 + 16 * i:#x}\",\"{op}\",\"{i}\",\"{100 * (i + 1)}\"" for i, op in enumerate(ops)]
    with gzip.open(tmp_path / "src.csv.gz", "wt") as f:
        f.write("\n".join(rows) + "\n")
    mod.main([str(tmp_path / "k.sass"), "--kernel", "ILi4ELi128ELb1", "--ncu-src", str(tmp_path / "src.csv.gz")])
    out = capsys.readouterr().out
    assert "whole kernel: 2,800" in out and "foscar_consume.cuh:213 <- foscar_consume.cuh:545" in out
    with gzip.open(tmp_path / "other.csv.gz", "wt") as f:  # a profile of another build
        f.write("\n".join(rows[:3] + [r.replace("LOP3.LUT", "IMAD") for r in rows[3:]]) + "\n")
    with pytest.raises(SystemExit, match="another build"):
        mod.main([str(tmp_path / "k.sass"), "--kernel", "ILi4ELi128ELb1", "--ncu-src", str(tmp_path / "other.csv.gz")])
    with pytest.raises(SystemExit, match="matches 0"):
        mod.main([str(tmp_path / "k.sass"), "--kernel", "nope"])


LIVE = f"""//--------------------- .text.{FN} --------------------------
.text.{FN}:                                    // |       |        |        |         |
                                               // | GPR   | PRED   | UGPR   | UPRED   |
        /*0000*/                   S2R R0, SR_TID.X ;                                // |   1   |        |        |         |
        /*0010*/                   LOP3.LUT R1, R2, 0xf000f, R3, 0xea, !PT ;         // |  90   |   1    |   4    |         |
        /*0020*/                   HGMMA.64x8x16.F32 R24, R28, gdesc[UR16], RZ, !UPT ;  // | 100   |   1    |   6    |    1    |
        /*0030*/                   HMMA.16816.F32 R4, R8, R12, RZ ;                  // | 121   |   1    |   6    |         |
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;                   // | 123   |   1    |   6    |         |
        /*0050*/               @P0 BRA `(.L_x_1) ;                                   // |  80   |   2    |   6    |         |
        /*0060*/                   EXIT ;                                            // |   0   |        |        |         |
//--------------------- .text.other --------------------------
.text.other:                                   // |       |        |        |         |
        /*0000*/                   EXIT ;                                            // | 200   |        |        |         |
"""


def test_live_registers_by_region(mod, tmp_path, capsys):
    live = mod.read_live(LIVE, FN)
    assert live[0x40] == 123 and live[0x10] == 90 and len(live) == 7  # not the other function's 200
    ins = mod.parse(DISASM, "ILi4ELi128ELb1")
    lo, hi = mod.chunk_loop(ins)
    regs = mod.live_by_region(ins[lo:hi + 1], live)
    assert regs["foscar_consume.cuh:213 <- foscar_consume.cuh:545"] == (123, (121 + 123 + 80) / 3)
    assert regs["foscar_decode.cuh:690 <- foscar_consume.cuh:543"] == (100, 95.0)
    (tmp_path / "k.sass").write_text(DISASM)
    (tmp_path / "k.live").write_text(LIVE)
    mod.main([str(tmp_path / "k.sass"), "--kernel", "ILi4ELi128ELb1", "--live", str(tmp_path / "k.live")])
    out = capsys.readouterr().out
    assert "80-123 live registers; the function's most 123" in out
    assert "live 123 max 108.0 mean  foscar_consume.cuh:213" in out
    with pytest.raises(SystemExit, match="no life ranges"):
        mod.read_live(LIVE, "nope")
    with pytest.raises(SystemExit, match="another build"):
        mod.live_by_region(ins, {0x0: 1})


def test_regions_are_the_calls_of_one_trip(mod):
    # The default root, `run_trip` of foscar_consume.cuh: its body's lines bound the regions, and
    # each side of a region is named by the source function it lies in.
    root = mod.find_root("foscar_consume.cuh:run_trip")
    lines = (mod.CSRC / "foscar_consume.cuh").read_text().splitlines()
    assert "run_trip(" in lines[root.first - 1] and lines[root.last - 1] == "}"
    inside = f"foscar_consume.cuh:{root.first + 3}"
    struct = next(n for n, text in enumerate(lines, 1) if text.startswith("struct VFoldToken"))
    pv = next(n for n, text in enumerate(lines, 1) if n > struct and " pv(" in text) + 3  # a line of VFoldToken::pv
    frames = ["foscar_common.cuh:22", f"foscar_consume.cuh:{pv}", inside, "foscar_consume.cuh:586"]
    assert mod.region(frames, root) == f"foscar_consume.cuh:{pv} <- {inside}"
    assert mod.region(frames[:2] + ["foscar_decode.cuh:810"], root) == f"foscar_common.cuh:22 <- foscar_consume.cuh:{pv}"
    assert mod.function_at(inside) == "run_trip" and mod.function_at("elsewhere.cuh:3") == "?"
    assert mod.function_at(f"foscar_consume.cuh:{pv}") == "VFoldToken::pv"  # a member: its struct names it
    with pytest.raises(SystemExit, match="no __device__ function 'nope'"):
        mod.find_root("foscar_consume.cuh:nope")
    with pytest.raises(SystemExit, match="expected FILE:FUNCTION"):
        mod.find_root("run_trip")
