"""Where a small decode's fixed cost goes: our kernel and a plain read of as many bytes, each
timed three ways (suite.timing.time_gpu, CUDA graphs):

- warm:   one copy of the inputs, read again and again: code and data stay in L2;
- rotate: enough copies (distinct sequences of one cache) that the data is read from DRAM,
          while the kernel's code, run every sample, stays in L2;
- flush:  one copy, 2 x L2 read through the cache before each sample: code and data cold
          (the sweep's policy where rotation would need more than 32 copies: batch 1 at 4K).

flush - rotate is then what a cold start of the code costs (the instruction fetches from
DRAM), beside what the same costs a small read kernel; rotate - warm is the data's DRAM
latency. Batch 1, Llama-3-8B heads, INT4 and INT2, K channel-wise / V token-wise, group 128.

    PYTHONPATH=. python3 scripts/probe_fixed_cost.py --kv-len 128,4096 --json $OUT/fixed_cost.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math


def parse_lens(text: str) -> list[int]:
    try:
        lens = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"--kv-len {text!r}: expected a comma list of token counts, e.g. 128,4096") from None
    if not lens or any(n < 1 for n in lens):
        raise SystemExit(f"--kv-len {text!r}: token counts must be >= 1")
    return lens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv-len", default="128,4096")
    ap.add_argument("--bits", default="4,2")
    ap.add_argument("--max-copies", type=int, default=2048)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lens = parse_lens(args.kv_len)
    bits_list = [int(b) for b in args.bits.split(",")]

    import torch

    import foscar
    from foscar import kernels
    from suite.timing import StopRule, l2_flush, time_gpu

    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    rule = StopRule(target_spread=0.01, min_samples=40, min_time_s=0.0, max_time_s=1.0)
    flush = l2_flush(2 * l2, dev)
    hq, hkv, d = 32, 8, 128
    rows = []

    def timed(label, runs, use_flush):
        t, _ = time_gpu(runs, l2_policy=label, flush=flush if use_flush else None, rule=rule)
        return round(t.median_us, 2), round(t.p10_us, 2), round(t.p90_us, 2)

    for bits in bits_list:
        for n in lens:
            config = foscar.QuantConfig(bits=bits, group_size=128, k_mode="channel", v_mode="token", page_size=128)
            one = _cache_bytes(config, n, hq, hkv, d)
            copies = max(1, min(args.max_copies, math.ceil(4 * l2 / one)))
            gen = torch.Generator(device=dev).manual_seed(0)
            k = torch.randn(copies, n, hkv, d, device=dev, generator=gen).to(torch.bfloat16)
            v = torch.randn(copies, n, hkv, d, device=dev, generator=gen).to(torch.bfloat16)
            cache = foscar.quantize(k, v, [n] * copies, config)
            del k, v
            q = torch.randn(copies, hq, d, device=dev, generator=gen).to(torch.bfloat16)
            outs = torch.empty_like(q)

            def view(i):  # sequence i of the cache as a batch of one
                return dataclasses.replace(cache, page_table=cache.page_table[i:i + 1], seq_lens=cache.seq_lens[i:i + 1],
                                           tail_lens=cache.tail_lens[i:i + 1], k_tail=cache.k_tail[i:i + 1],
                                           v_tail=cache.v_tail[i:i + 1], free_pages=[])

            views = [view(i) for i in range(copies)]

            def thunk(i):
                c, qi, oi = views[i], q[i:i + 1], outs[i:i + 1]
                return lambda: kernels.decode(qi, c, out=oi)

            ours = [thunk(i) for i in range(copies)]
            buf = torch.ones(copies * max(1, one // 4), dtype=torch.int32, device=dev).view(copies, -1)
            sink = torch.empty((), dtype=torch.int64, device=dev)
            reads = [(lambda i=i: torch.sum(buf[i], dim=0, out=sink)) for i in range(copies)]
            row = {"bits": bits, "kv_len": n, "bytes_per_copy": one, "copies": copies}
            for name, runs in (("ours", ours), ("read", reads)):
                row[f"{name}_warm"] = timed("warm", runs[:1], False)
                row[f"{name}_rotate"] = timed(f"rotate:{copies}", runs, False)
                row[f"{name}_flush"] = timed("flush", runs[:1], True)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del cache, views, ours, reads, buf
            torch.cuda.empty_cache()
    print(f"{'bits':>4} {'KV':>6} {'bytes':>9} {'copies':>6} | ours warm / rotate / flush (us) | read warm / rotate / flush")
    for r in rows:
        o = " / ".join(f"{r[f'ours_{m}'][0]:.2f}" for m in ("warm", "rotate", "flush"))
        s = " / ".join(f"{r[f'read_{m}'][0]:.2f}" for m in ("warm", "rotate", "flush"))
        print(f"{r['bits']:>4} {r['kv_len']:>6} {r['bytes_per_copy']:>9} {r['copies']:>6} | {o} | {s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"l2_bytes": l2, "rows": rows}, f, indent=1)
    return 0


def _cache_bytes(config, n: int, hq: int, hkv: int, d: int) -> int:
    """Codes and parameters of one sequence of n tokens (the bulk of what a batch-1 decode reads),
    as the byte model counts them."""
    from core.bytes_model import traffic

    t = traffic("int", batch=1, kv_len=n, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=config.page_size,
                bits=config.bits, group_size=config.group_size, k_mode=config.k_mode, v_mode=config.v_mode)
    return t.kv_codes + t.kv_params


if __name__ == "__main__":
    raise SystemExit(main())
