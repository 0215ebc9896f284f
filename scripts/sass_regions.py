"""Where a kernel's instructions go, by source region: its SASS with line information
(nvdisasm -gi of a -lineinfo build), weighted by Nsight Compute's executed-instruction and
stall-sample counts per SASS address (the source page of a profile) when given.

A region is a call made from the body of a root function, `run_trip` of foscar_consume.cuh by
default (--root FILE:FUNCTION: one trip of the chunk loop), with the frame it calls, e.g.
"foscar_decode.cuh:779 <- foscar_consume.cuh:464": the channel-wise Q~ rebuild called from the
trip. An instruction outside the root is grouped by the call made from `consume` (the frame of
foscar_consume.cuh that is not itself called from foscar_consume.cuh). The printed table names
the source function of each side (from the sources in foscar/csrc). Without a
profile the counts are static: the instructions of the main loop as `foscar-bench alu
--static` finds it (suite.alu.sass, which also parses the listing).

    nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90a -cubin -lineinfo foscar/csrc/foscar_int4.cu -o k.cubin
    nvdisasm -gi k.cubin > k.sass
    python scripts/sass_regions.py k.sass --kernel 'foscar_decode_kernelILi4ELi128ELb1ELb0ELb0ELi2E' \\
        [--ncu-src ncu_src_v9.csv.gz] [--top 30]

-lineinfo does not change the generated code; the script checks that the profile's opcodes
match the disassembly address for address and refuses a profile of another build.

--live adds each region's live registers (the most and the mean over its instructions) from
nvdisasm's life ranges of the same cubin, and the loop's peak with the instructions at it: where
the consumer's register budget goes (docs/PERFORMANCE.md, the next session's list).

    nvdisasm -plr -lrm count k.cubin > k.live
    python scripts/sass_regions.py k.sass --kernel ... --live k.live
"""
from __future__ import annotations

import argparse
import collections
import csv
import functools
import gzip
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from suite.alu import sass  # noqa: E402  (the SASS parser and loop finder of `foscar-bench alu`)

_LOC = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
_FUNC = re.compile(r"^\s*\.text\.(\S+?):\s*$")  # nvdisasm's label line of a function


@dataclass
class Located:
    """A SASS instruction (suite.alu.sass) with its chain of source frames, innermost first."""
    ins: sass.Instruction
    frames: list[str]

    @property
    def addr(self) -> int:
        return self.ins.addr

    @property
    def opcode(self) -> str:  # with its modifiers: 'LOP3.LUT'
        return self.ins.mnemonic


def opcode(text: str) -> str:
    """The opcode of a SASS line, without its guard predicate: '@!P0 BRA 0x10' -> 'BRA'."""
    return re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split()[0]


CSRC = Path(__file__).resolve().parents[1] / "foscar" / "csrc"
_DEF = re.compile(r"^(\s*)(?:template\s*<.*>\s*)?(?:static\s+)?(?:__host__\s+)?__device__\b[^;{]*?\b(\w+)\s*\(")
_STRUCT = re.compile(r"^(?:template\s*<.*>\s*)?struct\s+(\w+)")


@dataclass(frozen=True)
class Root:
    """The lines of one function's body: a region is a call made from inside them."""
    file: str
    first: int
    last: int

    def holds(self, frame: str) -> bool:
        file, _, line = frame.rpartition(":")
        return file == self.file and self.first < int(line) <= self.last


@functools.lru_cache(maxsize=None)
def _source(file: str) -> tuple[str, ...]:
    """The lines of foscar/csrc/`file`, read once."""
    return tuple((CSRC / file).read_text().splitlines())


@functools.lru_cache(maxsize=None)
def _defs(file: str) -> list[tuple[int, str, int]]:
    """(line, qualified name, indent) of every __device__ function defined in foscar/csrc/`file`."""
    out, struct = [], None
    for n, text in enumerate(_source(file), 1):
        if m := _STRUCT.match(text):
            struct = m.group(1)
        elif m := _DEF.match(text):
            indent = len(m.group(1))
            out.append((n, f"{struct}::{m.group(2)}" if indent and struct else m.group(2), indent))
    return out


