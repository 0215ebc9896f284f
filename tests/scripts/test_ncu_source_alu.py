"""scripts/ncu_source_alu.py: the predicated-on thread instructions of an ncu source-page export,
summed per kernel, the ALU class by suite.alu.isa, guards stripped."""
from __future__ import annotations

import pytest

HEADER = '"Address","Source","Instructions Executed","Thread Instructions Executed","Predicated-On Thread Instructions Executed"'


def section(kernel: str, rows: list[tuple[str, int]]) -> str:
    lines = [f'"Kernel Name","{kernel}"', HEADER]
    lines += [f'"{16 * i:x}","{src}","1","32","{n:,}"' for i, (src, n) in enumerate(rows)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def mod(script):
    return script("ncu_source_alu")


def test_counts_alu_rows_per_kernel_with_guards_and_thousands(mod):
    text = section("k2", [("LOP3.LUT R1, R2, 0x3, RZ, 0xc0, !PT", 1000), ("@!P0 SHF.R.U32.HI R3, RZ, 0x4, R5", 24),
                          ("FFMA R1, R2, R3, R4", 500), ("HMMA.16816.F32 R4, R8, R12, RZ", 7)])
    text += section("k4", [("IMAD.MOV.U32 R1, RZ, RZ, R2", 10), ("MOV R1, R2", 5)])
    counts = mod.kernel_counts(text)
    assert counts == {"k2": {"alu": 1024.0, "all": 1531.0}, "k4": {"alu": 5.0, "all": 15.0}}


def test_an_export_without_the_counts_is_refused_by_name(mod):
    text = '"Kernel Name","k"\n"Address","Source","Instructions Executed"\n"0","MOV R1, R2","1"\n'
    with pytest.raises(ValueError, match="no 'Predicated-On Thread Instructions Executed' or 'Source' column"):
        mod.kernel_counts(text)
