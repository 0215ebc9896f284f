"""The CPU model's error (foscar/precision.py, the H200's Tensor Core accumulation) beside the
H200's, for every mode, both widths and every context length of an accuracy_long.py run.

    PYTHONPATH=. python3 scripts/precision_table.py --h200 docs/data/acc_v5c_b1_h200.json \
        --json docs/data/model_v5_b1.json --markdown

The model runs on the same inputs (foscar.synthetic, the run's seed) for the first --heads KV
heads of sequence 0 (the H200 run covers all 8): a quarter of the work, the same statistics.

    PYTHONPATH=. python3 scripts/precision_table.py --pv-u8 [--lengths 1024 32768 131072]

prints instead the error of PV's probability operand in each form of precision.PV_OPERAND_FORMS
(fp16, unsigned 8-bit integers or 16 bits in two such parts, with E per step or per run, e4m3) against float64 attention, per
width, V mode, data (Gaussian, peaked) and context, and the u8-run int32 accumulators' headroom.

    PYTHONPATH=. python3 scripts/precision_table.py --pv-chains [--lengths 32768 131072]

prints the model's error when each warp's PV products chain on the Tensor Cores before the fp32
fold, token-wise V (K and V token-wise, group 128, two KV heads of sequence 0): one k-step (the
kernels since v23), two (a 32-token trip), or a warp's whole split of n chunks (C = the running
output).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import foscar  # noqa: E402
from foscar import precision, synthetic  # noqa: E402
from foscar.config import QuantConfig  # noqa: E402



def first_heads(batch: int, kv_len: int, seed: int, heads: int):
    """(q, k, v) of sequence 0's first `heads` KV heads in the sweep's data (foscar.synthetic)."""
    inp = synthetic.make_inputs(batch, kv_len, seed=seed)
    ratio = inp.q.shape[1] // inp.k.shape[2]
    return (inp.q[:1, : ratio * heads].contiguous(), inp.k[:1, :, :heads].contiguous(),
            inp.v[:1, :, :heads].contiguous())


def pv_operand_table(lengths: list[int], seed: int = 0) -> None:
    """Markdown tables of precision.pv_operand_errors: relative L2 error of O before / after bf16
    rounding per form, width, V mode, data and context; then u8-run's runs and accumulators."""
    cases = [(data, v_mode, bits) for data in precision.PV_DATA for v_mode in ("token", "channel") for bits in (4, 2)]
    res = {}  # (data, v_mode, bits, kv_len) -> {form: PVOperandResult}
    for kv_len in lengths:
        t0 = time.time()
        for data, v_mode, bits in cases:
            res[(data, v_mode, bits, kv_len)] = precision.pv_operand_errors(kv_len, bits, v_mode, data, seed=seed)
        print(f"  ({kv_len // 1024}K: {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    ctx = " | ".join(f"{n // 1024}K" for n in lengths)
    print("\nRelative L2 error of O against float64 attention over the same dequantized cache, "
          "before / after bf16 rounding of O (gate: 4e-3 after):\n")
    print(f"| data | V | bits | form | {ctx} |")
    print("| --- | --- | --- | --- |" + " --- |" * len(lengths))
    for (data, v_mode, bits), form in itertools.product(cases, precision.PV_OPERAND_FORMS):
        errs = [res[(data, v_mode, bits, n)][form] for n in lengths]
        print(f"| {data} | {v_mode} | INT{bits} | {form} | "
              + " | ".join(f"{r.error:.2e} / {r.error_bf16:.2e}" for r in errs) + " |")
    print("\nu8-run, all 4 query columns: runs / of them started by an overflow / longest run (tokens) / "
          "largest int32 accumulator (codes at the top radix factor):\n")
    print(f"| data | V | bits | {ctx} |")
    print("| --- | --- | --- |" + " --- |" * len(lengths))
    for data, v_mode, bits in cases:
        rs = [res[(data, v_mode, bits, n)]["u8-run"] for n in lengths]
        print(f"| {data} | {v_mode} | INT{bits} | " + " | ".join(
            f"{r.runs} / {r.overflows} / {r.longest_run} / {r.max_acc:.3g}" for r in rs) + " |")
    print("\nint32 headroom (every P~ = 255, every code at its largest): "
          + "; ".join(f"INT{b} {precision.U8_TOP_FACTOR[b] * ((1 << b) - 1)} a byte, "
                      f"{precision.u8_run_headroom(b)} tokens ({precision.u8_run_headroom(b) // 16} steps)"
                      for b in (2, 4)) + f"; int32 max {precision.INT32_MAX}.")


def pv_chain_table(lengths: list[int], seed: int = 0) -> None:
    """Markdown table of precision.model_error with chains of one k-step, two, and a warp's
    split of 42, 171, 512 or 2048 chunks, per width and context."""
    def chained(name: str, plan) -> precision.VArithmetic:
        return precision.VArithmetic(name, centred=False, chains=plan, operand="fp16-subnormal")
    forms = [("1 k-step", precision.CURRENT), ("2 k-steps", chained("2", precision.sequential_chains(32)))]
    forms += [(f"split of {n}", chained(str(n), precision.warp_chains(n))) for n in (42, 171, 512, 2048)]
    print("| context | bits | " + " | ".join(name for name, _ in forms) + " |")
    print("| --- | --- |" + " --- |" * len(forms))
    for kv_len in lengths:
        q, k, v = first_heads(1, kv_len, seed, 2)
        for bits in (4, 2):
            cfg = QuantConfig(bits=bits, group_size=128, k_mode="token", v_mode="token", page_size=128)
            cache = foscar.quantize(k, v, [kv_len], cfg)
            errs = [precision.model_error(q, cache, arith) for _, arith in forms]
            print(f"| {kv_len // 1024}K | INT{bits} | " + " | ".join(f"{e:.2e}" for e in errs) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--h200", type=Path, help="rows written by scripts/accuracy_long.py --json")
    ap.add_argument("--pv-u8", action="store_true",
                    help="print the PV operand forms' table (precision.PV_OPERAND_FORMS) instead; no --h200")
    ap.add_argument("--pv-chains", action="store_true",
                    help="print the error of PV chained over 1, 2 or a split's k-steps instead; no --h200")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 32768, 131072],
                    help="contexts for --pv-u8 and --pv-chains (multiples of 128)")
    ap.add_argument("--seed", type=int, default=0, help="the data's seed for --pv-u8 and --pv-chains")
    ap.add_argument("--heads", type=int, default=2, help="KV heads modelled (of the run's 8)")
    ap.add_argument("--json", type=Path, help="write the modelled rows here")
    ap.add_argument("--markdown", action="store_true", help="print the table for docs/PERFORMANCE.md")
    args = ap.parse_args()
    if args.pv_u8:
        pv_operand_table(args.lengths, args.seed)
        return
    if args.pv_chains:
        pv_chain_table(args.lengths, args.seed)
        return
    if args.h200 is None:
        ap.error("--h200 is required (or --pv-u8, --pv-chains)")

    rows = json.loads(args.h200.read_text())
    ours = [r for r in rows if r["backend"].startswith("foscar")]
    if not ours:
        raise SystemExit(f"{args.h200}: no foscar rows; expected the output of scripts/accuracy_long.py --json.")
    flashinfer = {r["kv_len"]: r["rel_error"] for r in rows if r["backend"] == "flashinfer-bf16-tc"}
    batch, seed = ours[0]["batch"], ours[0]["seed"]
    modes = ("token", "channel")
    configs = {c.tag: c for c in (QuantConfig(bits=b, group_size=128, k_mode=km, v_mode=vm, page_size=128)
                                  for b in (2, 4) for km in modes for vm in modes)}
    modelled = []
    for kv_len in sorted({r["kv_len"] for r in ours}):
        t0 = time.time()
        q, k, v = first_heads(batch, kv_len, seed, args.heads)
        for r in (r for r in ours if r["kv_len"] == kv_len):
            tag = r["mode"]  # QuantConfig.tag, e.g. int4-g128-kc-vt
            cache = foscar.quantize(k, v, [kv_len], configs[tag])
            err = precision.model_error(q, cache, precision.CURRENT)
            modelled.append({"mode": tag, "kv_len": kv_len, "batch": batch, "seed": seed, "heads": args.heads,
                             "model_rel_error": err, "h200_rel_error": r["rel_error"],
                             "flashinfer_rel_error": flashinfer.get(kv_len)})
            print(f"{tag:18s} kv {kv_len:7d}  model {err:.2e}  H200 {r['rel_error']:.2e}  "
                  f"ratio {err / r['rel_error']:.2f}", flush=True)
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(modelled, indent=1) + "\n")
    if args.markdown:
        lens = sorted({m["kv_len"] for m in modelled})
        print("\n| mode | " + " | ".join(f"{n // 1024}K H200 / model" for n in lens) + " |")
        print("| --- |" + " --- |" * len(lens))
        for tag in sorted({m["mode"] for m in modelled}):
            cells = {m["kv_len"]: m for m in modelled if m["mode"] == tag}
            print(f"| {tag} | " + " | ".join(
                f"{cells[n]['h200_rel_error']:.2e} / {cells[n]['model_rel_error']:.2e}" for n in lens) + " |")
        print("| FlashInfer BF16 (tc) | " + " | ".join(
            f"{flashinfer[n]:.2e}" if n in flashinfer else "-" for n in lens) + " |")


if __name__ == "__main__":
    main()
