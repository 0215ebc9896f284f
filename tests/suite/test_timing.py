"""Timing logic that needs no GPU: percentiles, the median's confidence interval, the rule
that stops sampling on noise (with a fake sampler and clock), the cold-L2 plan (per byte
count and per shape) and its verdict."""
import math
import random
import statistics

import pytest

from suite import timing
from suite.timing import StopRule, sample_until_stable


def test_percentile_and_summary():
    xs = [float(i) for i in range(1, 101)]
    assert timing.percentile(xs, 0.5) == pytest.approx(50.5)
    assert timing.percentile(xs, 0.1) == pytest.approx(10.9)
    t = timing.summarize(xs, "graph", "size")
    assert (t.median_us, t.n_samples, t.method) == (50.5, 100, "graph")
    assert t.p10_us < t.ci_low_us < t.median_us < t.ci_high_us < t.p90_us
    assert t.spread == pytest.approx((t.ci_high_us - t.ci_low_us) / t.median_us)


def test_median_ci_is_the_textbook_interval():
    # n = 100: the 95% interval of the median runs from the 40th to the 61st order statistic
    xs = [float(i) for i in range(1, 101)]
    assert timing.median_ci(xs) == (40.0, 61.0)
    assert timing.median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few: the whole range


def test_median_ci_covers_the_true_median_about_95_percent():
    rng = random.Random(1)
    hits = 0
    for _ in range(400):
        xs = [rng.lognormvariate(0.0, 0.3) for _ in range(60)]  # true median 1.0
        lo, hi = timing.median_ci(xs)
        hits += lo <= 1.0 <= hi
    assert 0.91 <= hits / 400 <= 0.99


class FakeGpu:
    """Samples around `median_us` with relative jitter `sigma`; a fake clock that advances
    by the sampled time plus a fixed host cost per batch."""

    def __init__(self, median_us: float, sigma: float, seed: int = 0, host_s: float = 1e-4):
        self.rng, self.median, self.sigma, self.host_s = random.Random(seed), median_us, sigma, host_s
        self.now = 0.0
        self.batches = []

    def take(self, n: int) -> list[float]:
        self.batches.append(n)
        out = [self.median * math.exp(self.rng.gauss(0.0, self.sigma)) for _ in range(n)]
        self.now += sum(out) * 1e-6 + self.host_s
        return out

    def clock(self) -> float:
        return self.now


def test_quiet_kernel_converges_to_the_target_spread():
    gpu = FakeGpu(1000.0, 0.005)
    rule = StopRule(target_spread=0.005, min_samples=25, min_time_s=0.0, max_time_s=5.0)
    samples, why = sample_until_stable(gpu.take, rule, clock=gpu.clock)
    assert why == "converged"
    assert timing.spread_of(samples) <= 0.005 and len(samples) >= 25
    assert statistics.median(samples) == pytest.approx(1000.0, rel=0.005)


def test_noisier_kernel_takes_more_samples_and_narrows_the_interval():
    rule = StopRule(target_spread=0.005, min_samples=25, min_time_s=0.0, max_time_s=60.0)
    quiet, _ = sample_until_stable(FakeGpu(100.0, 0.005).take, rule, clock=FakeGpu(1, 0).clock)
    noisy_gpu = FakeGpu(100.0, 0.03)
    noisy, why = sample_until_stable(noisy_gpu.take, rule, clock=noisy_gpu.clock)
    assert why == "converged" and len(noisy) > 4 * len(quiet)
    assert timing.spread_of(noisy) <= 0.005


def test_max_time_stops_a_kernel_too_noisy_to_converge():
    gpu = FakeGpu(1000.0, 0.5)  # 50% jitter: 0.5% would need ~10^5 samples
    rule = StopRule(target_spread=0.005, min_samples=25, min_time_s=0.0, max_time_s=0.2)
    samples, why = sample_until_stable(gpu.take, rule, clock=gpu.clock)
    assert why == "max_time"
    assert gpu.now <= 0.2 + 40 * 1000.0 * 5e-6  # stops within one batch of the limit
    assert timing.spread_of(samples) > 0.005  # the spread says it did not converge


def test_min_time_keeps_a_tiny_kernel_sampling():
    gpu = FakeGpu(5.0, 0.001)  # converges at 25 samples, but 25 x 5 us is 125 us
    rule = StopRule(target_spread=0.005, min_samples=25, min_time_s=0.01, max_time_s=10.0)
    samples, why = sample_until_stable(gpu.take, rule, clock=gpu.clock)
    assert why == "converged" and sum(samples) * 1e-6 >= 0.01 and len(samples) >= 2000


