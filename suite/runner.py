"""Measure one (case, backend) on one device: supports -> fits -> prepare -> correctness
gate -> timing -> derived metrics. Returns a typed record (core.record.Record); never
raises for a backend's failure (the error becomes the record's status and reason).
`fatal` says the CUDA context may be dead and the worker must be replaced."""
from __future__ import annotations

import gc
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from baselines.base import Backend, CompileError, Prepared, SourceKV, Unsupported
from core.bytes_model import traffic_for_case
from core.case import Case
from core.gpu import GpuInfo
from core.record import CheckFields, GpuFields, Record, TimingFields, TrafficFields
from suite.cases import reproducer
from suite.timing import L2Plan, Timing, l2_flush, shape_l2_plan, time_cpu, time_gpu, verify_rotation

MAX_CHECK_SEQS = 4  # sequences the float64 reference checks in big cases
# L2 is kept cold per shape (plan_l2): a shape whose BF16 cache would need more than
# MAX_ROTATE_COPIES rotated copies is flushed for every backend; on the others each backend
# rotates copies of its own bytes, up to MAX_ROTATE_COPIES_SHAPE. 256 covers the smallest
# format timed: INT2 at g128 (2.25 bits an element against BF16's 16) needs at most 7.1 x 32
# = 228 copies where the BF16 cache needs 32, so no bundled backend falls back to a flush. The
# copies hold about 4x L2 between them (250 MB on an H200) plus what each prepared copy keeps
# of its cloned source (ours keep it: about 2 GB at 228 copies, as 27 copies of INT2 at batch
# 1 / 16K already held under the per-backend rule), and cost one prepare (a clone of the
# source and the backend's conversion) and one graph capture each: not yet timed on the GPU,
# estimated at a second or so for a case of 200 copies.
MAX_ROTATE_COPIES = 32
MAX_ROTATE_COPIES_SHAPE = 256
MEMORY_HEADROOM_BYTES = 2 << 30
# check()'s float64 reference attends one KV head of one sequence at a time; fit_reason counts
# what one such call holds at its peak (attention_f64): K in float64 (or V with its masked
# copy, two), plus one for einsum's own reshaping; the scores with their masked copy and p.
F64_KV_COPIES = 3
F64_SCORE_COPIES = 3

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
    built: set = field(default_factory=set)  # (backend, warm-up case key) already built here

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


def new_record(case: Case, backend: Backend, gpu: GpuFields | None = None) -> Record:
    """A record of `backend` on `case`, before anything is known of how it went, with the
    command that re-runs it."""
    gpu = gpu or GpuFields()
    return Record(case=case, backend=backend.name, family=backend.family, gpu=gpu,
                  check=CheckFields(tolerance=backend.tolerance),
                  reproducer=reproducer(case, backend.name, gpu.gpu_index))


def gpu_fields(ctx: WorkerContext) -> GpuFields:
    return GpuFields.of(ctx.gpu, ctx.gpu_env, ctx.read_ceiling_tbps)


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
    return (case.shape_key, case.seed)


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
    return fit_shortfall(case, backend.name, backend.memory_bytes(case), free, total, source_resident=same)


def check_bytes(case: Case) -> int:
    """Device bytes check() holds at its peak beyond the source and the cache: one sequence's
    K and V from the backend's reference_kv, counted as float32 (what the dequantizing
    backends return), and one KV head's float64 attention temporaries (F64_KV_COPIES,
    F64_SCORE_COPIES). The exact reference reads the source through views: no copy. What
    reference_kv needs while it works (foscar.dequantize's float32 temporaries, a few hundred
    MB: it works through a sequence in slices of CHUNK_ELEMENTS) is left to the headroom."""
    kv = 2 * case.kv_len * case.num_kv_heads * case.head_dim * 4
    rows = case.num_q_heads // case.num_kv_heads
    head = 8 * case.kv_len * (F64_KV_COPIES * case.head_dim + F64_SCORE_COPIES * rows)
    return kv + head


