"""Measure one (case, backend) on one device: supports -> fits -> prepare -> correctness
gate -> timing -> derived metrics. Returns a flat record; never raises for a backend's
failure (the error becomes the record's status and reason). `fatal` says the CUDA context
may be dead and the worker must be replaced."""
from __future__ import annotations

import gc
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from baselines.base import Backend, CompileError, GpuInfo, Prepared, SourceKV, Unsupported
from suite import bytes_model
from suite.cases import Case
from suite.timing import l2_flush, l2_plan, time_cpu, time_gpu

MAX_CHECK_SEQS = 4  # sequences the float64 reference checks in big cases
MAX_ROTATE_COPIES = 32
MEMORY_HEADROOM_BYTES = 2 << 30

# Messages that mean the CUDA context is (or may be) unusable: the worker is replaced.
FATAL_MARKERS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "an illegal",
    "CUDA error",
    "cudaError",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "out of memory",
    "uncorrectable ECC",
)
COMPILE_MARKERS = ("nvcc", "ninja", "compilation", "failed to build", "build failed", "ptxas")


@dataclass
class WorkerContext:
    """What a worker knows about its device, kept across cases."""

    device: Any  # torch.device
    gpu: GpuInfo
    gpu_env: dict = field(default_factory=dict)  # envinfo.gpu_info block
    read_ceiling_tbps: float | None = None
    nvml: Any = None
    nvml_handle: Any = None
    source_key: tuple | None = None
    source: SourceKV | None = None

    @property
    def is_cuda(self) -> bool:
        return getattr(self.device, "type", "cpu") == "cuda"


def classify(exc: BaseException) -> tuple[str, str, bool]:
    """(status, reason, fatal) for an exception a backend raised."""
    text = f"{type(exc).__name__}: {exc}".strip()
    reason = text if len(text) < 3000 else text[:3000] + " ..."
    if isinstance(exc, Unsupported):
        return "unsupported", str(exc), False
    if isinstance(exc, (ImportError, NotImplementedError)):
        return "unsupported", reason, False
    name = type(exc).__name__.lower()
    if isinstance(exc, CompileError) or "builderror" in name or "compile" in name:
        return "compile_error", reason, False
    if any(m.lower() in text.lower() for m in FATAL_MARKERS) or "outofmemory" in name:
        return "crashed", reason, True
    if any(m in text.lower() for m in COMPILE_MARKERS):
        return "compile_error", reason, False
    return "crashed", reason, False


def case_fields(case: Case, backend: Backend) -> dict[str, Any]:
    return {
        "case_key": case.key,
        "backend": backend.name,
        "family": backend.family,
        "bits": case.bits,
        "batch": case.batch,
        "kv_len": case.kv_len,
        "num_q_heads": case.num_q_heads,
        "num_kv_heads": case.num_kv_heads,
        "head_dim": case.head_dim,
        "k_mode": case.k_mode,
        "v_mode": case.v_mode,
        "group_size": case.group_size,
        "page_size": case.page_size,
        "model": case.model,
        "seed": case.seed,
        "shape_key": case.shape_key,
        "tolerance": backend.tolerance,
    }


def gpu_fields(ctx: WorkerContext) -> dict[str, Any]:
    return {
        "gpu_index": ctx.gpu.index,
        "gpu_name": ctx.gpu.name,
        "gpu_uuid": ctx.gpu.uuid,
    }


# --- source data ----------------------------------------------------------------------------
def source_bytes(case: Case) -> int:
    return 2 * (case.batch * case.num_q_heads * case.head_dim + 2 * case.batch * case.kv_len * case.num_kv_heads * case.head_dim)


def make_source(case: Case, device: Any) -> SourceKV:
    """Seeded BF16 Q, K, V (standard normal) and equal sequence lengths, on `device`."""
    import torch

    gen = torch.Generator(device=device).manual_seed(case.seed)
    shape = (case.batch, case.kv_len, case.num_kv_heads, case.head_dim)
    q = torch.randn(case.batch, case.num_q_heads, case.head_dim, generator=gen, device=device, dtype=torch.bfloat16)
    k = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    lens = torch.full((case.batch,), case.kv_len, dtype=torch.int32, device=device)
    return SourceKV(q=q, k=k, v=v, seq_lens=lens, sm_scale=1.0 / math.sqrt(case.head_dim))


def _source_key(case: Case) -> tuple:
    return (case.batch, case.kv_len, case.num_q_heads, case.num_kv_heads, case.head_dim, case.seed)


def clone_source(src: SourceKV) -> SourceKV:
    return SourceKV(q=src.q.clone(), k=src.k.clone(), v=src.v.clone(), seq_lens=src.seq_lens.clone(), sm_scale=src.sm_scale)


