"""Synthetic H200 records for the targets scorecard: our two kernels and the two baselines of the
speedup targets on the 16-case grid, with times and fractions chosen so that each target lands
where a test wants it (a fixture, not a measurement), as a frame or written into a store."""
from __future__ import annotations

from pathlib import Path
from unittest import mock

import pandas as pd

from core import store as store_mod
from core.store import ResultStore

GPU = "NVIDIA H200"
BUS_TBPS = 2 * 3201e6 * 6016 / 8 / 1e12  # 4.815, the H200 bus peak the harness derives
BATCHES = (1, 8, 32, 128)
KV_LENS = (4096, 16384, 32768, 131072)
OURS_US = {"foscar-int4": 100.0, "foscar-int2": 60.0}
# baseline time / 100 us: INT4 4x and 2x (goals 3.5x, 1.8x), INT2 6.7x and 3.3x (goals 6x, 3x)
BASE_US = {"flashinfer-bf16-tc": 400.0, "trtllm-xqa-fp8": 200.0}
BITS = {"foscar-int4": 4, "foscar-int2": 2, "flashinfer-bf16-tc": 16, "trtllm-xqa-fp8": 8}
# fraction of the bus peak at the two bandwidth targets' cases: INT4 meets both, INT2 misses both
FRAC = {("foscar-int4", 128, 32768): 0.95, ("foscar-int2", 128, 32768): 0.80,
        ("foscar-int4", 1, 131072): 0.85, ("foscar-int2", 1, 131072): 0.50}
# ALU per KV element on the b128/32K record: INT4 meets <= 0.9, INT2 misses <= 0.65
ALU = {"foscar-int4": 0.85, "foscar-int2": 0.70}


def record(backend: str, batch: int, kv_len: int, *, run: str = "grid-1", status: str = "passed",
           k_mode: str = "channel", v_mode: str = "token", frac: float | None = None,
           alu: float | None | str = "auto", rel_error: float | None = None, gpu: str = GPU) -> dict:
    """One record as the store keeps it; ours are quantized with group 128 (k_mode/v_mode), the
    baselines unquantized; `frac` defaults to FRAC's figure or 0.5, `alu` ("auto") to ALU's at b128/32K
    (None: no ALU count); `rel_error` to 1.7e-3, or 9.1e-2 when incorrect."""
    ours = backend.startswith("foscar")
    bits = BITS[backend]
    fmt = f"int{bits}-g128-k{k_mode[0]}-v{v_mode[0]}" if ours else f"b{bits}"
    rec = dict(
        run_id=run, case_key=f"b{batch}-kv{kv_len}-h32x8-d128-{fmt}-p64-s0", backend=backend,
        family="foscar" if ours else "flashinfer", bits=bits, batch=batch, kv_len=kv_len,
        num_q_heads=32, num_kv_heads=8, head_dim=128, k_mode=k_mode if ours else "none",
        v_mode=v_mode if ours else "none", group_size=128 if ours else 0, page_size=64,
        model="llama3-8b", gpu_name=gpu, status=status,
        rel_error=rel_error if rel_error is not None else 9.1e-2 if status == "incorrect" else 1.7e-3,
    )
    if status != "passed":  # untimed: incorrect (failed the gate), crashed, ...
        rec.update(reason=f"made {status} by the fixture", alu_per_elem=None if alu == "auto" else alu)
        return rec if status == "incorrect" else {**rec, "rel_error": None}
    frac = frac if frac is not None else FRAC.get((backend, batch, kv_len), 0.5)
    median = OURS_US.get(backend) or BASE_US[backend]
    if alu == "auto":
        alu = ALU[backend] if ours and (batch, kv_len) == (128, 32768) else None
    return {**rec, "median_us": median, "frac_peak_bus": frac, "eff_bandwidth_tbps": frac * BUS_TBPS,
            "bytes": 1e9, "alu_per_elem": alu}


def grid(run: str = "grid-1", *, skip=(), change=None, **kw) -> list[dict]:
    """Every backend on every grid case; `skip`: (backend, batch, kv_len) left out; `change`:
    {(backend, batch, kv_len): record fields} replacing what record() would make."""
    out = []
    for backend in BITS:
        for batch in BATCHES:
            for kv_len in KV_LENS:
                key = (backend, batch, kv_len)
                if key in skip:
                    continue
                out.append(record(backend, batch, kv_len, run=run, **{**kw, **(change or {}).get(key, {})}))
    return out


def frame(records: list[dict], started: str = "2026-01-01T10:00:00+00:00", sha: str = "aaaa1111") -> pd.DataFrame:
    """Records as a frame, each with its run's start and commit (one run start for all)."""
    return pd.DataFrame([{"started_at": started, "git_sha": sha, "git_dirty": 0,
                          "created_at": started, **r} for r in records])


def write_store(path: Path, runs: dict[str, tuple[str, list[dict]]]) -> Path:
    """A store holding each run {run_id: (git sha, records)}, started in that order."""
    with ResultStore(path) as store:
        for i, (run_id, (sha, records)) in enumerate(runs.items()):
            when = f"2026-01-0{i + 1}T10:00:00+00:00"
            with mock.patch.object(store_mod, "git_state", return_value=(sha, False)), \
                    mock.patch.object(store_mod, "utc_now", return_value=when):
                store.start_run(argv=["foscar-bench", "sweep"], config={}, env={}, run_id=run_id)
                for rec in records:
                    store.add_record(run_id, {k: v for k, v in rec.items() if k != "run_id"})
    return path