def fit_shortfall(case: Case, name: str, cache_bytes: int, free: int, total: int,
                  source_resident: bool = False) -> str | None:
    """fit_reason's arithmetic, off the GPU: why `case` does not fit in `free` bytes (None when
    it does), given the backend's cache bytes and whether the case's source is already made."""
    src, chk = source_bytes(case), check_bytes(case)
    need = (0 if source_resident else src) + int(cache_bytes * 1.1) + chk + MEMORY_HEADROOM_BYTES
    if need > free:
        return (
            f"needs about {need / 1e9:.1f} GB on the GPU (source K/V {src / 1e9:.1f} GB "
            f"+ {name}'s cache {cache_bytes / 1e9:.1f} GB + the check's float64 reference "
            f"{chk / 1e9:.1f} GB); {free / 1e9:.1f} GB free of {total / 1e9:.1f} GB"
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


def reference_outputs(prepared: Prepared, source: SourceKV, idx: list[int]):
    """float64 attention for the sequences `idx`, [n, num_q_heads, head_dim]: over the
    backend's own reference_kv (ref) and over the BF16 source (exact).

    One sequence, then one KV head (with its query heads) at a time, so the peak is one
    sequence's reference K/V plus one head's float64 temporaries (check_bytes), not the
    whole check's: at batch 128 and 128K tokens the four sequences' float32 K alone asked
    for 2 GiB beside a 69 GB source. Each sequence's K/V is freed before the next's."""
    import torch

    n, num_q_heads, dim = len(idx), source.q.shape[1], source.q.shape[2]
    num_kv_heads = source.k.shape[2]
    rows = num_q_heads // num_kv_heads  # query head h reads KV head h // rows
    ref = torch.empty(n, num_q_heads, dim, dtype=torch.float64, device=source.q.device)
    exact = torch.empty_like(ref)
    for j, i in enumerate(idx):
        k_ref, v_ref = prepared.reference_kv([i])
        lens = source.seq_lens[i : i + 1]
        for h in range(num_kv_heads):
            q = source.q[i : i + 1, h * rows : (h + 1) * rows]
            heads = slice(h, h + 1)
            ref[j, h * rows : (h + 1) * rows] = attention_f64(
                q, k_ref[:, :, heads], v_ref[:, :, heads], lens, source.sm_scale)[0]
            exact[j, h * rows : (h + 1) * rows] = attention_f64(
                q, source.k[i : i + 1, :, heads], source.v[i : i + 1, :, heads], lens, source.sm_scale)[0]
        del k_ref, v_ref  # before the next sequence's are made
    return ref, exact


def check(case: Case, backend: Backend, prepared: Prepared, source: SourceKV,
          ctx: WorkerContext) -> tuple[CheckFields, str | None]:
    """Run once over a poisoned output; compare with float64 over the backend's own cache.
    Returns the check's figures and, when the output is wrong, why (None when it passes)."""
    import torch

    if prepared.out is not None and prepared.out.is_floating_point():
        prepared.out.fill_(float("nan"))
    out = prepared.run()
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.device)
    res = CheckFields(tolerance=backend.tolerance)
    expected = (case.batch, case.num_q_heads, case.head_dim)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return res, f"output has shape {shape}; expected {expected}."
    bad = int((~torch.isfinite(out)).sum())
    if bad:
        res.rel_error = float("nan")
        return res, f"{bad} of {out.numel()} output elements are NaN/Inf (poisoned and never written, or overflow)."
    idx = check_indices(case.batch)
    ii = torch.as_tensor(idx, device=source.q.device)
    ref, exact = reference_outputs(prepared, source, idx)
    res.rel_error = rel_l2(out.index_select(0, ii), ref)
    res.quant_rel_error = rel_l2(ref, exact)
    res.checked_seqs = idx
    res.checked_note = (
        f"float64 reference over {len(idx)} of {case.batch} sequences"
        + ("" if len(idx) == case.batch else f" (indices {idx})")
    )
    if not res.rel_error <= backend.tolerance:
        return res, (f"relative L2 error {res.rel_error:.3g} exceeds {backend.name}'s tolerance "
                     f"{backend.tolerance:g}.")
    return res, None


# --- the whole measurement ------------------------------------------------------------------
def measure(case: Case, backend: Backend, ctx: WorkerContext) -> tuple[Record, bool]:
    """(record, fatal)."""
    rec = new_record(case, backend, gpu_fields(ctx))
    traffic = backend.traffic(case)
    rec.traffic = TrafficFields(bytes=traffic.total, flops=traffic.flops, traffic=traffic.as_dict())
    t0 = time.time()
    try:
        reason = backend.supports(case, ctx.gpu)
        if not reason and backend.needs_cuda and not ctx.is_cuda:
            reason = f"{backend.name} runs on a CUDA GPU; this worker is on the CPU."
        if reason:
            rec.status, rec.reason = "unsupported", reason
            return rec, False
        reason = fit_reason(ctx, case, backend)
        if reason:
            rec.status, rec.reason = "skipped", reason
            return rec, False
        source = source_for(ctx, case)
        prepared = backend.prepare(case, source)
        rec.traffic.bytes = nbytes = prepared.bytes or traffic.total
        rec.notes = prepared.notes or None
        rec.check, wrong = check(case, backend, prepared, source, ctx)
        if wrong and not backend.third_party:
            rec.status, rec.reason = "incorrect", wrong  # our kernels: the hard gate, untimed
            return rec, False
        rec.timing = _time(case, backend, prepared, source, ctx, nbytes)
        rec.status, rec.reason = ("inaccurate", wrong) if wrong else ("passed", None)
        rec.derive()
        return rec, False
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a record
        if isinstance(exc, KeyboardInterrupt):
            raise
        status, reason, fatal = classify(exc)
        rec.status, rec.reason, rec.traceback = status, reason, traceback.format_exc(limit=6)[-4000:]
        if not fatal:
            fatal = not context_healthy(ctx)
        return rec, fatal
    finally:
        rec.wall_s = round(time.time() - t0, 3)


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


