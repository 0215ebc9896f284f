"""The one table that places each Hopper (sm_90) SASS opcode in a class and an issue pipe.

Classes are what FOSCAR.md counts: `alu` (the integer/logic pipe that mantissa injection
loads), `fma`, `xu`, `tensor`, `memory`, `control`, `uniform` (the per-warp scalar
datapath, U* opcodes) and `other`. The pipe is the one whose Nsight Compute counter
(`smsp__inst_executed_pipe_<pipe>`) the opcode increments; `none` marks opcodes that
increment no pipe counter, only `smsp__inst_executed` (NOP, plain BRA, ULDC, UMOV, ...).

Where the pipe was checked: every row marked `# seen` was measured on our H200 (ncu 2025.3,
driver 580) by tests/suite/data/alu_zoo.cu and alu_probe.cu: the per-instruction executed
counts of ncu's source page, summed by this table, equal the per-pipe counters exactly.
The other rows follow the Nsight Compute profiling guide's pipe descriptions.

Decisions worth knowing:
- MOV is ALU (seen). ptxas often moves registers with IMAD.MOV (fma pipe) instead, which
  is how it offloads the ALU pipe; both are counted where they land.
- HFMA2.MMA (and HMUL2/HFMA2 .MMA forms) issue to the tensor pipe (ncu:
  tensor_op_hmma_type_hfma2) (seen); ptxas also uses `HFMA2.MMA Rx, -RZ, RZ, c` to load a
  constant. Class `fma`, pipe `tensor`.
- F2FP (pack two floats into bf16x2/f16x2), I2FP (the sm_90 int->float form) and I2I
  (integer narrowing) are ALU on Hopper (seen); I2F, F2I, FRND, MUFU, POPC, FLO, BREV are
  XU (seen). VIADD, new in sm_90, issues to the FMA pipe, not the ALU (seen).
- IMAD.HI and IMAD.WIDE run at half rate on the fma pipe (FOSCAR.md section 4): flagged.
- SHFL, S2R, LDS/LDSM/STS, LDG/STG, ATOM/RED are `memory` on the lsu pipe; LDC and S2UR
  are `memory` on the adu pipe; ULDC is `memory` with no pipe counter.
- Predicated-off instructions are counted: a warp issues them whatever its predicate.
"""
from __future__ import annotations

from dataclasses import dataclass

CLASSES: tuple[str, ...] = ("alu", "fma", "xu", "tensor", "memory", "control", "uniform", "other")


@dataclass(frozen=True)
class OpInfo:
    cls: str  # one of CLASSES
    pipe: str  # ncu pipe name (alu, fmaheavy, fmalite, fma, xu, tensor, lsu, adu, cbu, uniform, tma) or 'none'
    half_rate: bool = False

    @property
    def pipe_group(self) -> str:
        """fmaheavy and fmalite are both halves of ncu's `fma` pipe counter."""
        return "fma" if self.pipe in ("fma", "fmaheavy", "fmalite") else self.pipe


def _rows(cls: str, pipe: str, names: str, half_rate: bool = False) -> dict[str, OpInfo]:
    return {n: OpInfo(cls, pipe, half_rate) for n in names.split()}


