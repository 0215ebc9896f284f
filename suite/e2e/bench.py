"""Measure whole decode steps: step latency, tokens per second, the attention share, the logits
check, and capacity (the largest batch a memory budget holds in each cache format).

A step is one CUDA graph (on the GPU): embedding, every layer (norm, QKV, RoPE, the KV append
in the backend's format, attention, output projection, MLP), the LM head and the greedy
next token. FOSCAR's caches close a channel-wise group every 128 tokens; that step (the
flush) is its own graph, replayed when the host says a group completes. The attention share
comes from a second graph of the same step with attention replaced by a no-op of the same
shapes (the output buffer is left as it is): attention time = full step - that step.
Steps are timed with CUDA events around each replay, behind a short GPU sleep so the host's
launch latency is not counted; host work between steps (FlashInfer's per-step plan) is
reported apart. On a CPU (tests only) the same steps run eagerly and wall time is taken.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from baselines.base import Backend, GpuInfo, SourceKV, Unsupported
from baselines.growing import GrowingKV, bytes_per_sequence, grow
from core.case import Case
from suite.e2e.model import Decoder, ModelShape, Weights
from suite.timing import percentile

DEFAULT_BACKENDS = ("flashinfer-bf16-tc", "trtllm-xqa-fp8", "foscar-int4", "foscar-int2")
GROUP_SIZE = 128
PAGE_SIZE = 64  # BF16/FP8 pages; FOSCAR's backend rounds it up to whole groups (128)
WARMUP_STEPS = 2
FLUSH_SAMPLES = 3  # forced flush steps timed beyond the ones that fall due
SLEEP_CYCLES = 200_000  # ~0.1 ms of GPU sleep before each timed replay: the host queues ahead
CHECK_BATCH = 3
CHECK_PREFIX = 383  # one short of three groups of 128: the checked step closes a group (a flush)
# Logits are BF16, and a difference in one layer's attention output travels through every later
# layer. On the CPU's 2-layer tiny model two steps differ by about 3e-3 (relative L2) and an
# attention 10% off gives 1.06e-2; on the H200's Llama-3-8B (32 layers) FlashInfer BF16 gives
# 9.7e-3, INT4 9.5e-3 and INT2 1.02e-2 with attention errors of 2.4-3.2e-3
# (docs/data/e2e_h200_d5d7c07.log). The floor is therefore per depth: 1e-2 up to 4 layers, and
# twice the BF16 reference's figure, 2e-2, for the full-size models.
LOGITS_FLOOR = 1e-2
LOGITS_FLOOR_DEEP = 2e-2
# A tolerance alone does not tell a kernel from no kernel: a step whose attention writes nothing
# puts the logits 6.7e-2 from the reference on the tiny model and 6.2e-2 on 32 layers of
# Llama-3-8B's shapes (on a CPU), inside FP8's 8e-2 attention tolerance. So the checked step
# also runs with attention a no-op, and the backend's logits must be at most this fraction of
# that step's distance from the reference (1.55e-2 there; on the H200 FP8 landed at 1.2e-2,
# BF16 at 9.7e-3).
NOATTN_FRACTION = 0.25
RESERVE_BYTES = 2 << 30  # workspaces, CUDA graphs and allocator slack, beyond weights and KV
OOM_RETRIES = 5  # steps of 5% down from the estimate before capacity gives up finding a batch that fits
OOM_STEP = 0.95


@dataclass
class Bench:
    """What every measurement of one run shares: the device, the model and its weights."""

    device: torch.device
    shape: ModelShape
    weights: Weights
    gpu: GpuInfo
    seed: int = 0
    progress: Callable[[str], None] = lambda line: None
    logits_tolerance: dict[str, float] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def gpu_info(device: torch.device) -> GpuInfo:
    if device.type != "cuda":
        return GpuInfo(index=-1, name="cpu")
    props = torch.cuda.get_device_properties(device)
    return GpuInfo(index=device.index or 0, name=props.name, capability=(props.major, props.minor),
                   sm_count=props.multi_processor_count, total_memory_bytes=props.total_memory,
                   l2_bytes=getattr(props, "L2_cache_size", None))


def make_case(shape: ModelShape, backend: Backend, batch: int, kv_len: int) -> Case:
    """The attention case a backend runs for this model and point (its own format's case)."""
    base = Case(batch=batch, kv_len=kv_len, num_q_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads,
                head_dim=shape.head_dim, bits=backend.bits or 4, k_mode="channel", v_mode="token",
                group_size=GROUP_SIZE, page_size=PAGE_SIZE, model=shape.name)
    case = backend.case_for(base)
    if case is None:
        raise Unsupported(f"{backend.name} does not pair with a {base.bits}-bit case.")
    return case


def appends_per_run(steps: int) -> int:
    """Tokens one measurement appends: warm-up, each timed full and no-attention step, forced flushes."""
    return 1 + WARMUP_STEPS + 2 + 2 * steps + FLUSH_SAMPLES + 2


def prefix_source(case: Case, prefix_len: int, device: torch.device, seed: int) -> SourceKV:
    """The cache's starting contents: seeded N(0, 1) BF16 K and V, near the scale of the model's own."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (case.batch, prefix_len, case.num_kv_heads, case.head_dim)
    k = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    q = torch.zeros(case.batch, case.num_q_heads, case.head_dim, dtype=torch.bfloat16, device=device)
    lens = torch.full((case.batch,), prefix_len, dtype=torch.int32, device=device)
    return SourceKV(q=q, k=k, v=v, seq_lens=lens, sm_scale=1.0 / math.sqrt(case.head_dim))


def build(bench: Bench, backend: Backend, case: Case, prefix_len: int, max_len: int, seed: int) -> Decoder:
    source = prefix_source(case, prefix_len, bench.device, seed)
    kv = grow(backend, case, source, bench.shape.num_layers, max_len, release_source=True)
    del source
    gen = torch.Generator(device=bench.device).manual_seed(seed + 1)
    first = torch.randint(0, bench.shape.vocab, (case.batch,), generator=gen, device=bench.device)
    return Decoder(bench.weights, kv, first)


def base_record(bench: Bench, backend: Backend, mode: str, batch: int, kv_len: int) -> dict[str, Any]:
    s = bench.shape
    return {
        "mode": mode, "model": s.name, "model_label": s.label, "num_layers": s.num_layers,
        "model_layers": s.model_layers, "backend": backend.name, "family": backend.family,
        "bits": backend.bits, "kv_format": getattr(backend, "kv_format", None), "batch": batch,
        "kv_len": kv_len, "num_q_heads": s.num_q_heads, "num_kv_heads": s.num_kv_heads,
        "head_dim": s.head_dim, "hidden": s.hidden, "group_size": GROUP_SIZE if backend.family == "foscar" else None,
        "gpu_name": bench.gpu.name, "weight_bytes": bench.weights.nbytes(), "seed": bench.seed,
    }


def free_memory(bench: Bench) -> None:
    gc.collect()
    if bench.is_cuda:
        try:
            torch.cuda.synchronize(bench.device)
            torch.cuda.empty_cache()
        except RuntimeError:  # a dead context: the next point records the error
            pass


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


# --- timing ---------------------------------------------------------------------------------
class _Steps:
    """Runs decode steps of one Decoder: captured graphs on the GPU (one per attention mode and
    flush kind), eager steps on a CPU; keeps the host bookkeeping right; times each step."""

    def __init__(self, decoder: Decoder, cuda: bool):
        self.decoder, self.kv, self.cuda = decoder, decoder.kv, cuda
        self.flushes = self.kv.flush_period is not None
        self.graphs: dict[tuple[str, bool], Any] = {}
        self.pending: list[tuple[tuple[str, bool], Any, Any]] = []
        self.samples: dict[tuple[str, bool], list[float]] = {}
        self.plan_us: list[float] = []

    def capture(self, warm_up: bool = True) -> None:
        """Warm up with one eager step on a side stream (cuBLAS and JIT modules load there), then
        capture every variant. Capturing runs nothing: without the warm-up the caches stay as built
        (the caller must have run an eager step of the same shapes before, on another decoder)."""
        if not self.cuda:
            return
        if warm_up:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.decoder.run_step("backend")
            torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        for attention in ("backend", "none"):
            for flush in ((False, True) if self.flushes else (False,)):
                if attention == "backend":
                    self.kv.plan()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.decoder.step(flush, attention)
                self.graphs[(attention, flush)] = graph
        torch.cuda.synchronize()

    def step(self, attention: str, force_flush: bool = False, timed: bool = True) -> None:
        """One real decode step (it appends a token) through the matching graph."""
        flush = self.kv.flush_due() or (force_flush and self.flushes)
        if attention == "backend":
            t0 = time.perf_counter()
            self.kv.plan()
            self.plan_us.append((time.perf_counter() - t0) * 1e6)
        key = (attention, flush)
        if self.cuda:
            graph = self.graphs[key]
            if timed:
                sleep = getattr(torch.cuda, "_sleep", None)
                if sleep is not None:
                    sleep(SLEEP_CYCLES)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                self.pending.append((key, start, end))
            else:
                graph.replay()
        else:
            t0 = time.perf_counter()
            self.decoder.step(flush, attention)
            if timed:
                self.samples.setdefault(key, []).append((time.perf_counter() - t0) * 1e6)
        self.kv.stepped()

    def collect(self) -> dict[tuple[str, bool], list[float]]:
        if self.cuda:
            torch.cuda.synchronize()
            for key, start, end in self.pending:
                self.samples.setdefault(key, []).append(start.elapsed_time(end) * 1e3)
            self.pending.clear()
        return self.samples


def time_steps(decoder: Decoder, steps: int, cuda: bool) -> dict[str, Any]:
    """Capture, warm up, then `steps` full steps alternating with `steps` no-attention steps, and
    FLUSH_SAMPLES forced flush steps where the format flushes. Returns the timing fields.

    Every step appends, so the context grows by about 2 x steps tokens over the point (70 at
    the default 32 steps: under 2% of a 4K context)."""
    runner = _Steps(decoder, cuda)
    runner.capture()
    for _ in range(WARMUP_STEPS):
        runner.step("backend", timed=False)
    runner.step("none", timed=False)
    if runner.flushes:
        runner.step("backend", force_flush=True, timed=False)
    for _ in range(steps):
        runner.step("backend")
        runner.step("none")
    if runner.flushes:
        for _ in range(FLUSH_SAMPLES):
            runner.step("backend", force_flush=True)
    samples = runner.collect()
    full, bare = samples.get(("backend", False), []), samples.get(("none", False), [])
    flushed = samples.get(("backend", True), [])
    out: dict[str, Any] = {
        "timing_method": "cuda-graph replay, events" if cuda else "eager, wall clock (CPU: plumbing only)",
        "steps": steps, "n_steps": len(full), "n_flush_steps": len(flushed),
        "step_median_us": statistics.median(full), "step_p10_us": percentile(full, 0.1),
        "step_p90_us": percentile(full, 0.9), "noattn_step_median_us": statistics.median(bare),
        "noattn_step_p10_us": percentile(bare, 0.1), "noattn_step_p90_us": percentile(bare, 0.9),
        "host_plan_median_us": statistics.median(runner.plan_us) if runner.plan_us else None,
        "step_samples_us": [round(x, 2) for x in full],
    }
    step = out["step_median_us"]
    period = decoder.kv.flush_period
    if flushed:
        out["flush_step_median_us"] = statistics.median(flushed)
        out["flush_period"] = period
        # Every period-th step closes a group: the mean step over a period.
        out["step_mean_us"] = ((period - 1) * step + out["flush_step_median_us"]) / period
    else:
        out["step_mean_us"] = step
    out["tokens_per_s"] = decoder.batch * 1e6 / out["step_mean_us"]
    out["attn_us"] = step - out["noattn_step_median_us"]
    out["rest_us"] = out["noattn_step_median_us"]
    out["attn_share"] = out["attn_us"] / step
    return out


# --- one measured point -----------------------------------------------------------------------
def kv_budget_bytes(bench: Bench, reserve_bytes: int = RESERVE_BYTES) -> int:
    """Default memory budget for KV and activations: the GPU's free memory now (weights already
    loaded) less a reserve for workspaces, CUDA graphs and allocator slack."""
    if not bench.is_cuda:
        return 1 << 30
    free, _ = torch.cuda.mem_get_info(bench.device)
    return max(0, free - reserve_bytes)


def bytes_per_seq(bench: Bench, backend: Backend, kv_len: int, steps: int) -> int:
    """One sequence's KV (every layer, with room for the run's appends) plus its activations."""
    case = make_case(bench.shape, backend, 1, kv_len)
    kv = bytes_per_sequence(backend, case, kv_len + appends_per_run(steps), bench.shape.num_layers)
    return kv + bench.shape.activation_bytes(1)


def measure(bench: Bench, backend: Backend, batch: int, kv_len: int, steps: int, *, mode: str = "grid",
            budget_bytes: int | None = None) -> dict[str, Any]:
    """One (backend, batch, KV length) point: build the caches, capture, time. Never raises for the
    backend's failure: the record's status says what happened."""
    rec = base_record(bench, backend, mode, batch, kv_len)
    t0 = time.time()
    try:
        case = make_case(bench.shape, backend, batch, kv_len)
        rec["page_size"] = case.page_size
        reason = backend.supports(case, bench.gpu if bench.is_cuda else None)
        if reason:
            return {**rec, "status": "unsupported", "reason": reason}
        need = batch * bytes_per_seq(bench, backend, kv_len, steps)
        rec.update(kv_activation_bytes_est=need, budget_bytes=budget_bytes)
        if budget_bytes is not None and need > budget_bytes:
            return {**rec, "status": "does_not_fit",
                    "reason": f"needs about {need / 1e9:.1f} GB of KV and activations; the budget is {budget_bytes / 1e9:.1f} GB."}
        if bench.is_cuda:
            torch.cuda.reset_peak_memory_stats(bench.device)
        decoder = build(bench, backend, case, kv_len, kv_len + appends_per_run(steps), bench.seed)
        rec["kv_bytes"] = decoder.kv.nbytes()
        rec.update(time_steps(decoder, steps, bench.is_cuda))
        if bench.is_cuda:
            rec["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(bench.device)
        rec["status"] = "passed"
    except Unsupported as exc:
        rec.update(status="unsupported", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - one point's failure is its record, not the run's end
        rec.update(status="oom" if is_oom(exc) else "error", reason=f"{type(exc).__name__}: {str(exc)[:400]}")
    finally:
        decoder = None
        free_memory(bench)
    rec["wall_s"] = round(time.time() - t0, 2)
    return rec


def next_capacity_batch(fits: int | None, fails: int | None, ooms: int) -> int | None:
    """The batch capacity tries next, given the largest that ran (fits) and the smallest that ran
    out of memory (fails): 5% below a failure until one fits (at most OOM_RETRIES times), then the
    midpoint between the two until they are one apart. None: the search is over."""
    if fails is None:
        return None  # the estimate itself ran (or nothing has run yet: the caller starts there)
    if fits is None:
        lower = min(fails - 1, int(fails * OOM_STEP))
        return lower if lower >= 1 and ooms <= OOM_RETRIES else None
    return (fits + fails) // 2 if fails - fits > 1 else None


def capacity(bench: Bench, backend: Backend, kv_len: int, steps: int, budget_bytes: int) -> dict[str, Any]:
    """The largest batch of kv_len-token sequences the budget holds in this backend's format, and
    its throughput. If the estimate runs out of memory, 5% fewer until a batch runs, then a
    bisection between the largest batch that ran and the smallest that did not
    (next_capacity_batch). Every attempt's batch, status and reason stay in capacity_attempts."""
    per_seq = bytes_per_seq(bench, backend, kv_len, steps)
    estimate = budget_bytes // per_seq
    if estimate < 1:
        rec = base_record(bench, backend, "capacity", 0, kv_len)
        return {**rec, "status": "does_not_fit", "budget_bytes": budget_bytes, "bytes_per_seq": per_seq,
                "reason": f"one sequence needs {per_seq / 1e9:.1f} GB; the budget is {budget_bytes / 1e9:.1f} GB."}
    attempts: list[dict[str, Any]] = []
    fits = fails = best = None
    ooms = 0
    batch: int | None = int(estimate)
    while batch is not None:
        rec = measure(bench, backend, batch, kv_len, steps, mode="capacity", budget_bytes=budget_bytes)
        attempts.append({"batch": batch, "status": rec["status"], "reason": rec.get("reason")})
        if rec["status"] == "passed":
            fits, best = batch, rec
        elif rec["status"] == "oom":
            fails, ooms = batch, ooms + 1
        else:  # neither ran nor ran out of memory: nothing to bisect on
            break
        following = next_capacity_batch(fits, fails, ooms)
        if following is not None:
            what = "ran out of memory" if rec["status"] == "oom" else "ran"
            bench.progress(f"  {backend.name}: {batch} sequences {what}; trying {following}")
        batch = following
    final = best if best is not None else rec
    final.update(capacity_estimate=int(estimate), capacity_batch=fits if fits is not None else attempts[-1]["batch"],
                 bytes_per_seq=per_seq, capacity_backoffs=ooms,
                 capacity_attempts=attempts)
    return final


