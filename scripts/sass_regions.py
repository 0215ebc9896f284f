"""Where a kernel's instructions go, by source region: its SASS with line information
(nvdisasm -gi of a -lineinfo build), weighted by Nsight Compute's executed-instruction and
stall-sample counts per SASS address (the source page of a profile) when given.

A region is the call made from `consume` (the frame of foscar_consume.cuh that is not itself
called from foscar_consume.cuh) with the frame it calls, e.g. "foscar_decode.cuh:688 <-
foscar_consume.cuh:543": the channel-wise Q~ rebuild called from the chunk loop. Without a
profile the counts are static: the instructions of the innermost loop that holds both the
wgmma wait and an MMA (the chunk loop).

    nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90a -cubin -lineinfo foscar/csrc/foscar_int4.cu -o k.cubin
    nvdisasm -gi k.cubin > k.sass
    python scripts/sass_regions.py k.sass --kernel 'foscar_decode_kernelILi4ELi128ELb1ELb0ELb0ELi2E' \\
        [--ncu-src ncu_src_v9.csv.gz] [--top 30]

-lineinfo does not change the generated code; the script checks that the profile's opcodes
match the disassembly address for address and refuses a profile of another build.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_LOC = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
_INS = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA\S*.*?`\((\.L_x_\d+)\)")


@dataclass
class Instruction:
    addr: int
    text: str
    frames: list[str] = field(default_factory=list)  # innermost first: "file:line"

    @property
    def opcode(self) -> str:
        return opcode(self.text)


def opcode(text: str) -> str:
    """The opcode of a SASS line, without its guard predicate: '@!P0 BRA 0x10' -> 'BRA'."""
    return re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split()[0]


def parse(disasm: str, kernel: str) -> list[Instruction]:
    """The instructions of the one function whose mangled name contains `kernel`."""
    lines = disasm.split("\n")
    heads = [i for i, l in enumerate(lines) if l.startswith("//--------------------- .text.") and kernel in l]
    if len(heads) != 1:
        names = [l.split(".text.")[1].split()[0] for l in lines if l.startswith("//--------------------- .text.")]
        raise SystemExit(f"--kernel {kernel!r} matches {len(heads)} of the {len(names)} functions "
                         f"(e.g. {names[:3]}); give a substring of exactly one mangled name.")
    start = heads[0]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("//--------------------- .")), len(lines))
    out: list[Instruction] = []
    block: list[str] = []
    frames: list[str] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    for line in lines[start:end]:
        if m := _LABEL.match(line):
            pending.append(m.group(1))
            continue
        if m := _LOC.match(line):  # a run of these lines: the innermost frame first
            block.append(f"{Path(m.group(1)).name}:{m.group(2)}")
            continue
        if m := _INS.match(line):
            if block:
                frames, block = block, []
            out.append(Instruction(int(m.group(1), 16), m.group(2).strip(), frames))
            for p in pending:
                labels[p] = out[-1].addr
            pending = []
    for ins in out:  # resolve branch targets to addresses for loop finding
        if m := _BRANCH.search(ins.text):
            ins.text = ins.text.replace(f"`({m.group(1)})", f"{labels.get(m.group(1), -1):#x}")
    return out


def chunk_loop(ins: list[Instruction]) -> tuple[int, int]:
    """Index range of the innermost backward-branch loop holding a wgmma wait and an MMA."""
    index = {x.addr: i for i, x in enumerate(ins)}
    best = None
    for i, x in enumerate(ins):
        m = re.search(r"BRA\S*.*?(0x[0-9a-f]+)", x.text)
        if not m or int(m.group(1), 16) not in index or int(m.group(1), 16) >= x.addr:
            continue
        lo = index[int(m.group(1), 16)]
        body = ins[lo:i + 1]
        if any("WARPGROUP.DEPBAR" in y.text for y in body) and any("MMA" in y.opcode for y in body):
            if best is None or i - lo < best[1] - best[0]:
                best = (lo, i)
    if best is None:
        raise SystemExit("no loop with a wgmma wait and an MMA in this function")
    return best


def region(frames: list[str]) -> str:
    for i, f in enumerate(frames):
        if f.startswith("foscar_consume.cuh:") and (i + 1 == len(frames) or not frames[i + 1].startswith("foscar_consume.cuh:")):
            return " <- ".join(frames[max(0, i - 1):i + 1])
    return " <- ".join(frames[:2]) or "?"


def read_profile(path: Path) -> tuple[list[str], dict[int, tuple[int, int, str]]]:
    """ncu --page source --csv --print-source sass: offset -> (executed, stall samples, text)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    col = {h: i for i, h in enumerate(rows[at])}
    data = [r for r in rows[at + 1:] if r and r[0].startswith("0x")]
    if not data:
        raise SystemExit(f"{path}: no SASS rows")
    base = int(data[0][0], 16)
    names = [r[1] for r in rows[:at] if r and r[0] == "Kernel Name"]
    return names, {int(r[0], 16) - base: (int(r[col["Instructions Executed"]] or 0),
                                          int(r[col["Warp Stall Sampling (All Samples)"]] or 0), r[1].strip())
                   for r in data}


def tabulate(ins: list[Instruction], weights: dict[int, tuple[int, int, str]] | None) -> list[dict]:
    count: collections.Counter = collections.Counter()
    stall: collections.Counter = collections.Counter()
    ops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for x in ins:
        n, st = (weights[x.addr][0], weights[x.addr][1]) if weights is not None else (1, 0)
        key = region(x.frames)
        count[key] += n
        stall[key] += st
        ops[key][x.opcode] += n
    total, total_stall = sum(count.values()) or 1, sum(stall.values()) or 1
    return [{"region": k, "count": n, "share": n / total, "stall_share": stall[k] / total_stall,
             "opcodes": dict(ops[k].most_common(4))} for k, n in count.most_common()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("disasm", type=Path, help="nvdisasm -gi output of a -lineinfo cubin")
    ap.add_argument("--kernel", required=True, help="substring of one mangled function name")
    ap.add_argument("--ncu-src", type=Path, help="ncu source page (csv or csv.gz) of the same build")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    ins = parse(args.disasm.read_text(), args.kernel)
    weights = None
    if args.ncu_src:
        _, weights = read_profile(args.ncu_src)
        bad = [x for x in ins if x.addr not in weights or opcode(weights[x.addr][2]) != x.opcode]
        if len(weights) != len(ins) or bad:
            raise SystemExit(f"{args.ncu_src} is a profile of another build: {len(weights)} SASS rows against "
                             f"{len(ins)} instructions, {len(bad)} opcodes differ")
        what = "executed warp instructions, whole kernel"
    else:
        lo, hi = chunk_loop(ins)
        ins = ins[lo:hi + 1]
        what = f"static instructions of the chunk loop {ins[0].addr:#x}..{ins[-1].addr:#x}"
    rows = tabulate(ins, weights)
    total = sum(r["count"] for r in rows)
    print(f"{what}: {total:,}")
    for r in rows[:args.top]:
        stall = f"  stalls {100 * r['stall_share']:5.1f}%" if weights is not None else ""
        print(f"{r['count']:>13,} {100 * r['share']:5.1f}%{stall}  {r['region']:50s} {r['opcodes']}")


if __name__ == "__main__":
    main(sys.argv[1:])
