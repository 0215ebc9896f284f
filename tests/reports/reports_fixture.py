"""A synthetic, realistic results store: an H200 sweep of every backend at two commits, one planted slowdown."""
from __future__ import annotations

import random
from pathlib import Path
from unittest import mock

from core import store as store_mod
from core.bytes_model import traffic
from core.store import ResultStore

BUS_TBPS = 2 * 3201e6 * 6016 / 8 / 1e12  # 4.815
DATASHEET_TBPS = 4.8
READ_CEILING_TBPS = 4.44
GPU = "NVIDIA H200"
ENV = {
    "host": "fixture",
    "gpus": [{
        "name": GPU, "uuid": "GPU-fixture-0", "capability": "9.0", "sm_count": 132,
        "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 3201, "memory_bus_width_bits": 6016,
        "bus_peak_tbps": BUS_TBPS, "datasheet_peak_tbps": DATASHEET_TBPS,
        "read_ceiling_tbps": READ_CEILING_TBPS,
    }],
}
BATCHES = (1, 8, 128)
KV_LENS = (4096, 32768, 131072)
SHA_BASE = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
SHA_HEAD = "f00dfeed00112233445566778899aabbccddeeff"

# backend: (family, bits, kv format, fraction of bus peak at large sizes, launch+split
# overhead in us, rel_error, quant_rel_error, alu_per_elem, alu_static_per_elem)
BACKENDS = {
    "torch-ref": ("reference", 16, "bf16", 0.30, 60, 0.0, 0.0, None, None),
    "flashinfer-bf16": ("flashinfer", 16, "bf16", 0.59, 25, 2.1e-3, 0.0, None, None),
    "flashinfer-bf16-tc": ("flashinfer", 16, "bf16", 0.95, 30, 1.9e-3, 0.0, None, None),
    "flashinfer-fp8": ("flashinfer", 8, "fp8", 0.25, 30, 2.4e-3, 3.1e-2, None, None),
    "trtllm-xqa-fp8": ("trtllm", 8, "fp8", 0.92, 28, 3.8e-2, 3.1e-2, None, None),
    "flashinfer-nvfp4-tc": ("flashinfer", 4, "nvfp4", 0.55, 30, 2.0e-3, 9.5e-2, None, None),
    "trtllm-nvfp4": ("trtllm", 4, "nvfp4", None, 0, None, None, None, None),
    "bitdecoding-int4": ("bitdecoding", 4, "int", 0.46, 20, 1.1e-3, 8.4e-2, None, None),
    "bitdecoding-int2": ("bitdecoding", 2, "int", 0.27, 20, 1.2e-3, 3.6e-1, None, None),
    "foscar-dequant-int4": ("foscar", 4, "int", 0.50, 10, 1.6e-3, 8.4e-2, None, 2.4),
    "foscar-dequant-int2": ("foscar", 2, "int", 0.31, 10, 1.6e-3, 3.6e-1, None, 2.1),
    "foscar-int4": ("foscar", 4, "int", 0.93, 6, 1.7e-3, 8.4e-2, 0.86, 0.84),
    "foscar-int2": ("foscar", 2, "int", 0.85, 6, 1.8e-3, 3.6e-1, 0.62, 0.60),
}
NOISE = 0.012  # p10/p90 sit this far from the median
PLANTED_SLOW = ("foscar-int2", 128, 32768, 1.10)  # HEAD: 10% slower here
PLANTED_NOISE = ("foscar-int4", 8, 32768, 1.005)  # HEAD: 0.5% slower, inside the noise