# --- the logits check -----------------------------------------------------------------------------
def reference_attention(kv: GrowingKV) -> Callable[[int, torch.Tensor, torch.Tensor], None]:
    """Float64 attention over the layer's cache as the backend stores it, dequantized."""
    from foscar.reference import attention_f64

    def attend(layer: int, q: torch.Tensor, out: torch.Tensor) -> None:
        k, v, lens = kv.reference_kv(layer)
        out.copy_(attention_f64(q, k, v, lens.to(q.device), kv.sm_scale).to(out.dtype))

    return attend


def logits_floor(num_layers: int) -> float:
    """The noise of a correct step's logits in a model this deep (the bf16 rounding of logits whose
    hidden states differ at all, grown through the layers)."""
    return LOGITS_FLOOR if num_layers <= 4 else LOGITS_FLOOR_DEEP


def logits_tolerance(backend: Backend, num_layers: int = 1) -> float:
    """Relative L2 the logits may differ by at most: the backend's own attention tolerance, and
    never below the floor of a model this deep. Not enough on its own (check_verdict)."""
    return max(backend.tolerance, logits_floor(num_layers))


def check_verdict(error: float, noattn_error: float, tolerance: float, floor: float,
                  finite: bool = True) -> tuple[str, str | None, float]:
    """(status, reason, bound) of the logits check. The bound is the tolerance or NOATTN_FRACTION of
    the no-attention step's error, whichever is smaller: a kernel must sit much closer to the
    reference than no attention at all does, however loose its tolerance. An error above the bound
    but within the floor (a correct step's noise) says nothing when the bound is below the floor
    (attention moves these logits too little): the status is then "error", and the reason says
    the check could not tell."""
    bound = min(tolerance, NOATTN_FRACTION * noattn_error)
    if not finite:
        return "incorrect", "the backend's logits hold NaN/Inf.", bound
    if error <= bound:
        return "passed", None, bound
    if error > tolerance:
        return "incorrect", f"logits relative L2 error {error:.3g} exceeds {tolerance:g}.", bound
    if error > floor:
        return "incorrect", (
            f"logits relative L2 error {error:.3g} is more than {NOATTN_FRACTION:g} of the same step's with "
            f"attention a no-op ({noattn_error:.3g}): the kernel is too close to one that writes nothing."), bound
    return "error", (
        f"undecided: the step with attention a no-op is only {noattn_error:.3g} from the reference, so "
        f"{NOATTN_FRACTION:g} of it ({bound:.3g}) is below the {floor:g} noise of a correct step and the "
        f"backend's {error:.3g} cannot be told from a broken kernel; check at a shape where attention "
        "moves the logits more."), bound


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    den = float(b.double().norm())
    return float((a.double() - b.double()).norm()) / den if den else float("inf")


