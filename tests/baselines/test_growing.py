"""baselines.growing on the CPU: each format's append, lengths, plan and reference. FlashInfer and
XQA are stood in for by small float attentions that read exactly the arguments the GPU libraries
are given (page table, indptr/indices/last_page_len, block tables, seq_lens, scales), so what
is checked is our side of the call; FOSCAR runs its kernels in the emulator."""
from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from baselines import flashinfer_decode, trtllm
from baselines.base import SourceKV, Unsupported, get_backend
from baselines.growing import FlashInferKV, FoscarKV, XqaKV, bytes_per_sequence, grow
from core.case import Case

HEADS, DIM = 1, 128


def attention(q, k, v, scale):
    """q [hq, d], k/v [n, hkv, d] float -> [hq, d]."""
    group = q.shape[0] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)
    vv = v.float().repeat_interleave(group, dim=1)
    p = torch.softmax(torch.einsum("hd,nhd->hn", q.float(), kk) * scale, dim=-1)
    return torch.einsum("hn,nhd->hd", p, vv)


class FakeWrapper:
    """FlashInfer's decode wrapper in CUDA-graph mode, as far as we use it: plan copies the page
    metadata into the fixed buffers, run attends over the pages those buffers name."""

    def __init__(self, workspace, layout, *, use_cuda_graph, use_tensor_cores, paged_kv_indptr_buffer,
                 paged_kv_indices_buffer, paged_kv_last_page_len_buffer, backend=None):
        assert layout == "NHD" and use_cuda_graph and use_tensor_cores
        self.indptr, self.indices, self.last = paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer
        self.plans = 0

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode, q_data_type, kv_data_type, sm_scale):
        assert pos_encoding_mode == "NONE" and len(indices) <= len(self.indices)
        self.indptr.copy_(indptr)
        self.indices[: len(indices)].copy_(indices)
        self.last.copy_(last_page_len)
        self.page, self.scale, self.plans = page_size, sm_scale, self.plans + 1

    def run(self, q, kv, *, out):
        k_pages, v_pages = kv
        for b in range(q.shape[0]):
            pages = self.indices[int(self.indptr[b]): int(self.indptr[b + 1])].long()
            n = (len(pages) - 1) * self.page + int(self.last[b])
            k = k_pages[pages].reshape(-1, *k_pages.shape[2:])[:n]
            v = v_pages[pages].reshape(-1, *v_pages.shape[2:])[:n]
            out[b] = attention(q[b], k, v, self.scale).to(out.dtype)
        return out


