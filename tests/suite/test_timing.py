"""Timing logic that needs no GPU: percentiles, the median's confidence interval, the rule
that stops sampling on noise (with a fake sampler and clock), the cold-L2 plan and its
verdict."""
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


def test_l2_flush_reads_its_buffer_and_writes_nothing_big():
    from suite.timing import l2_flush

    flush = l2_flush(4096, "cpu")
    flush()  # runs; the sweep is a reduction into a scalar, not a write of the buffer
    cells = flush.__closure__
    buf = next(c.cell_contents for c in cells if getattr(c.cell_contents, "numel", lambda: 0)() == 1024)
    assert int(buf.sum()) == 1024
