"""BitDecoding's adapter plumbing, with a stand-in `bit_decode` module in sys.modules:
buffer shapes and dtypes, the packing call, the decode call and the reference."""
import math
import sys

import pytest
import torch

from baselines.base import GpuInfo, get_backend
from baselines.bitdecoding import emulate_quant
from bitdecoding_standin import standin
from core.case import Case
from suite.runner import WorkerContext, check, make_source

H200 = GpuInfo(index=0, name="NVIDIA H200", capability=(9, 0))


@pytest.fixture
def stub(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "bit_decode", standin(calls))
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
    assert "scripts/bitdecoding_build.py" in reason and "DD-DuDa/BitDecoding" in reason


def test_emulation_follows_the_library_kernels():
    """Codes from the fp32 inverse scale, halves rounded away from zero, scale and offset
    stored in fp16, one fp16 rounding of code x scale + offset; a flat group is its min."""
    # one K channel, one group of 4 tokens at INT2: lo 0, range 3 -> inverse scale 1
    x = torch.tensor([0.0, 0.5, 1.5, 3.0], dtype=torch.float16).view(1, 4, 1, 1)
    deq = emulate_quant(x, 2, 4, "token").flatten().tolist()
    assert deq == [0.0, 1.0, 2.0, 3.0]  # 0.5 -> 1 and 1.5 -> 2: halves go up, not to even
    flat = torch.full((1, 4, 1, 1), 0.3, dtype=torch.float16)
    assert emulate_quant(flat, 2, 4, "token").flatten().tolist() == [float(torch.tensor(0.3).half())] * 4
    # INT4 on a range whose scale is not an fp16 number: values are fp16 and within half a step
    y = torch.linspace(-1.3, 2.1, 128).half().view(1, 1, 1, 128)
    out = emulate_quant(y, 4, 128, "channel")
    assert torch.equal(out, out.half().float())
    step = (2.1 + 1.3) / 15
    assert float((out - y.float()).abs().max()) <= step / 2 + 2e-3
