"""scripts/ncu_footprint.py: the SASS a launch executed, per kernel of an ncu source-page export, as
contiguous runs of executed addresses."""
from __future__ import annotations

import pytest

HEADER = '"Address","Source","Instructions Executed"'


def section(kernel: str, base: int, counts: list[int]) -> str:
    lines = [f'"Kernel Name","{kernel}"', HEADER]
    lines += [f'"0x{base + 16 * i:x}","NOP","{n:,}"' for i, n in enumerate(counts)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def mod(script):
    return script("ncu_footprint")


def test_runs_split_at_unexecuted_instructions(mod):
    text = section("k", 0x7F00_0000_0F00, [4, 4, 0, 0, 1200, 1, 0, 2])
    f = mod.footprint(mod.kernel_rows(text)["k"])
    assert f["bytes"] == 8 * 16 and f["executed_bytes"] == 5 * 16
    assert [(r["start"], r["end"], r["executed"], r["max"]) for r in f["runs"]] == [
        (0x00, 0x20, 8.0, 4.0), (0x40, 0x60, 1201.0, 1200.0), (0x70, 0x80, 2.0, 2.0)]


def test_kernels_apart_and_rows_in_address_order(mod):
    text = section("a", 0x1000, [1, 1]) + section("b", 0x2000, [0, 3, 3])
    rows = mod.kernel_rows(text)
    rows["a"].reverse()  # footprint sorts nothing itself: kernel_rows hands them sorted
    assert [f["executed_bytes"] for f in (mod.footprint(sorted(rows["a"])), mod.footprint(rows["b"]))] == [32, 32]
    assert mod.footprint(rows["b"])["runs"][0]["start"] == 16


def test_an_export_without_the_counts_is_refused_by_name(mod):
    text = '"Kernel Name","k"\n"Address","Source"\n"0x0","MOV R1, R2"\n'
    with pytest.raises(ValueError, match="no 'Instructions Executed' column"):
        mod.kernel_rows(text)