def test_max_samples_and_batches():
    gpu = FakeGpu(10.0, 0.5)
    rule = StopRule(target_spread=1e-9, min_samples=25, min_time_s=0.0, max_time_s=1e9, max_samples=130)
    samples, why = sample_until_stable(gpu.take, rule, batch=40, clock=gpu.clock)
    assert why == "max_samples" and len(samples) == 130
    assert gpu.batches[0] == 25 and max(gpu.batches) <= 40


def test_cpu_timing_runs_every_copy_and_reports_its_spread():
    calls = []
    t = timing.time_cpu([lambda: calls.append(0), lambda: calls.append(1)])
    assert t.method == "cpu" and t.n_samples >= 10 and set(calls) == {0, 1}
    assert t.stop_reason in ("converged", "max_time", "max_samples") and t.spread >= 0


def test_l2_plan_policies_and_verdicts():
    l2 = 60 * 2**20
    size = timing.l2_plan(17 * 10**9, l2, 32)
    assert (size.copies, size.policy, size.verdict) == (1, "size", "cold")
    rot = timing.l2_plan(40 * 2**20, l2, 32)
    assert (rot.copies, rot.policy, rot.verdict) == (6, "rotate:6", "cold") and "copies" in rot.detail
    assert rot.reuse_bytes == 5 * 40 * 2**20
    flush = timing.l2_plan(100_000, l2, 32)
    assert (flush.copies, flush.policy, flush.verdict) == (1, "flush", "cold")
    unknown = timing.l2_plan(40 * 2**20, None, 32)
    assert unknown.verdict == "unknown" and "assumed" in unknown.detail



# --- the shape's L2 plan (suite.timing.shape_l2_plan): pure, at a 50 MB L2 ------------------
L2_50MB = 50 * 10**6
BF16_B1_4K = 2 * 4096 * 8 * 128 * 2  # K and V of Llama-3-8B's 8 KV heads, d 128, in BF16: 16.8 MB
INT4_B1_4K = 4472964  # the byte model's INT4 step at batch 1 / 4K


def test_shape_plan_rotates_every_backend_where_the_bf16_cache_would():
    ref = timing.l2_plan(BF16_B1_4K, L2_50MB, 32)
    assert ref.policy == "rotate:12"  # 200 MB / 16.8 MB
    assert timing.l2_plan(INT4_B1_4K, L2_50MB, 32).policy == "flush"  # the per-backend rule: 45 > 32
    plan = timing.shape_l2_plan(INT4_B1_4K, BF16_B1_4K, L2_50MB, 32, 256)
    assert (plan.policy, plan.copies, plan.rule, plan.verdict) == ("rotate:45", 45, timing.RULE_SHAPE_ROTATES, "cold")
    assert plan.detail.startswith("rotate:45 (shape rotates: its BF16 cache of 16.8 MB needs 12 copies); 45 copies")
    assert plan.reuse_bytes == 44 * INT4_B1_4K
    bf16 = timing.shape_l2_plan(BF16_B1_4K, BF16_B1_4K, L2_50MB, 32, 256)
    assert bf16.policy == ref.policy and bf16.rule == timing.RULE_SHAPE_ROTATES
    # a shape whose BF16 cache alone is over 4x L2 rotates too: each backend as its own bytes need
    big = timing.shape_l2_plan(300 * 10**6, 1200 * 10**6, L2_50MB, 32, 256)
    assert big.policy == "size" and big.detail.startswith("size (shape rotates: its BF16 cache of 1200 MB needs 1 copy)")


def test_shape_plan_flushes_every_backend_where_the_bf16_cache_would():
    ref_bytes = 2 * 128 * 8 * 128 * 2  # batch 1 / 128 tokens: 0.5 MB, 382 copies
    for own in (ref_bytes, 150_000, 80_000):
        plan = timing.shape_l2_plan(own, ref_bytes, L2_50MB, 32, 256)
        assert (plan.policy, plan.copies, plan.rule, plan.verdict) == ("flush", 1, timing.RULE_SHAPE_FLUSHES, "cold")
        assert plan.detail == ("flush (shape flushes: its BF16 cache of 0.5 MB would need 382 copies, over 32); "
                               "flush 100 MB before each sample")