# Base opcode (text before the first '.') -> class and pipe.
OPCODES: dict[str, OpInfo] = {
    # integer / logic / compare / select: the ALU pipe
    **_rows("alu", "alu", "LOP3 SHF PRMT IADD3 ISETP SEL LEA BMSK SGXT IABS VIMNMX VIMNMX3 "
            "FSEL FSETP FMNMX F2FP MOV CS2R VOTE I2I I2IP I2FP"),  # seen
    **_rows("alu", "alu", "LOP SHL SHR IADD IMNMX PLOP3 P2R R2P CSET CSETP FCHK ISCADD BFE "
            "BFI FSET ISET HSETP2 HSET2 HMNMX2 VABSDIFF VABSDIFF4 PSETP VOTEU"),
    # not seen on the pipe counters yet: an integer add fused with a min/max, assumed to
    # issue where VIMNMX does (it appears once per token group in the v4 kernels)
    **_rows("alu", "alu", "VIADDMNMX"),
    # FP32 arithmetic and integer multiply: the FMA pipes
    # FP32 work issues to either half (fmalite or fmaheavy, seen); fp16x2 work counts in
    # both halves and once in `fma` (seen); integer multiply-add only in fmaheavy (seen).
    **_rows("fma", "fma", "FFMA FMUL FADD HFMA2 HMUL2 HADD2"),  # seen
    **_rows("fma", "fma", "FSWZADD FFMA32I FMUL32I FADD32I"),
    **_rows("fma", "fmaheavy", "IMAD VIADD IDP"),  # seen: VIADD is not ALU on Hopper
    **_rows("fma", "fmaheavy", "IMUL IMADSP IDP4A IMUL32I IMAD32I XMAD"),
    **_rows("fma", "fp64", "DFMA DADD DMUL DSETP DMNMX"),
    # transcendental and conversions
    **_rows("xu", "xu", "MUFU I2F F2I FRND POPC FLO BREV"),  # seen
    **_rows("xu", "xu", "F2IP F2F"),
    # tensor cores
    **_rows("tensor", "tensor", "HMMA HGMMA QGMMA IGMMA BGMMA IMMA DMMA BMMA GMMA"),
    # memory and data movement
    **_rows("memory", "lsu", "LDS LDSM STS STSM LDG STG LD ST LDL STL ATOM ATOMS ATOMG RED "
            "SHFL S2R MOVM MATCH MEMBAR CCTL CCTLL ERRBAR LDGSTS LDGDEPBAR ARRIVES "
            "FENCE QSPC SUATOM SULD SUST"),  # SHFL, S2R: seen
    **_rows("memory", "adu", "LDC S2UR"),  # seen
    **_rows("memory", "tma", "UTMALDG UTMASTG UTMAPF UTMAREDG UTMACCTL UTMACMDFLUSH UBLKCP "
            "UBLKRED UBLKPF"),
    **_rows("memory", "lsu", "SYNCS"),
    **_rows("memory", "none", "ULDC"),  # seen
    **_rows("memory", "tex", "TEX TLD TLD4 TMML TXD TXQ"),
    # control flow, barriers, convergence
    **_rows("control", "none", "BRA NOP"),  # seen
    **_rows("control", "cbu", "EXIT BSSY BSYNC WARPSYNC BREAK CALL RET BMOV BPT KILL "  # EXIT: seen
            "RTT JMP JMXU ELECT WARPGROUP YIELD NANOSLEEP ACQBULK ACQSHMINIT"),
    **_rows("control", "adu", "BAR BRX JMX BRXU DEPBAR"),
    **_rows("control", "none", "UCGABAR_ARV UCGABAR_WAIT USETMAXREG SETCTAID SETMAXREG PMTRIG"),
    # uniform datapath (scalar, once per warp); UMOV counts in no pipe counter (seen)
    **_rows("uniform", "uniform", "UIADD3 ULOP3 ULOP USHF UPRMT ULEA USEL UISETP UFLO UPOPC "  # UIADD3: seen
            "UBMSK USGXT UBREV UIMAD UIABS UIMNMX UPLOP3 UP2UR UR2UP UVIADD R2UR REDUX"),
    **_rows("uniform", "none", "UMOV"),  # seen
}

# Longer mnemonic prefixes that differ from their base opcode.
FORMS: dict[str, OpInfo] = {
    "IMAD.HI": OpInfo("fma", "fmaheavy", half_rate=True),
    "IMAD.WIDE": OpInfo("fma", "fmaheavy", half_rate=True),
    "HFMA2.MMA": OpInfo("fma", "tensor"),  # seen: ncu tensor_op_hmma_type_hfma2
    "HMUL2.MMA": OpInfo("fma", "tensor"),
    "HADD2.MMA": OpInfo("fma", "tensor"),
    "HADD2.F32": OpInfo("fma", "fmaheavy"),  # f16 -> f32 conversion done by the FMA pipe
}

UNKNOWN = OpInfo("other", "unknown")


def classify(mnemonic: str) -> OpInfo:
    """Class and pipe of one SASS mnemonic with its modifiers, e.g. 'IMAD.WIDE.U32'."""
    parts = mnemonic.upper().split(".")
    for n in range(len(parts), 1, -1):
        form = FORMS.get(".".join(parts[:n]))
        if form is not None:
            return form
    info = OPCODES.get(parts[0])
    if info is not None:
        return info
    if parts[0].startswith("U") and len(parts[0]) > 2:
        return OpInfo("uniform", "uniform")  # uniform-datapath forms not listed above
    return UNKNOWN
