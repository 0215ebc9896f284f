"""GPU checks of the harness itself (skipped cleanly without CUDA): honest timing fields,
the read ceiling, crash isolation with a real illegal memory access, and, when FlashInfer
is installed, its tensor-core decode through the whole path."""
import pytest
import torch

import harness_doubles

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def ctx():
    from suite.worker import make_context

    return make_context("0", {"read_ceiling": True, "read_ceiling_quick": True})


def test_read_ceiling(ctx):
    assert ctx.read_ceiling_tbps and ctx.read_ceiling_tbps > 0.5
    peak = ctx.gpu_env.get("bus_peak_tbps")
    if peak:
        assert ctx.read_ceiling_tbps < 1.05 * peak
    found = ctx.gpu_env["read_ceiling"]
    assert found["rounds"] >= 1 and 0 <= found["spread"] < 0.2 and len(found["candidates"]) >= 5


def test_stub_is_checked_and_timed(ctx):
    from core.case import Case
    from suite.runner import measure

    b = harness_doubles.StubBackend()
    rec, fatal = measure(b.case_for(Case(batch=4, kv_len=2048)), b, ctx)
    assert not fatal and rec.status == "passed", rec
    t = rec.timing
    assert t.timing_method == "graph"
    assert t.p10_us <= t.median_us <= t.p90_us and t.n_samples >= 25
    assert t.spread is not None and t.stop_reason and t.l2_verdict in ("cold", "warm", "unknown")
    assert rec.reproducer and "--gpus 0" in rec.reproducer
    assert t.l2_policy and t.sm_clock_mhz_before is not None
    # the clocks were read during the timed batches (NVML is on the box)
    assert t.sm_clock_mhz_min is not None and t.sm_clock_mhz_min <= t.sm_clock_mhz_median
    assert t.throttled_frac is not None and 0 <= t.throttled_frac <= 1
    assert t.eff_bandwidth_tbps > 0 and t.frac_peak_bus is not None
    assert rec.gpu.gpu_name == ctx.gpu.name and rec.gpu.bus_peak_tbps == ctx.gpu_env.get("bus_peak_tbps")


def test_illegal_access_is_recorded_and_the_sweep_goes_on(tmp_path):
    from core.case import Case
    from core.store import ResultStore
    from suite.sweep import SweepOptions, plan_items, run_sweep

    store = ResultStore(tmp_path / "g.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    items = plan_items([Case(batch=2, kv_len=1024)], [harness_doubles.CrashingBackend(), harness_doubles.StubBackend()])
    opts = SweepOptions(devices=["0"], read_ceiling=False, log_dir=str(tmp_path))
    run_sweep(store=store, run_id=run, items=items, options=opts, progress=False)
    st = dict(zip(store.records(run).backend, store.records(run).status))
    reasons = dict(zip(store.records(run).backend, store.records(run).reason))
    assert st == {"test-crash": "crashed", "test-stub": "passed"}
    assert "illegal memory access" in reasons["test-crash"] or "device-side assert" in reasons["test-crash"]


@pytest.mark.parametrize("name", ["flashinfer-bf16-tc", "trtllm-xqa-fp8"])
def test_flashinfer_backends_when_installed(ctx, name):
    pytest.importorskip("flashinfer")
    from baselines.base import get_backend
    from core.case import Case
    from suite.runner import measure

    b = get_backend(name)
    rec, fatal = measure(b.case_for(Case(batch=8, kv_len=4096)), b, ctx)
    assert rec.status in ("passed", "unsupported"), rec
