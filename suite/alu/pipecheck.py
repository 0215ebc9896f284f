"""Checks suite/alu/isa.py against the hardware: ncu's source page gives how many times each
SASS instruction of a kernel executed (warp level); summing those counts by the table's
pipe must reproduce ncu's per-pipe counters (smsp__inst_executed_pipe_*) exactly.

On a GPU box, for any program:
    ncu --metrics <pipe counters> --csv --page raw --print-units base ./prog > raw.csv
    ncu --section SourceCounters --csv --page source --print-source sass ./prog > source.csv
then `check(raw_text, source_text)`. tests/suite/data/ncu_zoo_*.csv hold such a capture
from our H200 (tests/suite/data/alu_zoo.cu: one kernel per opcode in question).
"""
from __future__ import annotations

import collections
import csv
import io
import re
from dataclasses import dataclass

from suite.alu.isa import classify
from suite.alu.ncu import parse_csv, parse_number

CHECKED_PIPES = ("alu", "fma", "xu", "lsu", "adu", "cbu", "uniform", "tensor", "tma", "fp64")
_PRED = re.compile(r"^@!?U?P[T0-9]+\s+")


def parse_source_csv(text: str) -> dict[str, list[tuple[str, float]]]:
    """Kernel name -> [(mnemonic, warp instructions executed)] from `--page source --csv
    --print-source sass`. A kernel printed more than once keeps its first listing."""
    out: dict[str, list[tuple[str, float]]] = {}
    kernel, header, keep = None, None, False
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name" and len(row) > 1:
            kernel, header = row[1], None
            keep = kernel not in out
            if keep:
                out[kernel] = []
        elif row[0] == "Address":
            header = {name: i for i, name in enumerate(row)}
        elif header and keep and kernel and row[0].startswith("0x"):
            src = _PRED.sub("", row[header["Source"]].strip())
            if not src:
                continue
            mnemonic = src.split()[0].rstrip(";")
            count = parse_number(row[header["Instructions Executed"]]) or 0.0
            out[kernel].append((mnemonic, count))
    return out


@dataclass
class PipeCheck:
    kernel: str
    predicted: dict[str, float]
    measured: dict[str, float]
    unknown: dict[str, float]

    @property
    def mismatches(self) -> dict[str, tuple[float, float]]:
        return {p: (self.predicted.get(p, 0.0), m) for p, m in self.measured.items()
                if abs(self.predicted.get(p, 0.0) - m) > 0.5}

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.unknown


def check(raw_text: str, source_text: str) -> list[PipeCheck]:
    """One PipeCheck per kernel present in both captures (first launch of each)."""
    source = parse_source_csv(source_text)
    results, seen = [], set()
    for row in parse_csv(raw_text):
        if row.kernel in seen or row.kernel not in source:
            continue
        seen.add(row.kernel)
        predicted: collections.Counter = collections.Counter()
        unknown: collections.Counter = collections.Counter()
        for mnemonic, count in source[row.kernel]:
            info = classify(mnemonic)
            predicted[info.pipe_group] += count
            if info.pipe == "unknown":
                unknown[mnemonic] += count
        measured = {}
        for pipe in CHECKED_PIPES:
            value = row.values.get(f"smsp__inst_executed_pipe_{pipe}.sum")
            if value is not None:
                measured[pipe] = value
        results.append(PipeCheck(row.kernel, dict(predicted), measured, dict(unknown)))
    return results