def check(bench: Bench, backend: Backend, batch: int = CHECK_BATCH, prefix_len: int = CHECK_PREFIX) -> dict[str, Any]:
    """One full step three times from the same start: with the backend's attention (on the GPU,
    the step's captured graph), with float64 attention over the backend's own cache (dequantized),
    and with attention a no-op (its output left at zero). The backend's logits must agree with the
    reference's to the tolerance and sit much closer to them than the no-op's (check_verdict).
    The default prefix makes the step close a group."""
    rec = base_record(bench, backend, "check", batch, prefix_len)
    tol = bench.logits_tolerance.get(backend.name, logits_tolerance(backend, bench.shape.num_layers))
    floor = logits_floor(bench.shape.num_layers)
    rec.update(logits_tolerance=tol, logits_floor=floor, noattn_fraction=NOATTN_FRACTION)
    t0 = time.time()
    mine = ref = bare = runner = None
    try:
        case = make_case(bench.shape, backend, batch, prefix_len)
        rec["page_size"] = case.page_size
        reason = backend.supports(case, bench.gpu if bench.is_cuda else None)
        if reason:
            return {**rec, "status": "unsupported", "reason": reason}
        mine = build(bench, backend, case, prefix_len, prefix_len + 2, bench.seed)
        runner = _Steps(mine, bench.is_cuda)
        if bench.is_cuda:
            # Warm cuBLAS and the JIT modules with a throw-away copy's step on a side stream, and
            # this copy's kernels with attention alone (it leaves the cache as built); then capture.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                build(bench, backend, case, prefix_len, prefix_len + 2, bench.seed).run_step("backend")
                mine.kv.warm(torch.zeros_like(mine.attn_out), torch.empty_like(mine.attn_out))
            torch.cuda.current_stream().wait_stream(side)
        runner.capture(warm_up=False)
        rec["flushed"] = mine.kv.flush_due()
        runner.step("backend", timed=False)
        ref = build(bench, backend, case, prefix_len, prefix_len + 2, bench.seed)
        ref.run_step(reference_attention(ref.kv))
        bare = build(bench, backend, case, prefix_len, prefix_len + 2, bench.seed)
        bare.run_step("none")
        got, want = mine.logits, ref.logits
        rec["logits_rel_error"] = rel_l2(got, want)
        rec["noattn_logits_rel_error"] = rel_l2(bare.logits, want)
        rec["top1_agreement"] = float((got.argmax(-1) == want.argmax(-1)).double().mean())
        status, reason, bound = check_verdict(rec["logits_rel_error"], rec["noattn_logits_rel_error"], tol, floor,
                                              finite=bool(torch.isfinite(got).all()))
        # the bound the error was held to; the backend's own (looser) one stays in logits_tolerance_abs
        rec.update(status=status, logits_tolerance=bound, logits_tolerance_abs=tol, check_undecided=status == "error")
        if reason:
            rec["reason"] = reason
    except Unsupported as exc:
        rec.update(status="unsupported", reason=str(exc))
    except Exception as exc:  # noqa: BLE001
        rec.update(status="oom" if is_oom(exc) else "error", reason=f"{type(exc).__name__}: {str(exc)[:400]}")
    finally:
        mine = ref = bare = runner = None
        free_memory(bench)
    rec["wall_s"] = round(time.time() - t0, 2)
    return rec
