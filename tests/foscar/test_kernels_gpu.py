"""FOSCAR CUDA kernels against the float64 reference over the same dequantized cache (GPU only)."""
from __future__ import annotations

import ctypes
import os
import random
import zlib

import pytest
import torch

import foscar
from foscar.config import QuantConfig
from foscar.reference import attention_f64
from foscar.testcases import case_inputs, gpu_case

pytestmark = pytest.mark.gpu

TOLERANCE = 4e-3  # relative L2 vs float64 over the same dequantized cache: bf16 rounding level


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)


if not _hopper():
    pytest.skip("needs a Hopper (sm_90) CUDA GPU", allow_module_level=True)

RNG = random.Random()  # fresh shapes every run; the failing seed is printed by the test id

# FOSCAR_TEST_LIBRARY=/path/to/libfoscar.so runs these tests on a library built elsewhere (another
# commit's, carried to the GPU box in its cache) in place of this tree's default build.
if os.environ.get("FOSCAR_TEST_LIBRARY"):
    from foscar import kernels
    from foscar.build import detect_arch

    kernels._libs[(detect_arch() or "sm_90a", ())] = kernels.bind(
        ctypes.CDLL(os.environ["FOSCAR_TEST_LIBRARY"]), "foscar")


def _case(bits, group, k_mode, v_mode, *, batch=None, ratio=None, seed=None):
    seed = RNG.randrange(1 << 30) if seed is None else seed
    return (seed, *gpu_case(bits, group, k_mode, v_mode, seed, batch=batch, ratio=ratio))


def _inputs(config, lens, num_kv_heads, ratio, seed, shuffle=True):
    """(q, cache) on the GPU, drawn from `seed`."""
    return case_inputs(config, lens, num_kv_heads, ratio, seed, device="cuda", shuffle=shuffle)


def _run(config, lens, num_kv_heads, ratio, seed, variant="fold", num_splits=None, shuffle=True, kv_heads_per_item=None):
    q, cache = _inputs(config, lens, num_kv_heads, ratio, seed, shuffle)
    out = torch.full_like(q, float("nan"))  # poison: an element never written fails
    foscar.decode(q, cache, out=out, variant=variant, num_splits=num_splits, kv_heads_per_item=kv_heads_per_item)
    torch.cuda.synchronize()
    kd, vd = foscar.dequantize(cache, dtype=torch.float64)
    ref = attention_f64(q, kd, vd, lens)
    assert torch.isfinite(out).all(), "some output elements were never written (or are NaN)"
    err = ((out.double() - ref).norm() / ref.norm()).item()
    return err


MODES = [("token", "token"), ("token", "channel"), ("channel", "token"), ("channel", "channel")]


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
def test_fold_matches_reference(bits, group, k_mode, v_mode):
    seed, config, lens, hkv, ratio = _case(bits, group, k_mode, v_mode)
    err = _run(config, lens, hkv, ratio, seed)
    assert err <= TOLERANCE, f"seed={seed} lens={lens} hkv={hkv} ratio={ratio} page={config.page_size}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
def test_batch_129_and_forced_splits(bits, k_mode, v_mode):
    seed, config, lens, hkv, ratio = _case(bits, 128, k_mode, v_mode, batch=129, ratio=4)
    for splits in (1, 3):
        err = _run(config, lens, hkv, ratio, seed, num_splits=splits)
        assert err <= TOLERANCE, f"seed={seed} splits={splits}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
@pytest.mark.parametrize("ratio", [2, 4])
def test_paired_heads_match_reference(bits, k_mode, v_mode, ratio):
    # Two KV heads per item at 2 or 4 query heads per KV head (kv_heads_per_item): four KV
    # heads, tails, the plan's splits and forced ones.
    group = RNG.choice([32, 64, 128])
    seed, config, lens, _, _ = _case(bits, group, k_mode, v_mode, batch=3, ratio=ratio)
    for splits in (None, 3):
        err = _run(config, lens, 4, ratio, seed, num_splits=splits, kv_heads_per_item=2)
        assert err <= TOLERANCE, f"seed={seed} G={group} lens={lens} splits={splits}: {err:.2e}"


@pytest.mark.parametrize("bits,k_mode,v_mode", [(4, "token", "channel"), (4, "channel", "token"), (2, "token", "channel")])
def test_repeated_launches_give_the_same_bits(bits, k_mode, v_mode):
    # The kernels are deterministic: launched again on the same inputs they must give the same
    # bits. Batch 129's short sequences with BF16 tails, paired items (seed 488434680, where the
    # K token-wise / V channel-wise kernels gave a wrong output in 0.03-8 % of launches before
    # v31's fence: scripts/probe_race.py, docs/PERFORMANCE.md twelfth session).
    seed, config, lens, hkv, ratio = _case(bits, 128, k_mode, v_mode, batch=129, ratio=4, seed=488434680)
    q, cache = _inputs(config, lens, hkv, ratio, seed)
    first = foscar.decode(q, cache)
    for launch in range(300):
        out = foscar.decode(q, cache)
        if not torch.equal(out, first):
            rows = (out != first).any(dim=-1).nonzero().tolist()
            pytest.fail(f"launch {launch + 1} differs from the first at (sequence, query head) {rows[:8]}")


