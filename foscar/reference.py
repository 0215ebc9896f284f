"""Float64 references for decode attention: plain attention, and FOSCAR's folded form over packed words.

`folded_attention_f64` computes what the kernels compute, the way they compute it (FOSCAR.md
section 3); it must equal `attention_f64` over `dequantize(cache)` to float64 rounding.
"""
from __future__ import annotations

import math

import torch

from foscar import packing
from foscar.cache import QuantizedKVCache, gather_params

F64 = torch.float64
K_BIAS = packing.OPERANDS["k"].bias  # K codes become fp16 1024 + f c
V_BIAS = packing.OPERANDS["v"].bias  # V codes become fp16 subnormals f c 2^-24: no bias
V_UNIT = packing.OPERANDS["v"].unit
OPERAND_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def attention_f64(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v per sequence, in float64.

    q [batch, num_q_heads, head_dim]; k, v [batch, max_len, num_kv_heads, head_dim]; query
    head h reads KV head h // (num_q_heads // num_kv_heads). Returns float64 [batch, num_q_heads, head_dim].
    """
    batch, num_q_heads, dim = q.shape
    num_kv_heads = k.shape[2]
    _check_gqa(num_q_heads, num_kv_heads)
    sm_scale = 1.0 / math.sqrt(dim) if sm_scale is None else sm_scale
    lens = torch.as_tensor(seq_lens, device=q.device).long()
    qg = q.to(F64).view(batch, num_kv_heads, -1, dim)
    scores = torch.einsum("bhrd,bthd->bhrt", qg, k.to(F64)) * sm_scale
    valid = torch.arange(k.shape[1], device=q.device) < lens[:, None]
    scores = scores.masked_fill(~valid[:, None, None, :], -math.inf)
    p = torch.softmax(scores, dim=-1)
    values = v.to(F64).masked_fill(~valid[:, :, None, None], 0.0)  # 0 * NaN padding would be NaN
    out = torch.einsum("bhrt,bthd->bhrd", p, values)
    return out.reshape(batch, num_q_heads, dim)


def folded_attention_f64(
    q: torch.Tensor,
    cache: QuantizedKVCache,
    sm_scale: float | None = None,
    *,
    round_operands: bool | torch.dtype = False,
) -> torch.Tensor:
    """Decode attention over a quantized cache, folded as the kernels fold it, in float64.

    Reads the packed words through the extraction schedule (K: fp16 1024 + f*c, V: fp16
    f*c*2^-24), folds scale, offset, radix factor and the bias per FOSCAR.md section 3 for the
    cache's (k_mode, v_mode), and attends the BF16 tail exactly. round_operands=True rounds the
    folded MMA operands to the fp16 operand types of packing.OPERANDS (q/f and q*s/f, p and
    p*s), or pass a dtype to round every operand to that; the default False keeps them exact.
    This is the fp16-operand form of the folds; the kernels' int8 K operands against a 15-bit
    Q~ are modelled by foscar.precision, not here.
    Returns float64 [batch, num_q_heads, head_dim].
    """
    cfg = cache.config
    batch, num_q_heads, dim = q.shape
    heads, group = cache.num_kv_heads, cfg.group_size
    if batch != cache.batch or dim != cache.head_dim:
        raise ValueError(
            f"q has shape {tuple(q.shape)} but the cache holds batch={cache.batch}, head_dim="
            f"{cache.head_dim}; expected one query row per cached sequence."
        )
    _check_gqa(num_q_heads, heads)
    sm_scale = 1.0 / math.sqrt(dim) if sm_scale is None else sm_scale
    rnd_k, rnd_v = _rounder(round_operands, "k"), _rounder(round_operands, "v")
    qg = q.to(F64).view(batch, heads, -1, dim)  # [b, h, r, d]

    seqs = torch.arange(batch, device=cache.device)
    k_params, v_params = gather_params(cache, seqs)
    ek = _injected(cache.k_codes, cache, "k")  # [b, t, h, d], 1024 + f_d * c
    ev = _injected(cache.v_codes, cache, "v")  # f_d * c * 2^-24
    fk = packing.channel_radix(cfg.bits, "k", dim).to(cache.device, F64)
    fv = packing.channel_radix(cfg.bits, "v", dim).to(cache.device, F64) * V_UNIT  # a code's unit in the operand

    fold_k = _scores_token_k if cfg.k_mode == "token" else _scores_channel_k
    scores = fold_k(qg, ek, k_params.to(F64), fk, group, rnd_k)  # [b, h, r, T]
    tail_k = cache.k_tail.to(F64)  # [b, h, G, d]
    tail_scores = torch.einsum("bhrd,bhid->bhri", qg, tail_k)

    tokens = torch.arange(scores.shape[-1], device=cache.device)
    valid = tokens < cache.packed_lens.long()[:, None]
    tail_valid = torch.arange(group, device=cache.device) < cache.tail_lens.long()[:, None]
    every = torch.cat([scores, tail_scores], dim=-1) * sm_scale
    every = every.masked_fill(~torch.cat([valid, tail_valid], dim=1)[:, None, None, :], -math.inf)
    # Unnormalized p as in the kernels' online softmax; the denominator keeps plain p.
    p = torch.exp(every - every.amax(dim=-1, keepdim=True))
    p_packed, p_tail = p[..., : scores.shape[-1]], p[..., scores.shape[-1] :]

    fold_v = _output_token_v if cfg.v_mode == "token" else _output_channel_v
    out = fold_v(p_packed, ev, v_params.to(F64), fv, group, rnd_v)
    out = out + torch.einsum("bhri,bhid->bhrd", p_tail, cache.v_tail.to(F64))
    out = out / p.sum(dim=-1, keepdim=True)
    return out.reshape(batch, num_q_heads, dim)


# ----------------------------------------------------------------------------- unpacking


def _injected(words: torch.Tensor, cache: QuantizedKVCache, kind: str) -> torch.Tensor:
    """The operands made from the packed words, as float64 [b, T, h, d]: exactly bias + unit f_d c.

    packing.extract per position (the kernels' shift, mask and bias), read as two fp16 values.
    """
    cfg, dim, heads = cache.config, cache.head_dim, cache.num_kv_heads
    page, blk = cfg.page_size, packing.block_tokens(kind)
    dtype = OPERAND_DTYPES[packing.OPERANDS[kind].dtype]
    phys = cache.page_table.long()
    batch, pages = phys.shape
    blocks = words.view(*words.shape[:2], page // blk, -1)[phys]  # [b, pages, h, page/blk, words]
    values = []
    for k in range(packing.positions_per_half(cfg.bits)):
        pair = packing.extract(blocks, cfg.bits, kind, k).view(torch.int16).view(dtype)  # half 0 first
        values.append(pair.unflatten(-1, (-1, 2)).to(F64))  # [..., words, 2]
    slots = torch.stack(values, dim=-1).flatten(-3)  # [..., words * 2 * P]
    inverse = torch.argsort(packing.tile_positions(cfg.bits, kind, dim).view(-1)).to(slots.device)
    block = slots[..., inverse].unflatten(-1, (blk, dim))  # [b, pages, h, page/blk, blk, d]
    return block.permute(0, 1, 3, 4, 2, 5).reshape(batch, pages * page, heads, dim)


def _rounder(round_operands: bool | torch.dtype, kind: str):
    """The rounding of a kind's folded MMA operand: none, the kernels' type, or a given dtype."""
    if round_operands is False:
        return lambda x: x
    if round_operands is True:
        dtype = OPERAND_DTYPES[packing.OPERANDS[kind].dtype]
    else:
        dtype = round_operands
    return lambda x: x.to(dtype).to(F64)


# ----------------------------------------------------------------------------- QK^T folds


def _scores_token_k(qg, ek, params, f, group, rnd):
    """Token-wise K, accumulator fold: per channel group g, s_{t,g} (acc - 1024 sum q/f) + z_{t,g} sum q."""
    b, h, r, d = qg.shape
    n_groups = d // group
    q_f = rnd(qg / f).view(b, h, r, n_groups, group)  # the radix factor folds into Q
    e = ek.view(*ek.shape[:3], n_groups, group)  # [b, t, h, g, i]
    acc = torch.einsum("bhrgi,bthgi->bhrtg", q_f, e)  # one MMA per channel group
    q_f_sum = q_f.sum(-1)[:, :, :, None, :]  # [b, h, r, 1, g]
    q_sum = qg.view(b, h, r, n_groups, group).sum(-1)[:, :, :, None, :]
    scale = params[..., 0].permute(0, 2, 1, 3)[:, :, None]  # [b, h, 1, t, g]
    offset = params[..., 1].permute(0, 2, 1, 3)[:, :, None]
    return (scale * (acc - K_BIAS * q_f_sum) + offset * q_sum).sum(-1)


def _scores_channel_k(qg, ek, params, f, group, rnd):
    """Channel-wise K, operand fold: q~ = q s_{T,d} / f_d per token group, plus sum_d q_d z_{T,d}."""
    b, h, _, d = qg.shape
    scale = params[..., 0].permute(0, 2, 1, 3)[:, :, None]  # [b, h, 1, j, d]
    offset = params[..., 1].permute(0, 2, 1, 3)[:, :, None]
    q_t = rnd(qg[:, :, :, None, :] * scale / f)  # [b, h, r, j, d]
    e = ek.view(b, -1, group, h, d)  # [b, j, i, h, d]
    acc = torch.einsum("bhrjd,bjihd->bhrji", q_t, e)
    bias = K_BIAS * q_t.sum(-1)  # [b, h, r, j]
    shift = (qg[:, :, :, None, :] * offset).sum(-1)
    return (acc - bias[..., None] + shift[..., None]).flatten(-2)


# ----------------------------------------------------------------------------- PV folds


def _output_token_v(p, ev, params, f, group, rnd):
    """Token-wise V, operand fold: p~ = p s_{t,g} per channel group, then / f_d (the operand's
    unit within), minus the bias sum (none for fp16 subnormals), plus sum p z."""
    b, h, _, t = p.shape
    d = ev.shape[-1]
    n_groups = d // group
    scale = params[..., 0].permute(0, 2, 1, 3)[:, :, None]  # [b, h, 1, t, g]
    offset = params[..., 1].permute(0, 2, 1, 3)[:, :, None]
    p_s = rnd(p[..., None] * scale)  # [b, h, r, t, g]: one P operand per channel group
    e = ev.view(b, t, h, n_groups, group)
    acc = torch.einsum("bhrtg,bthgi->bhrgi", p_s, e)
    bias = V_BIAS * p_s.sum(3)[..., None]  # [b, h, r, g, 1]
    shift = (p[..., None] * offset).sum(3)[..., None]
    return ((acc - bias) / f.view(n_groups, group) + shift).flatten(-2)


def _output_channel_v(p, ev, params, f, group, rnd):
    """Channel-wise V, accumulator fold per token group T: s_{T,d} / f_d (acc - bias sum_T p) + z_{T,d} sum_T p."""
    b, h, r, _ = p.shape
    d = ev.shape[-1]
    p_t = rnd(p).view(b, h, r, -1, group)  # [b, h, r, j, i]
    e = ev.view(b, -1, group, h, d)  # [b, j, i, h, d]
    acc = torch.einsum("bhrji,bjihd->bhrjd", p_t, e)  # one MMA per token group, never mixed
    bias = V_BIAS * p_t.sum(-1)[..., None]  # the bias sum uses the same (rounded) operand
    mass = p.view(b, h, r, -1, group).sum(-1)[..., None]
    scale = params[..., 0].permute(0, 2, 1, 3)[:, :, None]  # [b, h, 1, j, d]
    offset = params[..., 1].permute(0, 2, 1, 3)[:, :, None]
    return (scale / f * (acc - bias) + offset * mass).sum(3)


def _check_gqa(num_q_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads <= 0 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}; expected "
            "a whole number of query heads per KV head (GQA)."
        )