def find_root(spec: str) -> Root:
    """FILE:FUNCTION -> the lines from the function's definition to its closing brace."""
    file, _, name = spec.partition(":")
    if not (CSRC / file).is_file() or not name:
        raise SystemExit(f"--root {spec!r}: expected FILE:FUNCTION with FILE in {CSRC}, e.g. foscar_consume.cuh:run_trip")
    lines = _source(file)
    for n, qual, indent in _defs(file):
        if qual == name or qual.endswith(f"::{name}"):
            end = next(i for i in range(n, len(lines) + 1) if lines[i - 1] == " " * indent + "}")
            return Root(file, n, end)
    raise SystemExit(f"--root {spec!r}: no __device__ function {name!r} in {file}")


def function_at(frame: str) -> str:
    """The source function a frame 'file:line' lies in ('?' where the file is not ours)."""
    file, _, line = frame.rpartition(":")
    if not (CSRC / file).is_file():
        return "?"
    before = [qual for n, qual, _ in _defs(file) if n <= int(line)]
    return before[-1] if before else "?"


def _frames(disasm: str, name: str) -> dict[int, list[str]]:
    """Address -> source frames of function `name`: each run of `//## File` lines names the
    frames of the instructions after it, innermost first."""
    out: dict[int, list[str]] = {}
    inside, block, frames = False, [], []
    for line in disasm.splitlines():
        if m := _FUNC.match(line):
            inside = m.group(1) == name
            continue
        if not inside:
            continue
        if m := _LOC.match(line):
            block.append(f"{Path(m.group(1)).name}:{m.group(2)}")
        elif (ins := sass.parse_line(line)) is not None:
            if block:
                frames, block = block, []
            out[ins.addr] = frames
    return out


def find_function(disasm: str, kernel: str) -> sass.Function:
    """The one function whose mangled name contains `kernel`."""
    funcs = sass.parse_sass(disasm)
    hits = [f for f in funcs if kernel in f.name]
    if len(hits) != 1:
        raise SystemExit(f"--kernel {kernel!r} matches {len(hits)} of the {len(funcs)} functions "
                         f"(e.g. {[f.name for f in funcs[:3]]}); give a substring of exactly one mangled name.")
    return hits[0]


def parse(disasm: str, kernel: str, function: sass.Function | None = None) -> list[Located]:
    """The instructions of the one function whose mangled name contains `kernel` (or of
    `function`, found already)."""
    fn = function or find_function(disasm, kernel)
    frames = _frames(disasm, fn.name)
    return [Located(i, frames.get(i.addr, [])) for i in fn.instructions]


_LIVE_FUNC = re.compile(r"^\s*\.text\.(\S+?):")  # the label line, with the life-range columns after it
_LIVE_ROW = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/.*;.*//\s*\|\s*(\d+)\s*\|")


def read_live(text: str, name: str) -> dict[int, int]:
    """Address -> live general registers before the instruction, from `nvdisasm -plr -lrm count`
    (its first life-range column) for function `name`."""
    out: dict[int, int] = {}
    inside = False
    for line in text.splitlines():
        if m := _LIVE_FUNC.match(line):
            inside = m.group(1) == name
            continue
        if inside and (m := _LIVE_ROW.match(line)):
            out[int(m.group(1), 16)] = int(m.group(2))
    if not out:
        raise SystemExit(f"no life ranges of {name} in the --live file: give `nvdisasm -plr -lrm count` of the same cubin")
    return out


def live_by_region(ins: list[Located], live: dict[int, int], root: Root | None = None) -> dict[str, tuple[int, float]]:
    """Region -> (most, mean) live registers over its instructions."""
    per: dict[str, list[int]] = collections.defaultdict(list)
    for x in ins:
        if x.addr not in live:
            raise SystemExit(f"the --live file has no instruction at {x.addr:#x}: it is of another build")
        per[region(x.frames, root)].append(live[x.addr])
    return {k: (max(v), sum(v) / len(v)) for k, v in per.items()}