@pytest.mark.parametrize("bits", [4, 2])
def test_long_context_many_splits(bits):
    config = QuantConfig(bits=bits, group_size=128, k_mode="channel", v_mode="token", page_size=128)
    seed = RNG.randrange(1 << 30)
    err = _run(config, [8191, 5000], 2, 4, seed)
    assert err <= TOLERANCE, f"seed={seed}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("group", [32, 128])
def test_dequant_ablation_matches_reference(bits, group):
    seed, config, lens, hkv, ratio = _case(bits, group, "channel", "token")
    err = _run(config, lens, hkv, ratio, seed, variant="dequant")
    assert err <= TOLERANCE, f"seed={seed}: {err:.2e}"


# Long contexts (the error must not grow with the context: docs/PERFORMANCE.md, v5): batch 1 at
# 128K and 256K tokens, batches 8 and 128 at 32K, every mode and both widths, Llama-3-8B heads.
# The reference attends three rows (first, middle, last) of the big batches.
LONG_CELLS = [(1, 131072), (1, 262144), (8, 32768), (128, 32768)]


@pytest.mark.parametrize("batch,kv_len", LONG_CELLS, ids=lambda v: str(v))
@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
def test_long_contexts_stay_within_the_gate(batch, kv_len, bits, k_mode, v_mode):
    seed = zlib.crc32(f"{batch}-{kv_len}".encode())
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, kv_len, 8, 128)
    k = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    q = torch.randn(batch, 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    config = QuantConfig(bits=bits, group_size=128, k_mode=k_mode, v_mode=v_mode, page_size=128)
    lens = [kv_len - 37 * (b % 3) for b in range(batch)]  # channel-wise tails on some rows
    cache = foscar.quantize(k, v, lens, config)
    del k, v
    out = torch.full_like(q, float("nan"))
    foscar.decode(q, cache, out=out)
    rows = sorted({0, batch // 2, batch - 1})
    kd, vd = foscar.dequantize(cache, rows, dtype=torch.float64)
    ref = attention_f64(q[rows], kd, vd, [lens[r] for r in rows])
    assert torch.isfinite(out).all(), "some output elements were never written (or are NaN)"
    err = ((out[rows].double() - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE, f"batch={batch} kv_len={kv_len}: {err:.2e}"


def test_bad_input_is_one_clear_error():
    config = QuantConfig(bits=4, group_size=128, page_size=128)
    k = torch.randn(1, 100, 1, 128, device="cuda").to(torch.bfloat16)
    cache = foscar.quantize(k, k.clone(), [100], config)
    with pytest.raises(ValueError, match="bfloat16"):
        foscar.decode(torch.randn(1, 4, 128, device="cuda"), cache)
    with pytest.raises(ValueError, match="shape"):
        foscar.decode(torch.randn(2, 4, 128, device="cuda").to(torch.bfloat16), cache)
    with pytest.raises(ValueError, match="1 to 8"):
        foscar.decode(torch.randn(1, 16, 128, device="cuda").to(torch.bfloat16), cache)


def test_a_graph_replayed_after_a_larger_decode_still_writes_its_own_workspace(monkeypatch):
    # A graph holds the split workspace it was captured with; a larger eager decode on the same
    # device grows the workspace, and the outgrown set must stay allocated (foscar.kernels
    # keeps it): replayed afterwards, the graph's split merge still reads what it wrote.
    from foscar import kernels

    monkeypatch.setattr(kernels, "_workspaces", {})  # this test's own sets, from the smallest
    monkeypatch.setattr(kernels, "_retired_workspaces", [])
    config = QuantConfig(bits=4, group_size=128, k_mode="channel", v_mode="token", page_size=128)
    seed = RNG.randrange(1 << 30)
    q, cache = _inputs(config, [6000], 8, 4, seed)  # batch 1: split across the GPU
    kd, vd = foscar.dequantize(cache, dtype=torch.float64)
    ref = attention_f64(q, kd, vd, [6000])
    out = torch.empty_like(q)
    foscar.decode(q, cache, out=out)  # plan and workspace before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        foscar.decode(q, cache, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    big_q, big_cache = _inputs(config, [30000] * 16, 8, 4, seed + 1)  # more rows x splits of partials
    foscar.decode(big_q, big_cache)
    assert len(kernels._retired_workspaces) == 1  # the graph's set, outgrown
    filler = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(64)]  # reuse any freed memory
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    del filler
    assert torch.isfinite(out).all()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE, f"seed={seed}: {err:.2e}"
