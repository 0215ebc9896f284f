"""The code a launch runs: bytes of SASS executed at least once, per kernel of an ncu source-page export.

Why: a CTA at batch 1 runs most of its code once (the item's start, one or two trips, the finish,
the split merge), and code that is not in the SM's instruction cache is fetched on the critical
path (scripts/probe_icache.cu: about 45 ns a KB from L2 against hot code on an H100; the cache kept
16 KB of code from launch to launch and not 48 KB). Whether a kernel's executed code fits that
cache is the question this answers from the profile's side; `probe_icache capacity` answers the
cache's side.

`scripts/h200_lab.sh` with PROFILE=<variant> writes `ncu_src_<variant>.csv.gz` (`ncu --import ...
--page source --csv --print-source sass`): a section per profiled kernel, a row per SASS instruction
with "Instructions Executed" (warp-level). Each kernel's executed rows are reported as contiguous
runs of addresses (16 bytes an instruction), with the warp instructions each run executed, so that
the once-run code (few executions per run byte) stands apart from the loops.

    python3 scripts/ncu_footprint.py ncu_src_v47.csv.gz [--runs] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ncu_source_alu import read_export, source_rows  # noqa: E402  (the export's text, its sections and rows)
from suite.alu.ncu import parse_number  # noqa: E402  (on the path through ncu_source_alu)

EXECUTED = "Instructions Executed"
INSTRUCTION_BYTES = 16  # every sm_90 instruction


def kernel_rows(text: str) -> dict[str, list[tuple[int, float]]]:
    """Kernel name -> [(address, warp instructions executed)] in address order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for kernel, cols, row in source_rows(text, (EXECUTED,)):
        n = parse_number(row[cols[EXECUTED]]) or 0.0
        out.setdefault(kernel, []).append((int(row[cols["Address"]], 16), n))
    for rows in out.values():
        rows.sort()
    return out


def footprint(rows: list[tuple[int, float]]) -> dict:
    """The kernel's size, its executed bytes and the executed runs [start, end) as offsets from its
    first instruction, each with the warp instructions it executed and the most any one of its
    instructions executed."""
    if not rows:
        return {"bytes": 0, "executed_bytes": 0, "runs": []}
    base = rows[0][0]
    runs: list[dict] = []
    for addr, n in rows:
        if n <= 0:
            continue
        off = addr - base
        if runs and runs[-1]["end"] == off:
            r = runs[-1]
            r["end"] += INSTRUCTION_BYTES
            r["executed"] += n
            r["max"] = max(r["max"], n)
        else:
            runs.append({"start": off, "end": off + INSTRUCTION_BYTES, "executed": n, "max": n})
    size = rows[-1][0] - base + INSTRUCTION_BYTES
    return {"bytes": size, "executed_bytes": sum(r["end"] - r["start"] for r in runs), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path, help="ncu source-page CSV (.csv or .csv.gz)")
    ap.add_argument("--runs", action="store_true", help="print every executed run, not only the totals")
    ap.add_argument("--json", type=Path, default=None, help="write every kernel's footprint here")
    args = ap.parse_args()
    if not args.export.is_file():
        sys.exit(f"ncu_footprint: {args.export} is not a file; pass the ncu source-page export "
                 "(ncu_src_<variant>.csv.gz from scripts/h200_lab.sh PROFILE=<variant>).")
    kernels = {k: footprint(rows) for k, rows in kernel_rows(read_export(args.export)).items()}
    for name, f in kernels.items():
        print(f"{f['executed_bytes'] / 1024:6.1f} KB executed of {f['bytes'] / 1024:6.1f} KB "
              f"in {len(f['runs'])} runs  {name}")
        if args.runs:
            for r in f["runs"]:
                print(f"    0x{r['start']:05x}-0x{r['end']:05x} {(r['end'] - r['start']) / 1024:5.2f} KB "
                      f"{r['executed']:12.0f} warp inst, at most {r['max']:.0f} an instruction")
    if args.json:
        args.json.write_text(json.dumps(kernels, indent=1))


if __name__ == "__main__":
    main()
