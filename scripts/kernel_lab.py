"""Kernel experiments: build several variants of libfoscar (kernel knobs as -D flags), check
each against float64 attention, then time them interleaved on the same caches.

  PYTHONPATH=. python scripts/kernel_lab.py \
      --variant v4= --variant cp=FOSCAR_BULK=0 --variant w12=FOSCAR_WARPS_INT2=12 \
      --configs 4ct,2ct --json $OUT/lab.json

A variant is NAME=KNOB[,KNOB...] where each KNOB is FOSCAR_NAME=VALUE (foscar_decode.cuh).
`--profile NAME` runs one launch of that variant per config inside the NVTX range
`lab_<config>` for `ncu --nvtx --nvtx-include 'lab_4ct/'` and skips timing.

Timing: CUDA events around `--reps` launches back to back (their mean is one sample), after
a warm-up; the variants take turns in rounds so that clock drift hits all of them alike;
median and the 10th/90th percentiles over the rounds. The caches are GBs at the default
shape, far past the 60 MB L2, so every launch reads HBM; for small shapes pass --rotate N to
cycle through N copies of the cache.
A variant whose output disagrees with the reference (or leaves an element unwritten) is
reported as wrong and not timed.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import foscar
from foscar import kernels
from foscar.build import build
from foscar.config import QuantConfig
from foscar.reference import attention_f64
from core.bytes_model import datasheet_peak_tbps

TOLERANCE = 4e-3
MODES = {"t": "token", "c": "channel"}


def parse_variant(spec: str) -> tuple[str, tuple[str, ...]]:
    name, _, knobs = spec.partition("=")
    if not name:
        raise SystemExit(f"--variant {spec!r}: expected NAME=KNOB[,KNOB...] (knobs may be empty)")
    return name, tuple(f"-D{k}" for k in knobs.split(",") if k)


def parse_config(spec: str, group: int, page: int) -> tuple[QuantConfig, str]:
    if len(spec) < 3 or spec[0] not in "24" or spec[1] not in MODES or spec[2] not in MODES:
        raise SystemExit(f"--configs entry {spec!r}: expected bits + K mode + V mode, e.g. 4ct")
    variant = "dequant" if spec.endswith("d") else "fold"
    cfg = QuantConfig(bits=int(spec[0]), group_size=group, k_mode=MODES[spec[1]], v_mode=MODES[spec[2]],
                      page_size=page)
    return cfg, variant


def check(q, cache, lens, lib, variant) -> float:
    out = torch.full_like(q, float("nan"))
    kernels.decode(q, cache, out=out, variant=variant, library=lib)
    torch.cuda.synchronize()
    if not torch.isfinite(out).all():
        return math.inf
    rows = sorted({0, len(lens) // 2, len(lens) - 1})
    kd, vd = foscar.dequantize(cache, rows, dtype=torch.float64)
    ref = attention_f64(q[rows], kd, vd, [lens[i] for i in rows])
    return ((out[rows].double() - ref).norm() / ref.norm()).item()


def time_batch(fns) -> float:
    """Mean microseconds per launch of `fns` run back to back between two events: the host
    enqueues faster than the GPU drains, so no launch overhead sits inside the interval."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for fn in fns:
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / len(fns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[], help="NAME=KNOB[,KNOB...]")
    ap.add_argument("--configs", default="4ct,2ct")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--kv-len", type=int, default=32768)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5, help="launches per sample")
    ap.add_argument("--rotate", type=int, default=1, help="cache copies to cycle through (small shapes)")
    ap.add_argument("--profile", default=None, help="variant to run once per config for ncu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in (args.variant or ["base="])]
    if args.profile:
        variants = [v for v in variants if v[0] == args.profile]
        if not variants:
            raise SystemExit(f"--profile {args.profile!r} names no --variant")

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=len(variants)) as pool:  # builds in parallel, then loads from the cache
        builds = list(pool.map(lambda v: build("sm_90a", defines=v[1]), variants))
    libs = {name: kernels.load_library("sm_90a", defines) for name, defines in variants}
    for (name, defines), res in zip(variants, builds):
        hot = [r for r in res.resources if "decode_kernel" in r.name]
        regs = sorted({r.registers for r in hot})
        spills = sum(r.spill_store_bytes + r.spill_load_bytes for r in hot)
        print(f"built {name} {' '.join(defines) or '(defaults)'}: registers {regs}, spill bytes {spills}, "
              f"warps/CTA int4 {libs[name].foscar_warps_per_cta(4)} int2 {libs[name].foscar_warps_per_cta(2)}",
              flush=True)
    print(f"builds: {time.time() - t0:.0f} s", flush=True)

    peak = datasheet_peak_tbps(torch.cuda.get_device_name(0)) or float("nan")
    torch.manual_seed(0)
    B, L, D = args.batch, args.kv_len, 128
    q = torch.randn(B, args.q_heads, D, device="cuda", dtype=torch.bfloat16)
    lens = [L] * B
    rows = []
    kv = None
    for spec in args.configs.split(","):
        cfg, kvariant = parse_config(spec, args.group, args.page)
        if kv is None:
            kv = (torch.randn(B, L, args.kv_heads, D, device="cuda", dtype=torch.bfloat16),
                  torch.randn(B, L, args.kv_heads, D, device="cuda", dtype=torch.bfloat16))
        caches = [foscar.quantize(kv[0], kv[1], lens, cfg, shuffle_pages=True, seed=i) for i in range(args.rotate)]
        nbytes = caches[0].nbytes()["total"] + 2 * q.numel() * 2
        ok = {}
        for name, _ in variants:
            row = {"config": spec, "tag": cfg.tag, "variant": name, "batch": B, "kv_len": L, "bytes": nbytes}
            rows.append(row)
            try:
                err = check(q, caches[0], lens, libs[name], kvariant)
            except Exception as exc:  # noqa: BLE001 - one broken variant must not end the run
                row.update(status="crashed", reason=f"{type(exc).__name__}: {exc}"[:300])
                print(f"{spec} {name}: CRASHED: {row['reason']}", flush=True)
                continue
            row["rel_error"] = err
            if err <= TOLERANCE:
                ok[name] = row
            else:
                row["status"] = "incorrect"
                print(f"{spec} {name}: WRONG, relative error {err:.3e}; not timed", flush=True)
        out = torch.empty_like(q)
        if args.profile:
            for name in ok:
                fn = lambda: kernels.decode(q, caches[0], out=out, variant=kvariant, library=libs[name])  # noqa: E731
                fn(), fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push(f"lab_{spec}")
                fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
                print(f"profiled {spec} {name}", flush=True)
            del caches
            continue
        samples = {name: [] for name in ok}
        for name in ok:  # warm-up
            for c in caches[:2]:
                kernels.decode(q, c, out=out, variant=kvariant, library=libs[name])
        torch.cuda.synchronize()

        def launcher(name, c):
            return lambda: kernels.decode(q, c, out=out, variant=kvariant, library=libs[name])

        for r in range(args.rounds):
            for name in ok:
                fns = [launcher(name, caches[(r * args.reps + j) % len(caches)]) for j in range(args.reps)]
                samples[name].append(time_batch(fns))
        for name, row in ok.items():
            ts = sorted(samples[name])
            med = statistics.median(ts)
            row.update(status="passed", median_us=med, p10_us=ts[len(ts) // 10], p90_us=ts[(9 * len(ts)) // 10],
                       n=len(ts), tbps=nbytes / med / 1e6, frac_peak=nbytes / med / 1e6 / peak)
            print(json.dumps(row), flush=True)
        del caches
        torch.cuda.empty_cache()
    if not args.profile:
        print(f"\n{'config':<7}{'variant':<12}{'status':<10}{'us':>9}{'p10':>9}{'p90':>9}{'TB/s':>7}{'%peak':>7}{'err':>10}")
        for r in rows:
            print(f"{r['config']:<7}{r['variant']:<12}{r.get('status', ''):<10}{r.get('median_us', math.nan):>9.1f}"
                  f"{r.get('p10_us', math.nan):>9.1f}{r.get('p90_us', math.nan):>9.1f}{r.get('tbps', math.nan):>7.2f}"
                  f"{100 * r.get('frac_peak', math.nan):>7.1f}{r.get('rel_error', math.nan):>10.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"variants": {n: list(d) for n, d in variants}, "rows": rows, "peak_tbps": peak}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
