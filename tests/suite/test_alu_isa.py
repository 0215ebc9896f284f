"""The opcode -> class/pipe table (suite/alu/isa.py): pinned on SASS snippets, and checked
against per-pipe hardware counters captured on our H200."""
from __future__ import annotations

from pathlib import Path

import pytest

from suite.alu.isa import CLASSES, FORMS, OPCODES, classify
from suite.alu.pipecheck import check, parse_source_csv
from suite.alu.sass import parse_line

DATA = Path(__file__).parent / "data"


def _snippets():
    for line in (DATA / "sass_classify_sm90a.txt").read_text().splitlines():
        if line.startswith("#") or "#" not in line:
            continue
        text, expected = line.rsplit("#", 1)
        yield text, tuple(expected.split())


@pytest.mark.parametrize("line,expected", list(_snippets()), ids=lambda v: str(v)[:40])
def test_snippet_class_and_pipe(line, expected):
    ins = parse_line(line)
    assert ins is not None, line
    assert (ins.info.cls, ins.info.pipe) == expected, ins.mnemonic


def test_every_row_names_a_known_class():
    for name, info in {**OPCODES, **FORMS}.items():
        assert info.cls in CLASSES, name


def test_forms_and_rates():
    assert classify("IMAD.WIDE.U32").half_rate and classify("IMAD.HI.U32").half_rate
    assert not classify("IMAD.MOV.U32").half_rate
    assert classify("HFMA2.MMA.BF16_V2").pipe == "tensor"
    assert classify("HFMA2.BF16_V2").pipe == "fma"
    assert classify("USHF.L.U32").cls == "uniform"
    assert classify("UNEWTHING").cls == "uniform"  # uniform datapath forms not listed
    assert classify("lop3.lut").cls == "alu"  # case-insensitive
    assert classify("FFMA").pipe_group == classify("IMAD").pipe_group == "fma"


@pytest.mark.parametrize("capture", ["zoo", "probe"])
def test_table_matches_h200_pipe_counters(capture):
    """ncu on the H200: per-instruction executed counts summed by this table's pipes equal
    smsp__inst_executed_pipe_* for every kernel of alu_zoo.cu / alu_probe.cu."""
    raw = (DATA / f"ncu_{capture}_pipes_raw.csv").read_text()
    source = (DATA / f"ncu_{capture}_pipes_source.csv").read_text()
    results = check(raw, source)
    assert len(results) == len(parse_source_csv(source)) >= 3
    for res in results:
        assert res.ok, (res.kernel, res.mismatches, res.unknown)
        assert res.measured["alu"] > 0 or res.kernel == "probe_plain"


def test_check_reports_a_wrong_row(monkeypatch):
    """A table that put LOP3 on the FMA pipe would be caught."""
    from suite.alu import isa, pipecheck

    monkeypatch.setitem(isa.OPCODES, "LOP3", isa.OpInfo("fma", "fmaheavy"))
    raw = (DATA / "ncu_zoo_pipes_raw.csv").read_text()
    source = (DATA / "ncu_zoo_pipes_source.csv").read_text()
    bad = {r.kernel: r for r in pipecheck.check(raw, source) if not r.ok}
    assert "zoo_lop3" in bad and set(bad["zoo_lop3"].mismatches) == {"alu", "fma"}
