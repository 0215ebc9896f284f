"""Is flashinfer-nvfp4-tc's speed (5.3 ms, 19% of the bus peak at batch 128, KV 32K) FlashInfer's
own, or a slow path our adapter picks? Times FlashInfer's NVFP4-KV paged decode at one shape
with FlashInfer's own timer (flashinfer.testing.bench_gpu_time: cold L2 by flushing, CUDA
graphs), in the configuration FlashInfer's decode benchmark uses (benchmarks/routines/
attention.py: HND pages, FP8 query, flashinfer's nvfp4_quantize_paged_kv_cache), in our
adapter's (NHD pages, BF16 query, our quantizer), and the crossings; then our registered
backend through our own harness. GPU only:

    python scripts/flashinfer_nvfp4_check.py --json out/nvfp4_check.json

Each configuration prints one JSON line as it finishes (a JIT build may take a minute), so
a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines.flashinfer_decode import call_with_supported  # noqa: E402
from core.bytes_model import traffic  # noqa: E402

# (name, kv layout, query dtype, use_tensor_cores): FlashInfer's benchmark configuration
# first, ours second, then what differs one factor at a time.
CONFIGS = (
    ("flashinfer-bench", "HND", "fp8", True),
    ("adapter", "NHD", "bf16", True),
    ("hnd-bf16", "HND", "bf16", True),
    ("nhd-fp8", "NHD", "fp8", True),
    ("adapter-cuda-core", "NHD", "bf16", False),
    ("flashinfer-bench-cuda-core", "HND", "fp8", False),
)


def kv_pages(batch: int, kv_len: int, hkv: int, d: int, page: int, layout: str, dev) -> tuple:
    """BF16 K and V pages [pages, page, hkv, d] (NHD) or [pages, hkv, page, d] (HND)."""
    pages = batch * kv_len // page
    shape = (pages, page, hkv, d) if layout == "NHD" else (pages, hkv, page, d)
    gen = torch.Generator(device=dev).manual_seed(0)
    return (torch.randn(shape, generator=gen, device=dev, dtype=torch.bfloat16),
            torch.randn(shape, generator=gen, device=dev, dtype=torch.bfloat16))


def quantize(k, v, layout: str, ours: bool):
    """(k_fp4, v_fp4), (k_sf, v_sf), k_scale, v_scale: FlashInfer's quantizer, or ours."""
    if not ours:
        from flashinfer import nvfp4_quantize_paged_kv_cache

        return nvfp4_quantize_paged_kv_cache(k, v, kv_layout=layout)
    from baselines._paging import nvfp4_quantize_chunked

    kp, ksf, kg = nvfp4_quantize_chunked(k)
    vp, vsf, vg = nvfp4_quantize_chunked(v)
    return (kp, vp), (ksf, vsf), kg, vg