def _record(backend: str, batch: int, kv_len: int, factor: float, rng: random.Random) -> dict:
    family, bits, fmt, frac, overhead, err, qerr, alu, alu_static = BACKENDS[backend]
    quant = fmt == "int"
    case_key = (f"b{batch}-kv{kv_len}-h32x8-d128-"
                + (f"int{bits}-g128-kc-vt" if quant else f"b{bits}") + "-p64-s0")
    rec = dict(
        case_key=case_key, backend=backend, family=family, bits=bits, batch=batch, kv_len=kv_len,
        num_q_heads=32, num_kv_heads=8, head_dim=128, k_mode="channel" if quant else "none",
        v_mode="token" if quant else "none", group_size=128 if quant else 0, page_size=64,
        model="llama3-8b", gpu_index=0, gpu_name=GPU, gpu_uuid="GPU-fixture-0", l2_policy="rotate",
    )
    if frac is None:
        return {**rec, "status": "unsupported", "reason": "TensorRT-LLM's NVFP4 decode needs Blackwell (sm_100); this GPU is sm_90."}
    if backend == "torch-ref" and batch * kv_len > 8 * 32768:
        return {**rec, "status": "skipped", "reason": "torch-ref is only run up to 256K tokens in total."}
    t = traffic(fmt, batch=batch, kv_len=kv_len, num_q_heads=32, num_kv_heads=8, head_dim=128,
                page_size=64, bits=bits if quant else None, group_size=128 if quant else None,
                k_mode="channel" if quant else None, v_mode="token" if quant else None)
    median = (overhead + t.total / (frac * BUS_TBPS * 1e12) * 1e6) * factor * (1 + rng.uniform(-0.002, 0.002))
    eff = t.total / (median * 1e-6) / 1e12
    status = "incorrect" if backend == "bitdecoding-int2" and batch == 1 and kv_len == 4096 else "passed"
    rec.update(
        status=status, reason="rel_error 9.1e-02 > tolerance 2e-02" if status == "incorrect" else None,
        bytes=t.total, flops=t.flops, rel_error=9.1e-2 if status == "incorrect" else err * rng.uniform(0.8, 1.2),
        quant_rel_error=qerr, alu_per_elem=alu, alu_static_per_elem=alu_static,
        sm_clock_mhz_before=1980.0, sm_clock_mhz_after=1965.0, throttled=0,
    )
    if status == "passed":
        rec.update(
            median_us=median, p10_us=median * (1 - NOISE), p90_us=median * (1 + NOISE), n_samples=200,
            eff_bandwidth_tbps=eff, frac_peak_bus=eff / BUS_TBPS, frac_peak_datasheet=eff / DATASHEET_TBPS,
            frac_read_ceiling=eff / READ_CEILING_TBPS,
        )
    return rec


def _factor(backend: str, batch: int, kv_len: int, head: bool) -> float:
    if head:
        for planted in (PLANTED_SLOW, PLANTED_NOISE):
            if (backend, batch, kv_len) == planted[:3]:
                return planted[3]
    return 1.0


def fill_run(store: ResultStore, sha: str, started_at: str, head: bool, seed: int) -> str:
    """One run of every backend over the grid, as if measured at commit `sha`."""
    rng = random.Random(seed)
    with mock.patch.object(store_mod, "git_state", return_value=(sha, False)), \
            mock.patch.object(store_mod, "utc_now", return_value=started_at):
        run_id = store.start_run(argv=["foscar-bench", "sweep", "--preset", "full"],
                                 config={"preset": "full"}, env=ENV, run_id=f"run-{sha[:6]}")
        for batch in BATCHES:
            for kv_len in KV_LENS:
                for backend in BACKENDS:
                    rec = _record(backend, batch, kv_len, _factor(backend, batch, kv_len, head), rng)
                    store.add_record(run_id, rec)
    return run_id


def build_store(path: Path) -> tuple[str, str]:
    """A store with a BASE and a HEAD run; returns their run ids."""
    with ResultStore(path) as store:
        base = fill_run(store, SHA_BASE, "2025-06-01T10:00:00+00:00", head=False, seed=1)
        head = fill_run(store, SHA_HEAD, "2025-06-02T10:00:00+00:00", head=True, seed=2)
    return base, head
