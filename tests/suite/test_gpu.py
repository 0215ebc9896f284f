"""GPU checks of the harness itself (skipped cleanly without CUDA): honest timing fields,
the read ceiling, crash isolation with a real illegal memory access, and, when FlashInfer
is installed, its tensor-core decode through the whole path."""
import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def ctx():
    from suite.worker import make_context

    return make_context("0", {"read_ceiling": True})


def test_read_ceiling(ctx):
    assert ctx.read_ceiling_tbps and ctx.read_ceiling_tbps > 0.5
    peak = ctx.gpu_env.get("bus_peak_tbps")
    if peak:
        assert ctx.read_ceiling_tbps < 1.05 * peak


def test_stub_is_checked_and_timed(ctx, monkeypatch):
    monkeypatch.setenv("FOSCAR_BENCH_TEST_BACKENDS", "1")
    from baselines.base import get_backend
    from core.case import Case
    from suite.runner import measure

    b = get_backend("test-stub")
    rec, fatal = measure(b.case_for(Case(batch=4, kv_len=2048)), b, ctx)
    assert not fatal and rec["status"] == "passed", rec
    assert rec["timing_method"] == "graph"
    assert rec["p10_us"] <= rec["median_us"] <= rec["p90_us"] and rec["n_samples"] >= 25
    assert rec["l2_policy"] and rec["sm_clock_mhz_before"] is not None
    assert rec["eff_bandwidth_tbps"] > 0 and rec["frac_peak_bus"] is not None


def test_illegal_access_is_recorded_and_the_sweep_goes_on(tmp_path):
    from baselines.base import select_backends
    from core.case import Case
    from core.store import ResultStore
    from suite.sweep import SweepOptions, plan_items, run_sweep

    os.environ["FOSCAR_BENCH_TEST_BACKENDS"] = "1"
    store = ResultStore(tmp_path / "g.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    items = plan_items([Case(batch=2, kv_len=1024)], select_backends(["test-crash", "test-stub"]))
    opts = SweepOptions(devices=["0"], read_ceiling=False, test_backends=True, log_dir=str(tmp_path))
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
    assert rec["status"] in ("passed", "unsupported"), rec