def release_source(ctx: WorkerContext) -> None:
    ctx.source, ctx.source_key = None, None
    gc.collect()
    if ctx.is_cuda:
        import torch

        torch.cuda.empty_cache()


def source_for(ctx: WorkerContext, case: Case) -> SourceKV:
    key = _source_key(case)
    if ctx.source_key != key:
        release_source(ctx)
        ctx.source = make_source(case, ctx.device)
        ctx.source_key = key
    return ctx.source


# --- memory ---------------------------------------------------------------------------------
def fit_reason(ctx: WorkerContext, case: Case, backend: Backend) -> str | None:
    """Why the case cannot fit on this GPU (None when it fits)."""
    if not ctx.is_cuda:
        return None
    import torch

    free, total = torch.cuda.mem_get_info(ctx.device)
    free += torch.cuda.memory_reserved(ctx.device) - torch.cuda.memory_allocated(ctx.device)
    cached = ctx.source is not None
    same = ctx.source_key == _source_key(case)
    if cached and not same:
        free += _bytes_of(ctx.source)  # released before this case's source is made
    need = (0 if same else source_bytes(case)) + int(backend.memory_bytes(case) * 1.1) + MEMORY_HEADROOM_BYTES
    if need > free:
        return (
            f"needs about {need / 1e9:.1f} GB on the GPU (source K/V {source_bytes(case) / 1e9:.1f} GB "
            f"+ {backend.name}'s cache {backend.memory_bytes(case) / 1e9:.1f} GB); "
            f"{free / 1e9:.1f} GB free of {total / 1e9:.1f} GB"
        )
    return None


def _bytes_of(src: SourceKV | None) -> int:
    if src is None:
        return 0
    return sum(t.numel() * t.element_size() for t in (src.q, src.k, src.v))


