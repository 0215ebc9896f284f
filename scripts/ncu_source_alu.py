"""ALU and all instructions per KV element of each kernel in an Nsight Compute source-page export.

`scripts/h200_lab.sh` with PROFILE=<variant> writes `ncu_src_<variant>.csv.gz` (`ncu --import ...
--page source --csv --print-source sass`): a section per profiled kernel, a row per SASS
instruction with its executed counts. Summing the predicated-on thread instructions of the rows
whose opcode `suite.alu.isa` puts in the ALU class gives the thread-level ALU count FOSCAR.md
quotes (what `foscar-bench alu` reads from smsp__thread_inst_executed_pipe_alu_pred_on for a
backend), here for a lab library the suite does not load. The thirty-eighth session's PV-on-wgmma
figures (docs/PERFORMANCE.md) came from this sum.

    python3 scripts/ncu_source_alu.py ncu_src_v47.csv.gz --batch 128 --kv-len 32768 [--kv-heads 8]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_regions import opcode  # noqa: E402  (a SASS line's opcode, its guard stripped)
from suite.alu import isa  # noqa: E402
from suite.alu.ncu import parse_number  # noqa: E402  ('1,234' -> 1234.0; '' -> None)

COUNT = "Predicated-On Thread Instructions Executed"


def read_export(path: Path) -> str:
    """The text of an ncu source-page export, gzipped (.csv.gz) or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return fh.read()


def source_rows(text: str, needed: tuple[str, ...]):
    """(kernel name, {column: index}, row) for each instruction row of the export, sections in
    order; ValueError naming the columns when a section lacks one of `needed`."""
    kernel, cols = None, None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernel, cols = row[1], None
            continue
        if row[0] == "Address":
            cols = {name: i for i, name in enumerate(row)}
            if any(name not in cols for name in needed):
                raise ValueError(f"kernel {kernel!r}: the export has no {' or '.join(map(repr, needed))} column; "
                                 "export it with --page source --csv --print-source sass")
            continue
        if kernel is not None and cols is not None:
            yield kernel, cols, row


def kernel_counts(text: str) -> dict[str, dict[str, float]]:
    """Kernel name -> {'alu': .., 'all': ..}: predicated-on thread instructions of each section."""
    out: dict[str, dict[str, float]] = {}
    for kernel, cols, row in source_rows(text, (COUNT, "Source")):
        n = parse_number(row[cols[COUNT]]) or 0.0
        source = row[cols["Source"]]
        counts = out.setdefault(kernel, {"alu": 0.0, "all": 0.0})
        counts["all"] += n
        if source.strip() and isa.classify(opcode(source)).cls == "alu":
            counts["alu"] += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path, help="ncu source-page CSV (.csv or .csv.gz)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--kv-len", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    counts = kernel_counts(read_export(args.export))
    elements = args.batch * args.kv_len * args.kv_heads * args.head_dim * 2  # K and V
    for kernel, c in counts.items():
        print(f"{c['alu'] / elements:.3f} ALU/elem  {c['all'] / elements:.3f} inst/elem  {kernel}")


if __name__ == "__main__":
    main()
