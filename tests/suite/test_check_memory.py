"""The correctness check's memory (suite.runner): its float64 reference goes one sequence and
one KV head at a time and equals the whole-batch reference to float64 rounding; fit_reason
counts the check's own peak beside the source and the cache, so a case whose check cannot
fit is skipped rather than crashing in check()."""
import weakref

import pytest
import torch

from baselines.base import Prepared, SourceKV
from core.case import Case
from core.gpu import GpuInfo
from foscar.reference import attention_f64
from suite import runner
from suite.runner import WorkerContext, check, check_bytes, fit_reason, fit_shortfall, reference_outputs, rel_l2

CPU = WorkerContext(device=torch.device("cpu"), gpu=GpuInfo.cpu())


def _gqa_source(lens=(5, 17, 33), num_q_heads=8, num_kv_heads=2, dim=64) -> SourceKV:
    """Three sequences of different lengths, GQA 8:2, NaN past each length (as a reused page
    would leave it): the per-head reference must mask it as the whole-batch one does."""
    gen = torch.Generator().manual_seed(7)
    b, t = len(lens), max(lens)
    q = torch.randn(b, num_q_heads, dim, generator=gen).bfloat16()
    k = torch.randn(b, t, num_kv_heads, dim, generator=gen).bfloat16()
    v = torch.randn(b, t, num_kv_heads, dim, generator=gen).bfloat16()
    for i, n in enumerate(lens):
        k[i, n:], v[i, n:] = float("nan"), float("nan")
    return SourceKV(q=q, k=k, v=v, seq_lens=torch.tensor(lens, dtype=torch.int32), sm_scale=dim ** -0.5)


def _quantized_like(source: SourceKV):
    """float32 K/V a little off the source (a stand-in cache's dequantized values), and a
    reference_kv over them that records its calls and whether the last K/V it gave is freed."""
    gen = torch.Generator().manual_seed(8)
    kq = source.k.float() + 0.05 * torch.randn(source.k.shape, generator=gen)
    vq = source.v.float() + 0.05 * torch.randn(source.v.shape, generator=gen)
    calls, held = [], []

    def reference_kv(idx):
        calls.append(list(idx))
        held.append(all(r() is None for r in alive))  # the previous sequence's K/V is gone
        alive.clear()
        k, v = kq[list(idx)], vq[list(idx)]
        alive.extend((weakref.ref(k), weakref.ref(v)))
        return k, v

    alive = []
    return kq, vq, reference_kv, calls, held


def test_per_head_reference_equals_the_whole_batch_one():
    source = _gqa_source()
    kq, vq, reference_kv, calls, freed = _quantized_like(source)
    idx = [0, 1, 2]
    ref, exact = reference_outputs(Prepared(run=lambda: None, reference_kv=reference_kv), source, idx)
    whole = attention_f64(source.q, kq, vq, source.seq_lens, source.sm_scale)
    whole_exact = attention_f64(source.q, source.k, source.v, source.seq_lens, source.sm_scale)
    assert ref.dtype == torch.float64 and ref.shape == (3, 8, 64)
    assert torch.isfinite(ref).all() and torch.isfinite(exact).all()
    assert (ref - whole).abs().max() <= 1e-14 * whole.abs().max()
    assert (exact - whole_exact).abs().max() <= 1e-14 * whole_exact.abs().max()
    assert rel_l2(ref, exact) == pytest.approx(rel_l2(whole, whole_exact), rel=1e-12)
    assert calls == [[0], [1], [2]] and all(freed)  # one sequence at a time, each freed before the next


def test_check_figures_are_those_of_the_whole_batch_reference():
    source = _gqa_source()
    kq, vq, reference_kv, _, _ = _quantized_like(source)
    out = torch.empty_like(source.q)

    def run():  # the float64 answer over the stand-in cache, rounded to BF16 as a kernel writes it
        out.copy_(attention_f64(source.q, kq, vq, source.seq_lens, source.sm_scale))
        return out

    case = Case(batch=3, kv_len=33, num_q_heads=8, num_kv_heads=2, head_dim=64, bits=16)
    backend = type("B", (), {"name": "test-gqa", "tolerance": 1e-2})()
    res, wrong = check(case, backend, Prepared(run=run, reference_kv=reference_kv, out=out), source, CPU)
    whole = attention_f64(source.q, kq, vq, source.seq_lens, source.sm_scale)
    whole_exact = attention_f64(source.q, source.k, source.v, source.seq_lens, source.sm_scale)
    assert wrong is None and res.checked_seqs == [0, 1, 2]
    assert 0 < res.rel_error < 1e-2  # the output is BF16
    assert res.rel_error == pytest.approx(rel_l2(out, whole), rel=1e-9)
    assert res.quant_rel_error == pytest.approx(rel_l2(whole, whole_exact), rel=1e-12)


# --- fit: the byte arithmetic ----------------------------------------------------------------
BIG = Case(batch=128, kv_len=131072, num_q_heads=32, num_kv_heads=8, head_dim=128, bits=2)
CACHE = 9_700_000_000  # about INT2's cache at BIG


def test_check_bytes_count_one_sequence_and_one_head():
    # one sequence's float32 K and V, and one KV head's float64 K/V copies and scores (4 rows)
    kv = 2 * 131072 * 8 * 128 * 4
    head = 8 * 131072 * (runner.F64_KV_COPIES * 128 + runner.F64_SCORE_COPIES * 4)
    assert check_bytes(BIG) == kv + head == 1_488_977_920
    # independent of the batch: the check holds one sequence at a time
    assert check_bytes(BIG.with_(batch=1)) == check_bytes(BIG)


def test_fit_shortfall_counts_the_check():
    src, chk = runner.source_bytes(BIG), check_bytes(BIG)
    need = src + int(CACHE * 1.1) + chk + runner.MEMORY_HEADROOM_BYTES
    assert fit_shortfall(BIG, "foscar-int2", CACHE, need, 85_000_000_000) is None
    # enough for the source, the cache and the headroom, but not the check's reference: skipped
    reason = fit_shortfall(BIG, "foscar-int2", CACHE, need - 1, 85_000_000_000)
    assert reason is not None
    assert reason.startswith(f"needs about {need / 1e9:.1f} GB on the GPU (source K/V 68.7 GB ")
    assert "foscar-int2's cache 9.7 GB + the check's float64 reference 1.5 GB)" in reason
    assert reason.endswith("free of 85.0 GB")
    # a source already made for this shape is not counted again; the check still is
    resident = need - src
    assert fit_shortfall(BIG, "foscar-int2", CACHE, resident, 85e9, source_resident=True) is None
    assert fit_shortfall(BIG, "foscar-int2", CACHE, resident - 1, 85e9, source_resident=True) is not None


def test_fit_reason_skips_a_case_whose_check_cannot_fit(monkeypatch):
    """fit_reason on a pretend CUDA device (its memory queries stubbed): the H100 case that
    passed the old count and then ran out of memory in check() is skipped, by the check."""
    src, chk = runner.source_bytes(BIG), check_bytes(BIG)
    free = src + int(CACHE * 1.1) + runner.MEMORY_HEADROOM_BYTES + chk // 2
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 85_000_000_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    ctx = WorkerContext(device=torch.device("cuda", 0), gpu=GpuInfo.cpu())
    backend = type("B", (), {"name": "foscar-int2", "memory_bytes": lambda self, case: CACHE})()
    reason = fit_reason(ctx, BIG, backend)
    assert reason is not None and "the check's float64 reference 1.5 GB" in reason
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free + chk, 85_000_000_000))
    assert fit_reason(ctx, BIG, backend) is None