# --- correctness ----------------------------------------------------------------------------
def check_indices(batch: int) -> list[int]:
    if batch <= MAX_CHECK_SEQS:
        return list(range(batch))
    return sorted({0, batch // 3, (2 * batch) // 3, batch - 1})


def attention_f64(q, k, v, seq_lens, sm_scale):
    """The project's float64 reference (foscar.reference.attention_f64), imported on use."""
    from foscar.reference import attention_f64 as ref

    return ref(q, k, v, seq_lens, sm_scale)


def rel_l2(a, b) -> float:
    num = float((a.double() - b.double()).norm())
    den = float(b.double().norm())
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def check(case: Case, backend: Backend, prepared: Prepared, source: SourceKV, ctx: WorkerContext) -> dict:
    """Run once over a poisoned output; compare with float64 over the backend's own cache."""
    import torch

    if prepared.out is not None and prepared.out.is_floating_point():
        prepared.out.fill_(float("nan"))
    out = prepared.run()
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)
    res: dict[str, Any] = {}
    expected = (case.batch, case.num_q_heads, case.head_dim)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        res.update(status="incorrect", reason=f"output has shape {shape}; expected {expected}.")
        return res
    bad = int((~torch.isfinite(out)).sum())
    if bad:
        res.update(
            status="incorrect",
            reason=f"{bad} of {out.numel()} output elements are NaN/Inf (poisoned and never written, or overflow).",
            rel_error=float("nan"),
        )
        return res
    idx = check_indices(case.batch)
    ii = torch.as_tensor(idx, device=source.q.device)
    k_ref, v_ref = prepared.reference_kv(idx)
    q_ref = prepared.reference_q if prepared.reference_q is not None else source.q
    lens = source.seq_lens.index_select(0, ii)
    ref = attention_f64(q_ref.index_select(0, ii), k_ref, v_ref, lens, source.sm_scale)
    res["rel_error"] = rel_l2(out.index_select(0, ii), ref)
    exact = attention_f64(
        source.q.index_select(0, ii), source.k.index_select(0, ii), source.v.index_select(0, ii), lens, source.sm_scale
    )
    res["quant_rel_error"] = rel_l2(ref, exact)
    res["checked_seqs"] = idx
    res["checked_note"] = (
        f"float64 reference over {len(idx)} of {case.batch} sequences"
        + ("" if len(idx) == case.batch else f" (indices {idx})")
    )
    if not res["rel_error"] <= backend.tolerance:
        res.update(
            status="incorrect",
            reason=f"relative L2 error {res['rel_error']:.3g} exceeds {backend.name}'s tolerance {backend.tolerance:g}.",
        )
    return res


# --- the whole measurement ------------------------------------------------------------------
def measure(case: Case, backend: Backend, ctx: WorkerContext) -> tuple[dict, bool]:
    """(record, fatal). The record is complete except for run_id."""
    rec: dict[str, Any] = {**case_fields(case, backend), **gpu_fields(ctx)}
    rec.update(bus_peak_tbps=ctx.gpu_env.get("bus_peak_tbps"),
               datasheet_peak_tbps=ctx.gpu_env.get("datasheet_peak_tbps"),
               read_ceiling_tbps=ctx.read_ceiling_tbps)
    traffic = bytes_model.traffic_for(backend, case)
    rec.update(bytes=traffic.total, flops=traffic.flops, traffic=traffic.as_dict())
    t0 = time.time()
    try:
        reason = backend.supports(case, ctx.gpu)
        if not reason and backend.needs_cuda and not ctx.is_cuda:
            reason = f"{backend.name} runs on a CUDA GPU; this worker is on the CPU."
        if reason:
            rec.update(status="unsupported", reason=reason)
            return rec, False
        reason = fit_reason(ctx, case, backend)
        if reason:
            rec.update(status="skipped", reason=reason)
            return rec, False
        source = source_for(ctx, case)
        prepared = backend.prepare(case, source)
        rec["bytes"] = nbytes = prepared.bytes or traffic.total
        if prepared.notes:
            rec["notes"] = prepared.notes
        checked = check(case, backend, prepared, source, ctx)
        rec.update(checked)
        if checked.get("status") == "incorrect":
            return rec, False
        timing = _time(case, backend, prepared, source, ctx, rec, nbytes)
        rec.update(
            status="passed",
            median_us=timing.median_us,
            p10_us=timing.p10_us,
            p90_us=timing.p90_us,
            n_samples=timing.n_samples,
            timing_method=timing.method,
        )
        if timing.note:
            rec["timing_note"] = timing.note
        _derive(rec)
        return rec, False
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a record
        if isinstance(exc, KeyboardInterrupt):
            raise
        status, reason, fatal = classify(exc)
        rec.update(status=status, reason=reason, traceback=traceback.format_exc(limit=6)[-4000:])
        if not fatal:
            fatal = not context_healthy(ctx)
        return rec, fatal
    finally:
        rec["wall_s"] = round(time.time() - t0, 3)


def context_healthy(ctx: WorkerContext) -> bool:
    if not ctx.is_cuda:
        return True
    try:
        import torch

        torch.cuda.synchronize(ctx.device)
        torch.ones(1, device=ctx.device).add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


def _time(case: Case, backend: Backend, prepared: Prepared, source: SourceKV, ctx: WorkerContext, rec: dict,
          nbytes: int):
    if not ctx.is_cuda:
        rec["l2_policy"] = "n/a (cpu)"
        return time_cpu([prepared.run])
    from suite.envinfo import clock_sample

    plan = l2_plan(nbytes, ctx.gpu.l2_bytes, MAX_ROTATE_COPIES)
    copies, policy, detail = plan.copies, plan.policy, plan.detail
    preps = [prepared]
    for _ in range(copies - 1):
        preps.append(backend.prepare(case, clone_source(source)))
    flush = None
    if policy == "flush":
        flush = l2_flush(2 * (ctx.gpu.l2_bytes or 50 << 20), ctx.device)
    rec.update(l2_policy=policy, l2_detail=detail)
    before = clock_sample(ctx.nvml, ctx.nvml_handle)
    timing, after = time_gpu(
        [p.run for p in preps if isinstance(p, Prepared)],
        l2_policy=policy,
        flush=flush,
        sample_clock=lambda: clock_sample(ctx.nvml, ctx.nvml_handle),
    )
    after = after or clock_sample(ctx.nvml, ctx.nvml_handle)
    reasons = sorted(set(before.get("throttle_reasons") or []) | set(after.get("throttle_reasons") or []))
    rec.update(
        sm_clock_mhz_before=before.get("sm_clock_mhz"),
        sm_clock_mhz_after=after.get("sm_clock_mhz"),
        mem_clock_mhz_after=after.get("mem_clock_mhz"),
        temperature_c_after=after.get("temperature_c"),
        power_w_after=after.get("power_w"),
        throttled=bool(reasons),
        throttle_reasons=",".join(reasons),
    )
    del preps
    return timing


def _derive(rec: dict) -> None:
    eff = bytes_model.eff_bandwidth_tbps(rec["bytes"], rec.get("median_us"))
    rec["eff_bandwidth_tbps"] = eff
    rec["frac_peak_bus"] = bytes_model.fraction(eff, rec.get("bus_peak_tbps"))
    rec["frac_peak_datasheet"] = bytes_model.fraction(eff, rec.get("datasheet_peak_tbps"))
    rec["frac_read_ceiling"] = bytes_model.fraction(eff, rec.get("read_ceiling_tbps"))