def test_shape_plan_falls_back_to_a_flush_over_the_cap_and_says_so():
    plan = timing.shape_l2_plan(100_000, BF16_B1_4K, L2_50MB, 32, 256)  # 2000 copies of its own
    assert (plan.policy, plan.rule) == ("flush", timing.RULE_OVER_CAP)
    assert plan.detail.startswith("flush (shape rotates: its BF16 cache of 16.8 MB needs 12 copies, but this "
                                  "backend's 0.1 MB would need 2000 copies, over the cap of 256: flushed instead); flush")
    at_cap = timing.shape_l2_plan(-(-4 * L2_50MB // 256), BF16_B1_4K, L2_50MB, 32, 256)
    assert at_cap.policy == "rotate:256"


def test_shape_plan_names_bad_values_and_an_assumed_l2():
    with pytest.raises(ValueError, match="reference_bytes=0"):
        timing.shape_l2_plan(1000, 0, L2_50MB, 32, 256)
    with pytest.raises(ValueError, match="max_copies=16"):
        timing.shape_l2_plan(1000, BF16_B1_4K, L2_50MB, 32, 16)
    with pytest.raises(ValueError, match="bytes_per_copy=-1"):
        timing.copies_needed(-1, L2_50MB)
    unknown = timing.shape_l2_plan(INT4_B1_4K, BF16_B1_4K, None, 32, 256)
    assert unknown.verdict == "unknown" and "assumed" in unknown.detail and unknown.rule == timing.RULE_SHAPE_ROTATES
    # the per-byte-count plan keeps its text and has no rule
    flush = timing.l2_plan(100_000, 60 * 2**20, 32)
    assert flush.detail == "flush 126 MB before each sample (would need 2517 copies)" and flush.rule == ""

def _prepared(*tensors):
    from baselines.base import Prepared

    def run():
        return [t.sum() for t in tensors]

    return Prepared(run=run, reference_kv=lambda idx: None, keepalive=list(tensors))


def test_rotation_verdict_counts_what_the_copies_really_hold():
    import torch

    l2 = 4096 * 4  # a 16 KB "L2" so the test tensors are small
    plan = timing.l2_plan(4096, l2, 32)  # 4 KB per copy: 16 copies planned
    assert plan.policy == "rotate:16" and plan.cold
    distinct = [_prepared(torch.zeros(1024)) for _ in range(plan.copies)]  # 4 KB each, own data
    assert timing.verify_rotation(plan, distinct, 4096).verdict == "cold"
    shared = torch.zeros(1024)
    same = [_prepared(shared) for _ in range(plan.copies)]  # every copy reads one tensor
    warm = timing.verify_rotation(plan, same, 4096)
    assert warm.verdict == "warm" and "shared by the copies" in warm.detail and "warm" in warm.detail
    # a tensor reached only through the run closure counts too
    from baselines.base import Prepared

    def closure_copy():
        t = torch.zeros(1024)
        return Prepared(run=lambda: t.sum(), reference_kv=lambda idx: None)

    assert timing.verify_rotation(plan, [closure_copy() for _ in range(16)], 4096).verdict == "cold"


def test_rotation_verdict_counts_what_the_step_reads_not_the_cloned_source():
    # Every copy is prepared from its own clone of the source and our step's closure reaches
    # it (source.sm_scale): the clone must not count as the copy's data, or a rotation over
    # one shared cache would be judged cold (/tmp/rev_suite/rot.py).
    import torch

    from baselines.base import Prepared
    from core.case import Case
    from suite.runner import clone_source, make_source

    source = make_source(Case(batch=1, kv_len=1024, num_q_heads=4, num_kv_heads=1, head_dim=64), torch.device("cpu"))
    nbytes = 16 * 1024
    plan = timing.l2_plan(nbytes, 4 * nbytes, 256)
    assert plan.policy == "rotate:16" and plan.cold

    def copy(src, cache):
        q = src.q

        def run():
            return cache.sum() * q.sum() * src.sm_scale

        return Prepared(run=run, reference_kv=lambda idx: (src.k, src.v), inputs=[q, cache])

    def rotation(cache_for):
        return [copy(source, cache_for())] + [copy(clone_source(source), cache_for()) for _ in range(plan.copies - 1)]

    shared = torch.randn(nbytes // 4)
    warm = timing.verify_rotation(plan, rotation(lambda: shared), nbytes)
    assert warm.verdict == "warm" and "shared by the copies" in warm.detail
    assert warm.reuse_bytes == (plan.copies - 1) * source.q.untyped_storage().nbytes()  # the queries alone
    cold = timing.verify_rotation(plan, rotation(lambda: torch.randn(nbytes // 4)), nbytes)
    assert cold.verdict == "cold" and cold.reuse_bytes == (plan.copies - 1) * nbytes
    # without `inputs` the whole Prepared counts, cloned source included: the old reading
    legacy = [Prepared(run=p.run, reference_kv=p.reference_kv) for p in rotation(lambda: shared)]
    assert timing.verify_rotation(plan, legacy, nbytes).verdict == "cold"


def test_torch_ref_names_what_its_step_reads():
    import torch

    pytest.importorskip("foscar")
    from baselines.base import get_backend
    from core.case import Case
    from suite.runner import make_source

    backend = get_backend("torch-ref")
    case = backend.case_for(Case(batch=1, kv_len=256, num_q_heads=4, num_kv_heads=1, head_dim=128))
    source = make_source(case, torch.device("cpu"))
    prepared = backend.prepare(case, source)
    read = timing.reachable_storages(prepared.inputs)
    assert ("cpu", source.q.untyped_storage().data_ptr()) in read  # its query
    assert not {("cpu", t.untyped_storage().data_ptr()) for t in (source.k, source.v)} & set(read)
    assert sum(read.values()) >= 2 * case.kv_len * case.num_kv_heads * case.head_dim * 2  # its BF16 K and V


def test_rotation_verdict_of_a_shape_plan_keeps_its_rule():
    import torch

    l2 = 4096 * 4
    plan = timing.shape_l2_plan(4096, 8 * 4096, l2, 32, 256)  # the "BF16" reference: 2 copies; own: 16
    assert plan.policy == "rotate:16" and plan.rule == timing.RULE_SHAPE_ROTATES
    cold = timing.verify_rotation(plan, [_prepared(torch.zeros(1024)) for _ in range(plan.copies)], 4096)
    assert (cold.verdict, cold.rule, cold.detail) == ("cold", plan.rule, plan.detail)
    shared = torch.zeros(1024)
    warm = timing.verify_rotation(plan, [_prepared(shared) for _ in range(plan.copies)], 4096)
    assert warm.verdict == "warm" and warm.detail.startswith(plan.detail + "; measured:") and warm.rule == plan.rule
    flushed = timing.shape_l2_plan(4096, 100, l2, 32, 256)
    assert timing.verify_rotation(flushed, [object()], 4096) is flushed  # a flush is not rotation: left as it is


class _FakeStream:
    """One CUDA stream, faked: work is queued and runs only when the host waits for it."""

    def __init__(self):
        self.queued, self.ran = [], []

    def put(self, op):
        self.queued.append(op)

    def run_to(self, op=None):
        while self.queued and (op is None or op in self.queued):
            self.ran.append(self.queued.pop(0))


def test_clocks_are_read_while_the_timed_kernels_run(monkeypatch):
    # Each batch queues a GPU sleep, then its samples: NVML must be read after the sleep has
    # ended on the GPU and before the batch's last sample ends, not while the GPU still spins.
    import torch

    stream = _FakeStream()

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            stream.put(self)

        def synchronize(self):
            stream.run_to(self)

        def elapsed_time(self, end):
            return 0.01

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: stream.run_to())
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: stream.put(("sleep", cycles)), raising=False)
    seen = []

    def sample_clock():
        sleeps = [op for op in stream.ran if isinstance(op, tuple)]
        seen.append((len(sleeps), stream.queued[-1] in stream.ran))  # (sleeps over, batch over)
        return {"sm_clock_mhz": 1980}

    rule = StopRule(target_spread=1.0, min_samples=5, min_time_s=0.0, max_time_s=5.0, max_samples=12)
    timed, clocks = timing.time_gpu([lambda: stream.put("kernel")], l2_policy="size", use_graphs=False,
                                    sample_clock=sample_clock, rule=rule)
    assert timed.n_samples >= 5 and len(clocks) == len(seen) >= 1
    assert seen == [(i + 1, False) for i in range(len(seen))]  # this batch's sleep over, its samples not


def test_l2_flush_reads_its_buffer_and_writes_nothing_big():
    from suite.timing import l2_flush

    flush = l2_flush(4096, "cpu")
    flush()  # runs; the sweep is a reduction into a scalar, not a write of the buffer
    cells = flush.__closure__
    buf = next(c.cell_contents for c in cells if getattr(c.cell_contents, "numel", lambda: 0)() == 1024)
    assert int(buf.sum()) == 1024
