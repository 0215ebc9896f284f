"""FlashInfer and XQA adapter plumbing against a stand-in `flashinfer` that implements the
documented semantics (NHD pages, CSR page table, k_scale/v_scale, NVFP4 scale factors,
bmm1/bmm2 scales). If an adapter paged, scaled or indexed wrongly, the reference check
here would fail."""
import sys
import types

import pytest
import torch

from baselines import _paging as pg
from baselines.base import GpuInfo, get_backend
from core.case import Case
from suite.runner import WorkerContext, check, make_source

H200 = GpuInfo(index=0, name="NVIDIA H200", capability=(9, 0))
CPU = WorkerContext(device=torch.device("cpu"), gpu=GpuInfo.cpu())


def _attend(q, k, v, scale):
    b, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.float().view(b, hkv, hq // hkv, d)
    p = torch.softmax(torch.einsum("bhrd,bthd->bhrt", qg, k.float()) * scale, dim=-1)
    return torch.einsum("bhrt,bthd->bhrd", p, v.float()).reshape(b, hq, d)


def _gather(pages, page_ids, n):
    return pages[page_ids].reshape(-1, *pages.shape[2:])[:n]


class FakeWrapper:
    instances = []

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 backend="auto"):
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8
        self.use_tensor_cores, self.backend = use_tensor_cores, backend
        FakeWrapper.instances.append(self)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode="NONE", q_data_type="float16", kv_data_type=None, sm_scale=None):
        self.args = dict(indptr=indptr, indices=indices, last=last_page_len, hq=num_qo_heads,
                         hkv=num_kv_heads, d=head_dim, page=page_size, q_dtype=q_data_type,
                         kv_dtype=kv_data_type, sm_scale=sm_scale, pos=pos_encoding_mode)

    def run(self, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None, out=None,
            kv_cache_sf=None):
        a = self.args
        kp, vp = paged_kv_cache
        assert kp.dtype == a["kv_dtype"] and q.dtype == a["q_dtype"]
        outs = []
        for b in range(q.shape[0]):
            ids = a["indices"][a["indptr"][b]:a["indptr"][b + 1]].long()
            n = (len(ids) - 1) * a["page"] + int(a["last"][b])
            if kp.dtype == torch.uint8:
                ksf, vsf = kv_cache_sf
                k = pg.nvfp4_dequantize(_gather(kp, ids, n), _gather(ksf, ids, n), k_scale)
                v = pg.nvfp4_dequantize(_gather(vp, ids, n), _gather(vsf, ids, n), v_scale)
            else:
                k, v = _gather(kp, ids, n).float(), _gather(vp, ids, n).float()
                k, v = k * (k_scale or 1.0), v * (v_scale or 1.0)
            outs.append(_attend(q[b:b + 1], k[None], v[None], a["sm_scale"]))
        res = torch.cat(outs).to(q.dtype)
        if out is not None:
            out.copy_(res)
            return out
        return res


def xqa_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
                                   bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, sinks=None,
                                   kv_layout="NHD", enable_pdl=None, q_len_per_req=1, o_scale=1.0,
                                   mask=None, kv_cache_sf=None, q_cu_seq_lens=None):
    kp, vp = kv_cache
    assert kv_layout == "NHD" and kp.dtype == torch.float8_e4m3fn and block_tables.dtype == torch.int32
    outs = []
    for b in range(query.shape[0]):
        n = int(seq_lens[b])
        ids = block_tables[b].long()
        k, v = _gather(kp, ids, n).float(), _gather(vp, ids, n).float()
        outs.append(_attend(query[b:b + 1], k[None], v[None], bmm1_scale) * bmm2_scale)
    out.copy_(torch.cat(outs))
    return out


@pytest.fixture
def fake_flashinfer(monkeypatch):
    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.0-stub"
    fi.BatchDecodeWithPagedKVCacheWrapper = FakeWrapper
    dec = types.ModuleType("flashinfer.decode")
    dec.xqa_batch_decode_with_kv_cache = xqa_batch_decode_with_kv_cache
    fi.decode = dec
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flashinfer.decode", dec)
    FakeWrapper.instances.clear()
    return fi


@pytest.mark.parametrize("name", [
    "flashinfer-bf16", "flashinfer-bf16-tc", "flashinfer-bf16-fa3", "flashinfer-fp8",
    "flashinfer-fp8-tc", "flashinfer-nvfp4-tc", "trtllm-xqa-fp8",
])
def test_adapter_answers_the_reference(fake_flashinfer, name):
    backend = get_backend(name)
    case = backend.case_for(Case(batch=3, kv_len=160, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 page_size=32, bits=4))
    assert backend.supports(case, H200) is None
    source = make_source(case, "cpu")
    prepared = backend.prepare(case, source)
    res, wrong = check(case, backend, prepared, source, CPU)
    assert wrong is None, wrong
    assert res.rel_error < 1e-2
    if name.startswith("flashinfer"):
        w = FakeWrapper.instances[-1]
        assert w.use_tensor_cores == name.endswith(("-tc", "-fa3"))
        assert w.args["pos"] == "NONE" and w.args["page"] == 32 and w.args["hq"] == 8
        assert w.args["last"].tolist() == [32, 32, 32]  # 160 = 5 full pages
        if name == "flashinfer-bf16-fa3":
            assert w.backend == "fa3"
    if "fp8" in name or "nvfp4" in name:
        assert res.quant_rel_error > 1e-3  # the reference saw the converted cache


def test_old_flashinfer_without_nvfp4_support(fake_flashinfer, monkeypatch):
    class OldWrapper(FakeWrapper):
        def run(self, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None, out=None):
            return super().run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, out=out)

    monkeypatch.setattr(fake_flashinfer, "BatchDecodeWithPagedKVCacheWrapper", OldWrapper)
    b = get_backend("flashinfer-nvfp4-tc")
    reason = b.supports(b.case_for(Case(batch=1, kv_len=1024)), H200)
    assert "kv_cache_sf" in reason


def test_call_with_supported_drops_unknown_kwargs():
    from baselines.flashinfer_decode import call_with_supported

    def f(a, b=1):
        return a + b

    assert call_with_supported(f, 1, b=2, c=3) == 3
    assert call_with_supported(lambda **kw: sorted(kw), x=1, y=2) == ["x", "y"]


def test_xqa_starts_from_zeroed_semaphores_after_flashinfer_used_the_workspace(fake_flashinfer):
    from baselines._paging import shared_workspace
    from baselines.trtllm import WORKSPACE_BYTES, XQA_SEMAPHORE_BYTES

    backend = get_backend("trtllm-xqa-fp8")
    case = backend.case_for(Case(batch=1, kv_len=64, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 page_size=32, bits=4))
    shared_workspace("cpu", WORKSPACE_BYTES)[: XQA_SEMAPHORE_BYTES + 16].fill_(7)  # a previous user
    backend.prepare(case, make_source(case, "cpu"))
    ws = shared_workspace("cpu", WORKSPACE_BYTES)
    assert int(ws[:XQA_SEMAPHORE_BYTES].max()) == 0
