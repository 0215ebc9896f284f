"""A stand-in `bit_decode` module for CPU tests: it remembers what its packed buffers stand
for (BitDecoding's quantizer, emulated) and attends over that in float32. `layout_bug`
makes it misplace V codes the way a packer and decoder that disagree would."""
from __future__ import annotations

import types

import torch

from baselines.bitdecoding import emulate_quant


def standin(calls: list | None = None, layout_bug: bool = False, group_bug: int | None = None):
    mod = types.ModuleType("bit_decode")
    state = {}
    calls = calls if calls is not None else []

    def kvcache_pack_int(k_cache, k_pack, k_params, v_cache, v_pack, v_params, opt_block_table=None,
                         cu_seqlens_k=None, seqlen_k=0, quant_mode="k-tensor", group_size=128, num_bits=4):
        calls.append(dict(k=k_cache, k_pack=k_pack, k_params=k_params, v_pack=v_pack, v_params=v_params,
                          cu=cu_seqlens_k, seqlen_k=seqlen_k, quant_mode=quant_mode, group_size=group_size,
                          num_bits=num_bits, block_table=opt_block_table))
        v = emulate_quant(v_cache, num_bits, group_bug or group_size, "channel")
        if layout_bug:  # codes of each 8 channels come back in reverse order
            b, s, h, d = v.shape
            v = v.view(b, s, h, d // 8, 8).flip(-1).reshape(b, s, h, d)
        state[k_pack.data_ptr()] = (emulate_quant(k_cache, num_bits, group_size, "token"), v)

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
