"""Error of our kernels (and FlashInfer BF16 beside them) against float64 attention over the
same dequantized cache, at long contexts, on the GPU. Inputs come from foscar.synthetic (seeded
numpy), so foscar/precision.py can model the same cells on a CPU.

    PYTHONPATH=. python3 scripts/accuracy_long.py --bits 2,4 --modes ct,tt,tc,cc \
        --kv-len 4k,32k,128k,256k --batch 1 --json $OUT/acc.json [--flashinfer]

Prints one line per cell and writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import foscar  # noqa: E402
from foscar import synthetic  # noqa: E402
from foscar.config import QuantConfig  # noqa: E402
from foscar.reference import attention_f64  # noqa: E402
from suite.cases import parse_int_list  # noqa: E402

MODES = {"t": "token", "c": "channel"}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.double() - ref).norm() / ref.norm()).item()


def flashinfer_error(inp, ref) -> float:
    """FlashInfer's tensor-core BF16 decode over the unquantized cache (its own error)."""
    import flashinfer

    batch, kv_len, heads, dim = inp.k.shape
    page = 64
    pages = kv_len // page
    k = inp.k.cuda().view(batch * pages, page, heads, dim)
    v = inp.v.cuda().view(batch * pages, page, heads, dim)
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * pages
    indices = torch.arange(batch * pages, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), page, dtype=torch.int32, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, inp.q.shape[1], heads, dim, page, pos_encoding_mode="NONE",
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=dim**-0.5)
    out = w.run(inp.q.cuda(), (k, v))
    return rel_error(out, ref)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", default="2,4")
    ap.add_argument("--modes", default="ct,tt,tc,cc", help="K mode + V mode letters, t = token, c = channel")
    ap.add_argument("--kv-len", default="4k,32k,128k,256k")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--dist", default="gauss")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flashinfer", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for kv_len in parse_int_list(args.kv_len, "--kv-len"):
        t0 = time.time()
        inp = synthetic.make_inputs(args.batch, kv_len, seed=args.seed, distribution=args.dist)
        q = inp.q.cuda()
        fi_err = None
        ref_plain = None
        if args.flashinfer:
            ref_plain = attention_f64(q, inp.k.cuda(), inp.v.cuda(), inp.seq_lens)
            try:
                fi_err = flashinfer_error(inp, ref_plain)
            except Exception as exc:  # noqa: BLE001 - a baseline's failure must not stop our cells
                print(f"flashinfer-bf16-tc failed: {exc!r}", flush=True)
                fi_err = float("nan")
            rows.append(dict(backend="flashinfer-bf16-tc", kv_len=kv_len, batch=args.batch, dist=args.dist,
                             seed=args.seed, rel_error=fi_err))
            print(f"flashinfer-bf16-tc     kv {kv_len:7d} b{args.batch}  {fi_err:.2e}", flush=True)
            del ref_plain
        k, v = inp.k.cuda(), inp.v.cuda()
        for bits in map(int, args.bits.split(",")):
            for mode in args.modes.split(","):
                cfg = QuantConfig(bits=bits, group_size=args.group, k_mode=MODES[mode[0]], v_mode=MODES[mode[1]],
                                  page_size=args.page)
                cache = foscar.quantize(k, v, inp.seq_lens, cfg)
                out = torch.full_like(q, float("nan"))
                foscar.decode(q, cache, out=out)
                kd, vd = foscar.dequantize(cache, dtype=torch.float64)
                ref = attention_f64(q, kd, vd, inp.seq_lens)
                err = rel_error(out, ref)
                del kd, vd, cache
                rows.append(dict(backend=f"foscar-int{bits}", mode=cfg.tag, kv_len=kv_len, batch=args.batch,
                                 dist=args.dist, seed=args.seed, rel_error=err))
                print(f"foscar {cfg.tag:16s} kv {kv_len:7d} b{args.batch}  {err:.2e}", flush=True)
        del k, v
        torch.cuda.empty_cache()
        print(f"  ({time.time() - t0:.1f} s)", flush=True)
        if args.json:  # after each length: a run cut off by its stage's timeout keeps the lengths done
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
