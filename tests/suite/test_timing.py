"""Timing helpers that need no GPU: percentiles, sample counts, the cold-L2 plan."""
import pytest

from suite import timing


def test_percentile_and_summary():
    xs = [float(i) for i in range(1, 101)]
    assert timing.percentile(xs, 0.5) == pytest.approx(50.5)
    assert timing.percentile(xs, 0.1) == pytest.approx(10.9)
    t = timing.summarize(xs, "graph", "size")
    assert (t.median_us, t.n_samples, t.method) == (50.5, 100, "graph")
    assert t.p10_us < t.median_us < t.p90_us


def test_sample_count_bounds():
    assert timing.n_samples_for(10.0) == timing.MAX_SAMPLES
    assert timing.n_samples_for(1e6) == timing.MIN_SAMPLES


def test_l2_plan():
    l2 = 60 * 2**20
    assert timing.l2_plan(17 * 10**9, l2, 32)[:2] == (1, "size")
    copies, policy, detail = timing.l2_plan(40 * 2**20, l2, 32)
    assert (copies, policy) == (6, "rotate:6") and "copies" in detail
    assert timing.l2_plan(100_000, l2, 32)[:2] == (1, "flush")


def test_cpu_timing_runs_every_copy():
    calls = []
    t = timing.time_cpu([lambda: calls.append(0), lambda: calls.append(1)])
    assert t.method == "cpu" and t.n_samples > 0 and set(calls) == {0, 1}


def test_l2_flush_reads_its_buffer_and_writes_nothing_big():
    from suite.timing import l2_flush

    flush = l2_flush(4096, "cpu")
    flush()  # runs; the sweep is a reduction into a scalar, not a write of the buffer
    cells = flush.__closure__
    buf = next(c.cell_contents for c in cells if getattr(c.cell_contents, "numel", lambda: 0)() == 1024)
    assert int(buf.sum()) == 1024
