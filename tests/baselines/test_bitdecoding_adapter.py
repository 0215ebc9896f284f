"""BitDecoding's adapter plumbing, with a stand-in `bit_decode` module in sys.modules:
buffer shapes and dtypes, the packing call, the decode call and the reference."""
import math
import sys
import types

import pytest
import torch

from baselines.base import GpuInfo, get_backend
from baselines.bitdecoding import emulate_quant
from core.case import Case
from suite.runner import WorkerContext, check, make_source

H200 = GpuInfo(index=0, name="NVIDIA H200", capability=(9, 0))


def _stub_module(calls):
    mod = types.ModuleType("bit_decode")
    state = {}

    def kvcache_pack_int(k_cache, k_pack, k_params, v_cache, v_pack, v_params, opt_block_table=None,
                         cu_seqlens_k=None, seqlen_k=0, quant_mode="k-tensor", group_size=128, num_bits=4):
        calls.append(dict(k=k_cache, k_pack=k_pack, k_params=k_params, v_pack=v_pack, v_params=v_params,
                          cu=cu_seqlens_k, seqlen_k=seqlen_k, quant_mode=quant_mode, group_size=group_size,
                          num_bits=num_bits, block_table=opt_block_table))
        # a faithful stand-in: remember what the codes stand for
        state[k_pack.data_ptr()] = (
            emulate_quant(k_cache, num_bits, group_size, "token"),
            emulate_quant(v_cache, num_bits, group_size, "channel"),
        )

    def fwd_kvcache_int(q, k_pack, k_params, v_pack, v_params, block_table=None, softmax_scale=1.0,
                        quant_mode="k-tensor", group_size=128, num_bits=4):
        calls.append(dict(fwd_q=q, block_table=block_table, scale=softmax_scale, quant_mode=quant_mode,
                          group_size=group_size, num_bits=num_bits))
        k, v = state[k_pack.data_ptr()]
        b, _, hq, d = q.shape
        hkv = k.shape[2]
        qg = q.float().view(b, hkv, hq // hkv, d)
        p = torch.softmax(torch.einsum("bhrd,bthd->bhrt", qg, k) * softmax_scale, dim=-1)
        out = torch.einsum("bhrt,bthd->bhrd", p, v).reshape(b, 1, hq, d).half()
        return out, None, None, None, None

    mod.kvcache_pack_int = kvcache_pack_int
    mod.fwd_kvcache_int = fwd_kvcache_int
    return mod


@pytest.fixture
def stub(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "bit_decode", _stub_module(calls))
    return calls


@pytest.mark.parametrize("bits,group", [(4, 128), (2, 32)])
def test_pack_and_decode_plumbing(stub, bits, group):
    backend = get_backend(f"bitdecoding-int{bits}")
    case = backend.case_for(Case(batch=3, kv_len=256, num_q_heads=8, num_kv_heads=2, head_dim=128,
                                 bits=bits, group_size=group))
    assert backend.supports(case, H200) is None
    source = make_source(case, "cpu")
    prepared = backend.prepare(case, source)
    pack = stub[0]
    pn = 16 // bits
    assert pack["k"].dtype == torch.float16 and pack["k"].shape == (3, 256, 2, 128)
    assert pack["k_pack"].shape == (3, 256 // pn, 2, 128) and pack["k_pack"].dtype == torch.uint16
    assert pack["k_params"].shape == (3, 256 // group, 2, 128) and pack["k_params"].dtype == torch.float32
    assert pack["v_pack"].shape == (3, 256, 2, 128 // pn)
    assert pack["v_params"].shape == (3, 128 // group, 2, 256)
    assert pack["cu"].tolist() == [0, 256, 512, 768] and pack["seqlen_k"] == 256
    assert (pack["quant_mode"], pack["group_size"], pack["num_bits"]) == ("k-channel", group, bits)
    out = prepared.run()
    fwd = stub[-1]
    assert fwd["fwd_q"].shape == (3, 1, 8, 128) and fwd["fwd_q"].dtype == torch.float16
    assert fwd["scale"] == pytest.approx(1 / math.sqrt(128)) and fwd["block_table"] is None
    assert out.shape == (3, 8, 128)
    ctx = WorkerContext(device=torch.device("cpu"), gpu=GpuInfo.cpu())
    res, wrong = check(case, backend, prepared, source, ctx)
    assert wrong is None, wrong  # passes the gate
    assert res.rel_error < 1e-2 and res.quant_rel_error > 1e-2


def test_supports_reasons(stub):
    b = get_backend("bitdecoding-int4")
    base = Case(batch=1, kv_len=1024)
    assert "head_dim 128" in b.supports(base.with_(head_dim=64, page_size=128), H200)
    assert "channel-wise" in b.supports(base.with_(k_mode="token", page_size=128), H200)
    assert "128 or 32" in b.supports(base.with_(group_size=64), H200)
    assert "multiple of 128" in b.supports(base.with_(kv_len=1000, page_size=128), H200)


def test_absent_module_is_unsupported(monkeypatch):
    monkeypatch.setitem(sys.modules, "bit_decode", None)  # import raises ImportError
    reason = get_backend("bitdecoding-int2").supports(Case(batch=1, kv_len=1024, bits=2, page_size=128), H200)
    assert "pip install --no-build-isolation" in reason