def warm_up(case: Case, backend: Backend, ctx: WorkerContext) -> float | None:
    """Build or load the backend's kernels for `case` on a small case of the same format
    (Backend.warmup_case), once per worker; returns the seconds it took, or None when there
    was nothing to do. Failures are left for the case itself to meet and record."""
    small = backend.warmup_case(case)
    if small is None or (backend.name, small.key) in ctx.built:
        return None
    ctx.built.add((backend.name, small.key))
    if backend.supports(small, ctx.gpu) or (backend.needs_cuda and not ctx.is_cuda):
        return None
    t0 = time.time()
    try:
        src = make_source(small, ctx.device)
        prepared = backend.prepare(small, src)
        prepared.run()
        if ctx.is_cuda:
            import torch

            torch.cuda.synchronize(ctx.device)
    except Exception:  # noqa: BLE001 - the case reports its own failure
        pass
    return round(time.time() - t0, 3)


def timing_fields(timing: Timing) -> TimingFields:
    spread = timing.spread if math.isfinite(timing.spread) else None
    return TimingFields(median_us=timing.median_us, p10_us=timing.p10_us, p90_us=timing.p90_us,
                        n_samples=timing.n_samples, spread=spread, ci_low_us=timing.ci_low_us,
                        ci_high_us=timing.ci_high_us, stop_reason=timing.stop_reason or None,
                        timing_method=timing.method, timing_note=timing.note or None,
                        l2_policy=timing.l2_policy)


def l2_reference_bytes(case: Case) -> int:
    """The bytes a shape's L2 policy is decided from: its KV cache in BF16 as the byte model
    counts it (FlashInfer BF16's format, the largest any backend keeps). Only batch, KV
    length, KV heads and head dim enter it, so every backend of a shape gets the same."""
    return traffic_for_case(case, "bf16").kv_total


def plan_l2(case: Case, nbytes: int, l2_bytes: int | None) -> L2Plan:
    """How L2 is kept cold for a backend moving `nbytes` per step on `case`'s shape
    (suite.timing.shape_l2_plan: rotate or flush by the shape's BF16 cache, then the
    backend's own copies)."""
    return shape_l2_plan(nbytes, l2_reference_bytes(case), l2_bytes, MAX_ROTATE_COPIES, MAX_ROTATE_COPIES_SHAPE)


def _time(case: Case, backend: Backend, prepared: Prepared, source: SourceKV, ctx: WorkerContext,
          nbytes: int) -> TimingFields:
    """Time the prepared step the harness's way: cold L2 (rotated copies or a flush, as the
    shape decides: plan_l2), CUDA graphs where they capture, the clocks sampled around it;
    on the CPU, plain calls."""
    if not ctx.is_cuda:
        fields = timing_fields(time_cpu([prepared.run]))
        fields.l2_verdict = "n/a (cpu)"
        return fields
    from suite.envinfo import clock_sample, load_clocks

    plan = plan_l2(case, nbytes, ctx.gpu.l2_bytes)
    preps = [prepared]
    for _ in range(plan.copies - 1):
        preps.append(backend.prepare(case, clone_source(source)))
    plan = verify_rotation(plan, preps, nbytes)  # from what the copies hold, not what was asked
    policy = plan.policy
    flush = None
    if policy == "flush":
        flush = l2_flush(2 * (ctx.gpu.l2_bytes or 50 << 20), ctx.device)
    before = clock_sample(ctx.nvml, ctx.nvml_handle)
    timing, under_load = time_gpu(
        [p.run for p in preps if isinstance(p, Prepared)],
        l2_policy=policy,
        flush=flush,
        sample_clock=lambda: clock_sample(ctx.nvml, ctx.nvml_handle),
    )
    after = under_load[-1] if under_load else clock_sample(ctx.nvml, ctx.nvml_handle)
    load = load_clocks(before, under_load or [after])
    reasons = load["throttle_reasons"]
    fields = timing_fields(timing)
    fields.l2_detail, fields.l2_verdict, fields.l2_reuse_bytes = plan.detail, plan.verdict, plan.reuse_bytes
    fields.sm_clock_mhz_before = before.get("sm_clock_mhz")
    fields.sm_clock_mhz_after = after.get("sm_clock_mhz")
    fields.mem_clock_mhz_after = after.get("mem_clock_mhz")
    fields.temperature_c_after = after.get("temperature_c")
    fields.power_w_after = after.get("power_w")
    fields.sm_clock_mhz_min, fields.sm_clock_mhz_median = load["sm_clock_mhz_min"], load["sm_clock_mhz_median"]
    fields.power_w_max, fields.throttled_frac = load["power_w_max"], load["throttled_frac"]
    fields.throttled = bool(reasons)
    fields.throttle_reasons = ",".join(reasons)
    del preps
    return fields