def fake_xqa(*, query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale,
             bmm2_scale, out, kv_layout):
    """XQA over FP8 pages: scores scaled by bmm1_scale (sm_scale x K's scale), output by bmm2_scale."""
    k_pages, v_pages = kv_cache
    page = k_pages.shape[1]
    for b in range(query.shape[0]):
        n = int(seq_lens[b])
        assert n <= max_seq_len
        pages = block_tables[b, : -(-n // page)].long()
        k = k_pages[pages].reshape(-1, *k_pages.shape[2:])[:n].float()
        v = v_pages[pages].reshape(-1, *v_pages.shape[2:])[:n].float() * bmm2_scale
        out[b] = attention(query[b], k, v, bmm1_scale).to(out.dtype)
    return out


@pytest.fixture
def fake_flashinfer(monkeypatch):
    module = types.ModuleType("flashinfer")
    module.BatchDecodeWithPagedKVCacheWrapper = FakeWrapper
    decode = types.ModuleType("flashinfer.decode")
    decode.xqa_batch_decode_with_kv_cache = fake_xqa
    module.decode = decode
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setitem(sys.modules, "flashinfer.decode", decode)
    monkeypatch.setattr(flashinfer_decode, "WORKSPACE_BYTES", 1 << 20)
    monkeypatch.setattr(trtllm, "WORKSPACE_BYTES", 9 << 20)
    return module


def source(rng, batch, prefix, hq=2):
    k = torch.randn(batch, prefix, HEADS, DIM, generator=rng).bfloat16()
    v = torch.randn(batch, prefix, HEADS, DIM, generator=rng).bfloat16()
    q = torch.zeros(batch, hq, DIM, dtype=torch.bfloat16)
    return SourceKV(q=q, k=k, v=v, seq_lens=torch.full((batch,), prefix, dtype=torch.int32),
                    sm_scale=1 / math.sqrt(DIM))


def case_for(name, batch, prefix):
    backend = get_backend(name)
    case = backend.case_for(Case(batch=batch, kv_len=prefix, num_q_heads=2, num_kv_heads=HEADS, head_dim=DIM,
                                 bits=backend.bits or 4, page_size=64))
    return backend, case


def decode_steps(kv, rng, steps, hq=2):
    """Run steps (append, then attend every layer); check each layer's output against float64
    attention over the layer's reference cache and return the tokens appended."""
    appended = []
    for _ in range(steps):
        flush = kv.flush_due()
        kv.plan()
        kv.begin_step(flush)
        step = []
        for layer in range(kv.num_layers):
            k = torch.randn(kv.batch, HEADS, DIM, generator=rng).bfloat16()
            v = torch.randn(kv.batch, HEADS, DIM, generator=rng).bfloat16()
            kv.append(layer, k, v, flush)
            q = torch.randn(kv.batch, hq, DIM, generator=rng).bfloat16()
            out = torch.full_like(q, float("nan"))
            kv.attend(layer, q, out)
            rk, rv, lens = kv.reference_kv(layer)
            for b in range(kv.batch):
                want = attention(q[b].double(), rk[b, : lens[b]], rv[b, : lens[b]], kv.sm_scale)
                err = float((out[b].double() - want).norm() / want.norm())
                assert err < 2e-2, (layer, b, err)
            step.append((k, v))
        kv.stepped()
        appended.append(step)
    return appended


@pytest.mark.parametrize("name", ["flashinfer-bf16-tc", "trtllm-xqa-fp8"])
def test_pages_grow_and_attend_over_the_new_tokens(rng, fake_flashinfer, name):
    batch, prefix, steps = 2, 62, 5  # crosses a 64-token page boundary
    backend, case = case_for(name, batch, prefix)
    kv = grow(backend, case, source(rng, batch, prefix), num_layers=2, max_len=prefix + steps)
    assert isinstance(kv, FlashInferKV if name.startswith("flashinfer") else XqaKV)
    appended = decode_steps(kv, rng, steps)
    assert kv.host_lens.tolist() == [prefix + steps] * batch
    assert kv.seq_lens.tolist() == [prefix + steps] * batch
    for layer in range(2):
        rk, rv, _ = kv.reference_kv(layer)
        for s, step in enumerate(appended):
            k, v = step[layer]
            want_k = k.double() if name.startswith("flashinfer") else ((k.float() / kv.k_scale).to(torch.float8_e4m3fn).float() * kv.k_scale).double()
            assert torch.equal(rk[:, prefix + s], want_k)
    with pytest.raises(ValueError, match="hold at most 67 tokens"):
        kv.flush_due()


def test_flashinfer_plans_for_the_lengths_after_the_append(rng, fake_flashinfer):
    backend, case = case_for("flashinfer-bf16-tc", 3, 64)
    kv = grow(backend, case, source(rng, 3, 64), num_layers=1, max_len=200)
    kv.plan()
    kv.plan()  # same lengths: planned once
    assert kv.wrapper.plans == 1
    assert kv.wrapper.indptr.tolist() == [0, 2, 4, 6]
    assert kv.wrapper.last.tolist() == [1, 1, 1]
    # each sequence's pages are its own: sequence b owns pages b*P .. b*P+1 of the capacity P = 4
    assert kv.wrapper.indices[:6].tolist() == [0, 1, 4, 5, 8, 9]


def test_fp8_appends_saturate_instead_of_overflowing(rng, fake_flashinfer):
    backend, case = case_for("trtllm-xqa-fp8", 1, 10)
    kv = grow(backend, case, source(rng, 1, 10), num_layers=1, max_len=12)
    kv.begin_step(False)
    huge = torch.full((1, HEADS, DIM), 1e4, dtype=torch.bfloat16)
    kv.append(0, huge, huge, False)
    kv.stepped()
    rk, _, _ = kv.reference_kv(0)
    assert torch.isfinite(rk).all() and float(rk[0, 10].max()) == pytest.approx(448 * kv.k_scale)


@pytest.mark.parametrize("name", ["foscar-int4", "foscar-int2"])
def test_foscar_grows_through_a_flush_in_the_emulator(rng, name):
    batch, prefix, steps = 2, 126, 3  # the second step closes a group of 128 tokens
    backend, case = case_for(name, batch, prefix)
    kv = grow(backend, case, source(rng, batch, prefix), num_layers=2, max_len=prefix + steps)
    assert isinstance(kv, FoscarKV) and kv.flush_period == 128
    flushes = []
    for _ in range(steps):
        flushes.append(kv.flush_due())
        decode_steps(kv, rng, 1)
    assert flushes == [False, True, False]
    assert kv.caches[0].tail_lens.tolist() == [1, 1] and kv.caches[1].seq_lens.tolist() == [129, 129]


@pytest.mark.parametrize("name", ["flashinfer-bf16-tc", "trtllm-xqa-fp8", "foscar-int4", "foscar-int2"])
def test_bytes_per_sequence_matches_what_is_allocated(rng, fake_flashinfer, name):
    batch, prefix, max_len = 3, 300, 340
    backend, case = case_for(name, batch, prefix)
    src = source(rng, batch, prefix)
    kv = grow(backend, case, src, num_layers=2, max_len=max_len, release_source=True)
    assert src.k is None and src.v is None  # let go once layer 0 held them
    estimate = batch * type(kv).bytes_per_sequence(case, max_len, 2)
    # FOSCAR also holds one scratch page per layer beyond the sequences' own
    assert estimate <= kv.nbytes() <= estimate * 1.1
    # capacity planning adds what a step's append takes on top (FOSCAR's flush quantizes a group)
    extra = bytes_per_sequence(backend, case, max_len, 2) - estimate // batch
    assert extra == (24 * HEADS * 128 * DIM if name.startswith("foscar") else 0)


def test_backends_without_a_growing_cache_say_so(rng):
    backend = get_backend("torch-ref")
    case = backend.case_for(Case(batch=1, kv_len=8, num_q_heads=2, num_kv_heads=1, head_dim=DIM))
    with pytest.raises(Unsupported, match="torch-ref .* has no growing cache"):
        grow(backend, case, source(rng, 1, 8), 1, 16)
