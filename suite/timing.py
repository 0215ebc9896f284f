"""How one decode step is timed: CUDA-graph replay (events around each replay) where the
thunk can be captured, plain launches where it cannot; warm-up first; L2 kept cold by
rotating prepared copies or by flushing; median, p10 and p90 of the samples.

Samples are queued behind a short GPU sleep so the host never starves the stream: the
events then time the GPU alone, not Python's launch latency.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

WARMUP_RUNS = 3
MIN_SAMPLES = 25
MAX_SAMPLES = 400
TIME_BUDGET_S = 0.4  # timed GPU time per case, beyond warm-up
BATCH = 40  # samples queued behind one GPU sleep
SLEEP_CYCLES_PER_SAMPLE = 60_000  # ~30 us at 2 GHz: host time to queue one sample


@dataclass
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    n_samples: int
    method: str  # "graph", "events" or "cpu"
    l2_policy: str
    samples_us: list[float] = field(default_factory=list, repr=False)
    note: str = ""


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_us: Sequence[float], method: str, l2_policy: str, note: str = "") -> Timing:
    return Timing(
        median_us=statistics.median(samples_us),
        p10_us=percentile(samples_us, 0.10),
        p90_us=percentile(samples_us, 0.90),
        n_samples=len(samples_us),
        method=method,
        l2_policy=l2_policy,
        samples_us=list(samples_us),
        note=note,
    )


def n_samples_for(estimate_us: float) -> int:
    if estimate_us <= 0:
        return MAX_SAMPLES
    return max(MIN_SAMPLES, min(MAX_SAMPLES, int(TIME_BUDGET_S * 1e6 / estimate_us)))


# --- CPU (tests and --cpu runs only: a CPU time says nothing about a GPU kernel) -------
def time_cpu(runs: Sequence[Callable[[], Any]], l2_policy: str = "n/a (cpu)") -> Timing:
    for r in runs:
        r()
    samples = []
    n = min(MIN_SAMPLES, 10)
    for i in range(n):
        t0 = time.perf_counter()
        runs[i % len(runs)]()
        samples.append((time.perf_counter() - t0) * 1e6)
    return summarize(samples, "cpu", l2_policy)


# --- GPU ----------------------------------------------------------------------------------
def capture_graphs(runs: Sequence[Callable[[], Any]]) -> tuple[list[Callable[[], Any]], str]:
    """One CUDA graph per prepared copy; falls back to the plain thunks (and says why)
    when a backend cannot be captured (host syncs, allocations outside the graph pool)."""
    import torch

    graphs = []
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for r in runs:  # capture-time warm-up on the side stream, as torch advises
                r()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for r in runs:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                r()
            graphs.append(g)
        for g in graphs:
            g.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - not capturable: time plain launches
        torch.cuda.synchronize()
        if "illegal memory access" in str(exc) or "device-side assert" in str(exc):
            raise
        return list(runs), f"not graph-capturable ({type(exc).__name__}: {str(exc)[:200]})"
    return [g.replay for g in graphs], ""


def time_gpu(
    runs: Sequence[Callable[[], Any]],
    *,
    l2_policy: str,
    flush: Callable[[], Any] | None = None,
    use_graphs: bool = True,
    sample_clock: Callable[[], Any] | None = None,
) -> tuple[Timing, Any]:
    """Time one decode step over `runs` (one thunk per prepared copy, rotated in turn).

    flush: called (on the GPU stream) before every sample when L2 is kept cold by
    flushing. sample_clock: called once while the last batch is still running, so clocks
    and throttle reasons are read under load; its result is returned beside the timing.
    """
    import torch

    for _ in range(WARMUP_RUNS):
        for r in runs:
            r()
    torch.cuda.synchronize()
    launchers, note = capture_graphs(runs) if use_graphs else (list(runs), "graphs off")
    method = "graph" if not note else "events"
    sleep = getattr(torch.cuda, "_sleep", None)

    def timed_batch(n: int, offset: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        if sleep is not None:
            sleep(SLEEP_CYCLES_PER_SAMPLE * n)
        for i, (start, end) in enumerate(events):
            if flush is not None:
                flush()
            start.record()
            launchers[(offset + i) % len(launchers)]()
            end.record()
        return events

    def collect(events) -> list[float]:
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in events]

    estimate = collect(timed_batch(min(5, BATCH), 0))
    n_total = n_samples_for(statistics.median(estimate))
    samples: list[float] = []
    clock = None
    offset = 0
    while len(samples) < n_total:
        n = min(BATCH, n_total - len(samples))
        events = timed_batch(n, offset)
        offset += n
        if len(samples) + n >= n_total and sample_clock is not None:
            clock = sample_clock()  # the GPU is still busy with this batch
        samples.extend(collect(events))
    return summarize(samples, method, l2_policy, note), clock


def l2_plan(bytes_per_copy: int, l2_bytes: int | None, max_copies: int, factor: int = 4) -> tuple[int, str, str]:
    """(copies, l2_policy, detail): how many prepared copies to rotate so the working set
    exceeds factor x L2. l2_policy is 'size' (one copy is already that big), 'rotate:N',
    or 'flush' (more than max_copies would be needed: one copy, L2 flushed before each
    sample)."""
    l2 = l2_bytes or 50 * 1024 * 1024
    target = factor * l2
    if bytes_per_copy <= 0:
        return 1, "flush", f"flush {2 * l2 / 1e6:.0f} MB before each sample"
    copies = -(-target // bytes_per_copy)
    if copies <= 1:
        return 1, "size", f"one copy of {bytes_per_copy / 1e6:.0f} MB >= {factor}x L2 ({l2 / 1e6:.0f} MB)"
    if copies <= max_copies:
        return int(copies), f"rotate:{int(copies)}", (
            f"{int(copies)} copies, {copies * bytes_per_copy / 1e6:.0f} MB >= {factor}x L2 ({l2 / 1e6:.0f} MB)"
        )
    return 1, "flush", f"flush {2 * l2 / 1e6:.0f} MB before each sample (would need {int(copies)} copies)"


def l2_flush(nbytes: int, device: Any) -> Callable[[], Any]:
    """A function that sweeps `nbytes` through the cache by READING them: a write would leave
    L2 full of dirty lines whose write-back the timed kernel would then pay for."""
    import torch

    buf = torch.ones(max(1, nbytes // 4), dtype=torch.int32, device=device)
    sink = torch.empty((), dtype=torch.int64, device=device)

    def flush() -> None:
        torch.sum(buf, dim=0, out=sink)  # buf and sink live as long as flush does

    return flush