def chunk_loop(ins: list[Located]) -> tuple[int, int]:
    """Index range of the main loop as `foscar-bench alu --static` picks it (suite.alu.sass)."""
    loop = sass.main_loop(sass.Function("kernel", None, [x.ins for x in ins]))
    if loop is None:
        raise SystemExit("no loop in this function")
    index = [x.addr for x in ins]
    return index.index(loop.start), index.index(loop.end)


def region(frames: list[str], root: Root | None = None) -> str:
    if root is not None:
        for i in range(len(frames) - 1):
            if root.holds(frames[i + 1]):
                return f"{frames[i]} <- {frames[i + 1]}"
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


def tabulate(ins: list[Located], weights: dict[int, tuple[int, int, str]] | None, root: Root | None = None) -> list[dict]:
    count: collections.Counter = collections.Counter()
    stall: collections.Counter = collections.Counter()
    ops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for x in ins:
        n, st = (weights[x.addr][0], weights[x.addr][1]) if weights is not None else (1, 0)
        key = region(x.frames, root)
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
    ap.add_argument("--live", type=Path, help="nvdisasm -plr -lrm count output of the same cubin")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--root", default="foscar_consume.cuh:run_trip",
                    help="FILE:FUNCTION whose calls are the regions (default: one trip of the chunk loop)")
    args = ap.parse_args(argv)
    root = find_root(args.root)
    disasm = args.disasm.read_text()
    fn = find_function(disasm, args.kernel)
    ins = parse(disasm, args.kernel, fn)
    live = read_live(args.live.read_text(), fn.name) if args.live else None
    loop = None
    if not args.ncu_src or live is not None:
        lo, hi = chunk_loop(ins)
        loop = ins[lo:hi + 1]
    weights = None
    if args.ncu_src:
        _, weights = read_profile(args.ncu_src)
        bad = [x for x in ins if x.addr not in weights or opcode(weights[x.addr][2]) != x.opcode]
        if bad:  # (the profile also lists the padding after the last EXIT, which the parser drops)
            raise SystemExit(f"{args.ncu_src} is a profile of another build: {len(weights)} SASS rows against "
                             f"{len(ins)} instructions, {len(bad)} opcodes differ")
        what = "executed warp instructions, whole kernel"
    else:
        ins = loop
        what = f"static instructions of the chunk loop {ins[0].addr:#x}..{ins[-1].addr:#x}"
    rows = tabulate(ins, weights, root)
    total = sum(r["count"] for r in rows)
    print(f"{what}: {total:,}")
    regs = live_by_region(ins, live, root) if live is not None else {}
    for r in rows[:args.top]:
        stall = f"  stalls {100 * r['stall_share']:5.1f}%" if weights is not None else ""
        lv = f"  live {regs[r['region']][0]:3d} max {regs[r['region']][1]:5.1f} mean" if regs else ""
        names = " <- ".join(function_at(f) for f in r["region"].split(" <- "))
        print(f"{r['count']:>13,} {100 * r['share']:5.1f}%{stall}{lv}  {r['region']:50s} {names:40s} {r['opcodes']}")
    if live is not None:
        peak = max(live[x.addr] for x in loop)
        at = [x for x in loop if live[x.addr] >= peak - 1]
        print(f"chunk loop {loop[0].addr:#x}..{loop[-1].addr:#x}: {min(live[x.addr] for x in loop)}-{peak} live registers; "
              f"the function's most {max(live.values())}. At the loop's peak (within 1), by region:")
        for k, n in collections.Counter(region(x.frames, root) for x in at).most_common(6):
            print(f"{n:>6}  {k}")


if __name__ == "__main__":
    main(sys.argv[1:])