def time_config(name: str, layout: str, q_dtype: str, tensor_cores: bool, shape: dict, dev) -> dict:
    import flashinfer
    from flashinfer.testing import bench_gpu_time

    b, kv, hq, hkv, d, page = (shape[k] for k in ("batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim", "page_size"))
    k, v = kv_pages(b, kv, hkv, d, page, layout, dev)
    (kp, vp), (ksf, vsf), ks, vs = quantize(k, v, layout, ours=(name.startswith("adapter") or q_dtype == "bf16"))
    del k, v
    torch.cuda.empty_cache()
    pages_per_seq = kv // page
    indptr = torch.arange(0, (b + 1) * pages_per_seq, pages_per_seq, dtype=torch.int32, device=dev)
    indices = torch.arange(b * pages_per_seq, dtype=torch.int32, device=dev)
    last = torch.full((b,), page, dtype=torch.int32, device=dev)
    qdt = torch.float8_e4m3fn if q_dtype == "fp8" else torch.bfloat16
    q = torch.randn(b, hq, d, device=dev, dtype=torch.bfloat16).to(qdt)
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, layout, use_tensor_cores=tensor_cores,
                                                            backend="fa2")
    t0 = time.time()
    call_with_supported(wrapper.plan, indptr, indices, last, hq, hkv, d, page, pos_encoding_mode="NONE",
                        q_data_type=qdt, kv_data_type=torch.uint8, o_data_type=torch.bfloat16,
                        sm_scale=1 / math.sqrt(d))
    out = torch.empty(b, hq, d, device=dev, dtype=torch.bfloat16)

    def run():
        return wrapper.run(q, (kp, vp), kv_cache_sf=(ksf, vsf), k_scale=ks, v_scale=vs, out=out)

    run()
    torch.cuda.synchronize()
    first_s = time.time() - t0  # plan, JIT build (first time) and one run
    times_ms = bench_gpu_time(run, cold_l2_cache=True, use_cuda_graph=True, repeat_time_ms=1000)
    med = float(torch.tensor(times_ms).median())
    nbytes = traffic("nvfp4", batch=b, kv_len=kv, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                     page_size=page).total
    return {"config": name, "layout": layout, "q_dtype": q_dtype, "tensor_cores": tensor_cores,
            "median_ms": med, "p10_ms": float(torch.tensor(times_ms).quantile(0.1)),
            "p90_ms": float(torch.tensor(times_ms).quantile(0.9)), "n": len(times_ms),
            "tbps": nbytes / (med * 1e-3) / 1e12, "bytes": nbytes, "first_call_s": round(first_s, 1),
            "timer": "flashinfer.testing.bench_gpu_time (cold L2, CUDA graph)"}


def time_adapter(shape: dict, dev) -> dict:
    """Our registered backend through our harness: the number the sweep records."""
    from baselines.base import get_backend
    from core.case import Case
    from suite.runner import make_source
    from suite.timing import l2_plan, time_gpu

    backend = get_backend("flashinfer-nvfp4-tc")
    case = backend.case_for(Case(batch=shape["batch"], kv_len=shape["kv_len"], page_size=shape["page_size"], bits=4))
    nbytes = traffic("nvfp4", batch=case.batch, kv_len=case.kv_len, num_q_heads=case.num_q_heads,
                     num_kv_heads=case.num_kv_heads, head_dim=case.head_dim, page_size=case.page_size).total
    src = make_source(case, dev)
    prepared = backend.prepare(case, src)
    plan = l2_plan(nbytes, torch.cuda.get_device_properties(dev).L2_cache_size, 32)
    t, _ = time_gpu([prepared.run], l2_policy=plan.policy)
    return {"config": "adapter-through-harness", "median_ms": t.median_us / 1e3, "spread": t.spread,
            "tbps": nbytes / (t.median_us * 1e-6) / 1e12, "timer": "suite.timing.time_gpu", "l2": plan.verdict}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--configs", default=",".join(c[0] for c in CONFIGS) + ",adapter-through-harness")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--kv-len", type=int, default=32768)
    ap.add_argument("--page-size", type=int, default=64)
    args = ap.parse_args()
    dev = torch.device("cuda")
    shape = {"batch": args.batch, "kv_len": args.kv_len, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128,
             "page_size": args.page_size}
    wanted = set(args.configs.split(","))
    results = []
    for name, layout, q_dtype, tc in CONFIGS:
        if name not in wanted:
            continue
        try:
            res = time_config(name, layout, q_dtype, tc, shape, dev)
        except Exception as exc:  # noqa: BLE001 - a configuration FlashInfer refuses is a finding
            res = {"config": name, "layout": layout, "q_dtype": q_dtype, "tensor_cores": tc,
                   "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        torch.cuda.empty_cache()
        results.append(res)
        print(json.dumps(res), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"shape": shape, "results": results}, indent=2))
    if "adapter-through-harness" in wanted:
        try:
            results.append(time_adapter(shape, dev))
        except Exception as exc:  # noqa: BLE001
            results.append({"config": "adapter-through-harness", "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"shape": shape, "results": results}, indent=2))


if __name__ == "__main__":
    main()
