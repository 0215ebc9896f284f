"""Kernel developer's loop: check and time the FOSCAR kernels at one shape, all modes.

  PYTHONPATH=. python scripts/bench_foscar.py --batch 128 --kv-len 32768 --json $OUT/foscar.json

Correctness is checked on a few sequences against float64 attention over the dequantized
cache before anything is timed. Times are CUDA-event medians of single launches after a
warm-up; the cache is far larger than L2 at the default shape (pass --rotate for small ones).
Bytes come from the cache's own byte count plus Q, O (bf16); the fraction is of the GPU's
datasheet peak (suite.bytes_model). The harness (`foscar-bench sweep`) is the tool for
recorded results; this script is for iterating on a kernel.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

import foscar
from foscar.config import QuantConfig
from foscar.reference import attention_f64
from suite.bytes_model import datasheet_peak_tbps


def time_us(fn, reps: int) -> list[float]:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--kv-len", type=int, default=32768)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--configs", default="4ct,2ct,4ctd,2ctd,4tt,4tc,4cc,2tt,2tc,2cc",
                    help="comma list: bits + k mode + v mode (t/c) [+ d for the dequant ablation]")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    peak_tbps = datasheet_peak_tbps(torch.cuda.get_device_name(0)) or float("nan")
    torch.manual_seed(0)
    B, L, H, D = args.batch, args.kv_len, args.kv_heads, 128
    k = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(B, args.q_heads, D, device="cuda", dtype=torch.bfloat16)
    lens = [L] * B
    check = [0, B // 2, B - 1]
    rows = []
    for spec in args.configs.split(","):
        bits, km, vm, variant = int(spec[0]), spec[1], spec[2], "dequant" if spec.endswith("d") else "fold"
        mode = {"t": "token", "c": "channel"}
        cfg = QuantConfig(bits=bits, group_size=args.group, k_mode=mode[km], v_mode=mode[vm], page_size=args.page)
        cache = foscar.quantize(k, v, lens, cfg)
        row = {"config": cfg.tag, "variant": variant, "batch": B, "kv_len": L}
        try:
            out = torch.full_like(q, float("nan"))
            foscar.decode(q, cache, out=out, variant=variant)
            torch.cuda.synchronize()
            kd, vd = foscar.dequantize(cache, check, dtype=torch.float64)
            ref = attention_f64(q[check], kd, vd, [lens[i] for i in check])
            err = ((out[check].double() - ref).norm() / ref.norm()).item()
            row["rel_error"] = err
            if not (err <= 4e-3 and torch.isfinite(out).all()):
                row["status"] = "incorrect"
            else:
                ts = time_us(lambda: foscar.decode(q, cache, out=out, variant=variant), args.reps)
                nbytes = cache.nbytes()["total"] + 2 * q.numel() * 2
                med = statistics.median(ts)
                row.update(status="passed", median_us=med, p10_us=sorted(ts)[len(ts) // 10],
                           p90_us=sorted(ts)[(9 * len(ts)) // 10], bytes=nbytes,
                           tbps=nbytes / med / 1e6, frac_peak=nbytes / med / 1e6 / peak_tbps,
                           splits=foscar.kernels.launch_plan(cache, torch.cuda.get_device_properties(0).multi_processor_count))
        except Exception as exc:  # noqa: BLE001 - a dev loop reports and goes on
            row.update(status="crashed", reason=str(exc)[:300])
        rows.append(row)
        print(json.dumps(row), flush=True)
        del cache
        torch.cuda.empty_cache()
    print(f"\n{'config':<22}{'variant':<9}{'status':<10}{'us':>9}{'TB/s':>7}{'%peak':>7}{'err':>10}")
    for r in rows:
        print(f"{r['config']:<22}{r['variant']:<9}{r['status']:<10}{r.get('median_us', math.nan):>9.1f}"
              f"{r.get('tbps', math.nan):>7.2f}{100 * r.get('frac_peak', math.nan):>7.1f}{r.get('rel_error', math.nan):>10.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
