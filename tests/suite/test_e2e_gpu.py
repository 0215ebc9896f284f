"""foscar-bench e2e on a GPU at a small size: each format's captured step against float64 attention
over its own cache, and one timed point through the CUDA graphs."""
from __future__ import annotations

import pytest
import torch

from baselines.base import get_backend
from suite.e2e import bench as B
from suite.e2e.model import Weights, model_shape

pytestmark = pytest.mark.gpu
BACKENDS = ["flashinfer-bf16-tc", "trtllm-xqa-fp8", "foscar-int4", "foscar-int2"]


@pytest.fixture(scope="module")
def gpu_bench():
    device = torch.device("cuda", torch.cuda.current_device())
    shape = model_shape("llama3-8b").with_layers(2)  # the real shapes, two layers
    return B.Bench(device=device, shape=shape, weights=Weights(shape, device, seed=0), gpu=B.gpu_info(device))


def _backend(name, bench):
    backend = get_backend(name)
    reason = backend.supports(B.make_case(bench.shape, backend, 2, 1000), bench.gpu)
    if reason:
        pytest.skip(reason)
    return backend


@pytest.mark.parametrize("prefix", [B.CHECK_PREFIX, 1000])  # a step that closes a group, and one that does not
@pytest.mark.parametrize("name", BACKENDS)
def test_captured_step_matches_float64_attention(gpu_bench, name, prefix):
    rec = B.check(gpu_bench, _backend(name, gpu_bench), prefix_len=prefix)
    # Two layers: attention may move the logits too little for the check to tell (B.check_verdict's
    # "undecided"); the step must then still sit within a correct step's noise.
    undecided = rec["status"] == "error" and rec.get("check_undecided")
    assert rec["status"] == "passed" or undecided, rec.get("reason")
    assert rec["logits_rel_error"] <= rec["logits_floor"] or rec["status"] == "passed", rec.get("reason")
    assert rec["top1_agreement"] >= 2 / 3


@pytest.mark.parametrize("name", BACKENDS)
def test_one_point_through_the_graphs(gpu_bench, name):
    rec = B.measure(gpu_bench, _backend(name, gpu_bench), 4, 2000, steps=8, budget_bytes=B.kv_budget_bytes(gpu_bench))
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["timing_method"].startswith("cuda-graph")
    assert 0 < rec["step_p10_us"] <= rec["step_median_us"] <= rec["step_p90_us"]
    assert rec["attn_share"] < 1 and rec["tokens_per_s"] > 0  # the share may be near 0 at this size
    if name.startswith("foscar"):
        assert rec["n_flush_steps"] >= B.FLUSH_SAMPLES
