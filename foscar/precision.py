"""What a kernel's V-side arithmetic does to the error of decode attention, modelled on a CPU.

O^T = V^T P^T runs on the Tensor Cores, whose fp32 accumulation cuts every addend towards zero
at the alignment of the largest (foscar/tcmodel.py). The K side and the softmax only see
rounding errors of random sign; the V side, with codes injected as bias + f c (bf16 128 or
fp16 1024) and positive probabilities, sees a cut of one sign, proportional to the running sum
of the bias, and that
error does not average out: relative to the output, which shrinks as 1/sqrt(context) for
random data, it grows with the context. This module replays exactly that part:

  p~ = p * s (token-wise V) or p (channel-wise V) in the operand type, from exact float64 p;
  raw = the chain of MMAs over a kernel's token tiles, each step through the H200 model;
  the fold of raw into the fp32 output at the kernel's flush points, exact, or (token-wise V,
  `item_tokens`) in fp32 as the kernels fold it over each work item;
  the output rounded to bf16;

and compares with float64 attention over the same dequantized cache. The K side is taken as
exact, so the model is a lower bound of a kernel's error at short context, and tracks it where
the V side dominates (tests/foscar/test_precision.py checks it against the H200).

A kernel's arithmetic (`VArithmetic`) says what its A operands hold (bias + f c, the centred
f (c - mid), or since v23 the unbiased fp16 subnormals f c 2^-24) and which tokens share one
accumulator between two flushes (`chains`).

The last section models the one K-side choice that moves the error: where channel-wise K's
offsets enter the scores beside its rounded integer Q~ (`channel_k_scores`, v27). The section
after it asks what P~ as unsigned 8-bit integers, or 16 bits in two such parts (int8 Tensor
Cores for PV), would cost beside today's fp16 operand (`pv_operand_output`, `PV_OPERAND_FORMS`,
`u8_run_headroom`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from foscar import packing, tcmodel
from foscar.cache import QuantizedKVCache, logical_view
from foscar.config import QuantConfig

TILE = 16  # tokens one MMA step contracts over (K of m16n8k16 / m64n8k16)

# A chain plan: for one sequence of `n_tokens` packed tokens, the token tiles (16 tokens each)
# that go into one accumulator between two flushes, as a list of int arrays [tiles, 16] of
# token indices (a tile may be padded with -1 past the end).
ChainPlan = Callable[[int, QuantConfig], list[np.ndarray]]


@dataclass(frozen=True)
class VArithmetic:
    name: str
    centred: bool  # A = f (c - mid) (no bias); else A = 128 + f c
    chains: ChainPlan
    # The radix factor of each channel's V operand, from (bits, head_dim); None: the layout of
    # foscar/packing.py (the kernels in the tree).
    radix: Callable[[int, int], np.ndarray] | None = None
    # The operands' type: "bf16" (A = 128 + f c), "fp16" (A = 1024 + f c, p~ rounded to fp16
    # with its subnormals) or "fp16-subnormal" (A = f c 2^-24: the masked bits alone, no bias; p~
    # fp16).
    operand: str = "bf16"
    # Token-wise V: None, each chain is folded (raw / f) when it ends and the bias leaves at the
    # end through a sum of p~; k, the chain runs on and every k steps the bias, summed on the
    # Tensor Cores from the same p~ (A = bias), is subtracted from it (fp32).
    bias_every: int | None = None
    # Channel-wise V chains, when they differ from `chains`.
    channel_chains: ChainPlan | None = None
    # Token-wise V, one-tile chains: None, the fold is exact; n, the kernels' fp32 fold over work
    # items (splits) of n tokens: each warp's output adds its 16-token products in fp32, and its
    # lanes sum p~ and the offsets p~ z / s (two tokens of each tile a lane) in fp32, until the
    # item ends and the bias leaves. The output keeps the bias (1024 / f times the sum of p~)
    # all along, so its rounding grows with the item (docs/PERFORMANCE.md, v14).
    item_tokens: int | None = None
    # With item_tokens: None, the lanes' sums leave the output only at the item's end; k, every k
    # of a warp's tiles (trips) as well, the sums starting again from zero (v16-v22's flush).
    flush_tiles: int | None = None

    @property
    def dtype(self) -> str:
        """The operands' floating-point type: 'bf16' or 'fp16'."""
        return "bf16" if self.operand == "bf16" else "fp16"

    @property
    def bias(self) -> float:
        return {"bf16": 128.0, "fp16": 1024.0, "fp16-subnormal": 0.0}[self.operand]

    @property
    def unit(self) -> float:
        """What one unit of f c is worth in the operand."""
        return packing.FP16_PATTERN_UNIT if self.operand == "fp16-subnormal" else 1.0

    def channel_radix(self, bits: int, dim: int) -> np.ndarray:
        if self.radix is not None:
            return self.radix(bits, dim)
        return np.asarray(packing.channel_radix(bits, "v", dim), dtype=np.float64)


def v4_radix(bits: int, dim: int) -> np.ndarray:
    """v4's V operands: bf16 codes read at factors 1, 4, 16, 1, 4, 16, 1, 4 (INT2) or 1 (INT4),
    channel d at position (d // 8) % P."""
    factors = [1, 4, 16, 1, 4, 16, 1, 4] if bits == 2 else [1, 1, 1, 1]
    return np.array([factors[(d // 8) % (16 // bits)] for d in range(dim)], dtype=np.float64)


def _tiles(tokens: np.ndarray) -> np.ndarray:
    pad = (-len(tokens)) % TILE
    return np.concatenate([tokens, -np.ones(pad, dtype=np.int64)]).reshape(-1, TILE)


def v4_chains(num_sms: int = 132, warps: int = 8, kv_heads: int = 8, batch: int = 1) -> ChainPlan:
    """v4 (commit cb0e876): split-KV units of max(64, G) tokens, dealt to 8 warps round-robin;
    each warp folds its accumulator into fp32 every 8 chunks of 64 tokens (token-wise V) or
    at each group's end (channel-wise V)."""
    def plan(n_tokens: int, cfg: QuantConfig) -> list[np.ndarray]:
        unit = max(64, cfg.group_size)
        units = math.ceil(n_tokens / unit)
        splits, per_split = _v4_plan_splits(batch, kv_heads, units, num_sms, warps)
        chains = []
        for split in range(splits):
            u0 = split * per_split
            u1 = units if split == splits - 1 else min(u0 + per_split, units)
            for w in range(warps):
                chunks = [np.arange(u * unit + c * 64, min(u * unit + (c + 1) * 64, n_tokens))
                          for u in range(u0 + w, u1, warps) for c in range(unit // 64)]
                chunks = [c for c in chunks if len(c)]
                if cfg.v_mode == "token":
                    for i in range(0, len(chunks), 8):
                        chains.append(_tiles(np.concatenate(chunks[i : i + 8])))
                else:  # a group's chunks are consecutive in a warp's list
                    per_group = max(1, cfg.group_size // 64)
                    for i in range(0, len(chunks), per_group):
                        toks = np.concatenate(chunks[i : i + per_group])
                        for g0 in range(0, len(toks), cfg.group_size):
                            chains.append(_tiles(toks[g0 : g0 + cfg.group_size]))
        return chains

    return plan


def _v4_plan_splits(batch: int, kv_heads: int, max_units: int, num_sms: int, warps: int) -> tuple[int, int]:
    """v4's split planner (one CTA of 8 warps per SM; splits of whole units)."""
    best = None
    for splits in range(1, min(64, max(1, max_units)) + 1):
        per_split = math.ceil(max_units / splits)
        used = math.ceil(max_units / per_split)
        cost = math.ceil(batch * kv_heads * used / num_sms) * (math.ceil(per_split / warps) + 0.5)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, used, per_split)
    return best[1], best[2]


def sequential_chains(flush_tokens: int) -> ChainPlan:
    """One accumulator per run of `flush_tokens` consecutive tokens (channel-wise V: per group,
    whichever is shorter)."""

    def plan(n_tokens: int, cfg: QuantConfig) -> list[np.ndarray]:
        span = flush_tokens if cfg.v_mode == "token" else min(flush_tokens, cfg.group_size)
        return [_tiles(np.arange(t0, min(t0 + span, n_tokens))) for t0 in range(0, n_tokens, span)]

    return plan


def warp_chains(chunks_per_split: int, warps: int = 4) -> ChainPlan:
    """The per-warp consumer: a split of `chunks_per_split` 64-token chunks; warp w takes tokens
    16 w .. 16 w + 15 of each chunk, all into one accumulator (the bias leaves on the way:
    VArithmetic.bias_every)."""
    def plan(n_tokens: int, cfg: QuantConfig) -> list[np.ndarray]:
        chunks = math.ceil(n_tokens / 64)
        chains = []
        for c0 in range(0, chunks, chunks_per_split):
            for w in range(warps):
                toks = np.concatenate([np.arange(64 * c + 16 * w, 64 * c + 16 * w + 16)
                                       for c in range(c0, min(c0 + chunks_per_split, chunks))])
                toks = np.where(toks < n_tokens, toks, -1)
                if (toks >= 0).any():
                    chains.append(toks.reshape(-1, TILE))
        return chains

    return plan


V4 = VArithmetic("v4: bf16 128 + f c, flushed every 8 chunks per warp", centred=False, chains=v4_chains(),
                 radix=v4_radix)


@dataclass(frozen=True)
class HeadData:
    """One KV head of a sequence as every arithmetic starts from it (float64 but the codes)."""

    codes: np.ndarray  # uint8 [n, d], V's codes
    scale: np.ndarray  # V's scales: [n] per token (token-wise, G = d) or [n / G, d] per group (channel-wise)
    offset: np.ndarray  # V's offsets, as scale
    p: np.ndarray  # [r, n], exp(score - the head's maximum) over the dequantized K
    ref: np.ndarray  # [r, d], float64 attention over the dequantized cache


@dataclass(frozen=True)
class SequenceData:
    """What model_output reads of one sequence of a cache, computed once by sequence_data so that
    several arithmetics can be modelled on it (tests/foscar/test_precision.py models up to five
    on one 128K-token sequence)."""

    config: QuantConfig
    head_dim: int
    n: int  # packed tokens
    heads: tuple[HeadData, ...]  # the KV heads modelled, in order


def sequence_data(q: torch.Tensor, cache: QuantizedKVCache, seq: int = 0,
                  kv_heads: list[int] | None = None) -> SequenceData:
    """Sequence `seq` of the cache read back, its scores and reference (model_output's inputs).

    The cache must hold no BF16 tail for this sequence (a length that is a multiple of G)."""
    cfg, dim = cache.config, cache.head_dim
    view = logical_view(cache, seq)
    if view.k_tail.shape[0]:
        raise ValueError("model_output takes sequences without a BF16 tail (length a multiple of the group size).")
    n = view.v_codes.shape[0]
    heads = range(cache.num_kv_heads) if kv_heads is None else kv_heads
    ratio = q.shape[1] // cache.num_kv_heads
    out = []
    for h in heads:
        k = _dequant(view.k_codes[:, h], view.k_params[:, h], cfg.k_mode, cfg.group_size)
        codes = view.v_codes[:, h].numpy()  # [n, d] uint8
        s_v, z_v = _params(view.v_params[:, h], cfg.v_mode, cfg.group_size, n, dim)
        qh = q[seq, h * ratio : (h + 1) * ratio].double().numpy()  # [r, d]
        scores = qh @ k.T / math.sqrt(dim)  # [r, n]
        # Each query head against its own maximum, as the kernels' softmax keeps one per column
        # (a head whose scores sit below another's keeps its own p, not one flushed toward zero).
        p = np.exp(scores - scores.max(axis=1, keepdims=True))  # [r, n]
        v = codes.astype(np.float64) * s_v + z_v
        ref = (p @ v) / p.sum(axis=1, keepdims=True)
        if cfg.v_mode == "token":  # one scale per token at G = head_dim (model_output refuses others)
            scale, offset = s_v[:, 0].copy(), z_v[:, 0].copy()
        else:  # s_v[t] = scale[t // G]
            scale, offset = s_v[:: cfg.group_size].copy(), z_v[:: cfg.group_size].copy()
        out.append(HeadData(codes=np.array(codes), scale=scale, offset=offset, p=p, ref=ref))
    return SequenceData(config=cfg, head_dim=dim, n=n, heads=tuple(out))


def model_output(q: torch.Tensor, cache: QuantizedKVCache, arith: VArithmetic,
                 mma: tcmodel.MmaModel | None = None, seq: int = 0,
                 kv_heads: list[int] | None = None, data: SequenceData | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(modelled output, float64 reference) of one sequence, [kv_heads, ratio, head_dim] each.

    The cache must hold no BF16 tail for this sequence (a length that is a multiple of G).
    `data`: sequence_data(q, cache, seq, kv_heads), when the caller has it already."""
    if data is None:
        data = sequence_data(q, cache, seq, kv_heads)
    cfg, dim, n = data.config, data.head_dim, data.n
    mma = mma or tcmodel.h200(arith.dtype)  # the H200's, by operand type
    f_ch = arith.channel_radix(cfg.bits, dim) * arith.unit  # a code's worth in its operand
    mid = (2**cfg.bits - 1) / 2
    chains = arith.chains(n, cfg)
    outs, refs = [], []
    for head in data.heads:
        codes = head.codes.astype(np.float64)  # [n, d]
        p, ref = head.p, head.ref
        rnd = _bf16 if arith.dtype == "bf16" else _fp16
        bias = 0.0 if arith.centred else arith.bias
        # B operand per token: p~ = bf16(p s) (token-wise; one scale per token at G = head_dim)
        if cfg.v_mode == "token":
            if cfg.group_size != dim:
                raise ValueError("the model folds token-wise V at group_size == head_dim only")
            s_tok, z_tok = head.scale, head.offset  # [n]
            p_op = rnd(p * s_tok[None, :])  # [r, n]
            a_val = f_ch[None, :] * (codes - mid) if arith.centred else bias + f_ch[None, :] * codes
            s_safe = np.where(s_tok != 0, s_tok, 1.0)  # a constant group: codes 0, any scale
            off = z_tok / s_safe + (mid if arith.centred else 0.0)  # [n]
            if arith.bias_every:
                # One accumulator per chain, the bias taken out every bias_every steps.
                raw = _run_chains(mma, chains, a_val, p_op, bias_every=arith.bias_every, bias=bias)
                o = raw / f_ch[:, None] + (p_op @ off)[None, :]
            elif arith.item_tokens:
                firsts, raws = _run_chains(mma, chains, a_val, p_op, per_chain=True)  # [c], [c, d, r]
                o = _fold_items_f32(firsts, raws, p_op, off, f_ch, bias, n, arith.item_tokens, arith.flush_tiles)
            else:
                raw = _run_chains(mma, chains, a_val, p_op)  # [d, r]
                # Fold: raw / f, bias and offsets with the same rounded p~ (exact, fp32 in kernels).
                o = raw / f_ch[:, None] + (p_op @ off)[None, :] - bias * (p_op.sum(axis=1)[None, :] / f_ch[:, None])
        else:
            # Channel-wise V: one chain per group (or part of one); its accumulator is folded
            # with the group's scale and offset per channel and the chain's sum of p.
            p_op = rnd(p)
            a_val = f_ch[None, :] * (codes - mid) if arith.centred else bias + f_ch[None, :] * codes
            cchains = arith.channel_chains(n, cfg) if arith.channel_chains else chains
            firsts, raws = _run_chains(mma, cchains, a_val, p_op, per_chain=True)  # [c], [c, d, r]
            psum = np.stack([p_op[:, c[c >= 0]].sum(axis=1) for c in chains_in_order(cchains, firsts)])  # [c, r]
            groups = firsts // cfg.group_size
            s_g, z_g = head.scale[groups], head.offset[groups]  # [c, d]
            centre = mid if arith.centred else 0.0
            o = np.einsum("cd,cdr->dr", s_g / f_ch[None, :], raws - bias * psum[:, None, :]) + \
                np.einsum("cd,cr->dr", z_g + s_g * centre, psum)
        out = (o / p.sum(axis=1)[None, :]).T  # [r, d]
        outs.append(_bf16(out))
        refs.append(ref)
    return np.stack(outs), np.stack(refs)


def model_error(q: torch.Tensor, cache: QuantizedKVCache, arith: VArithmetic, **kw) -> float:
    out, ref = model_output(q, cache, arith, **kw)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


# Chains of one length run through _run_chains this many at a time: the model's temporaries
# ([chains, 16, r, d] float64 and int32) stay about a megabyte, in cache. Whole groups of 16K
# one-tile chains (256K tokens) made temporaries of over 500 MB each, and the time went to page
# faults and memory traffic. Chains are independent, so the block size does not change a value
# (tests/foscar/test_precision.py runs one case at a block of one chain and at the default).
CHAIN_BLOCK_ELEMENTS = 1 << 17


def _run_chains(mma: tcmodel.MmaModel, chains: list[np.ndarray], a_val: np.ndarray, p_op: np.ndarray,
                per_chain: bool = False, bias_every: int | None = None, bias: float = 0.0,
                block: int | None = None):
    """Every chain's accumulator, each MMA step through the model; chains of equal length run
    together, vectorised, `block` chains at a time (default: CHAIN_BLOCK_ELEMENTS products).
    a_val [n, d] (A values per token and channel), p_op [r, n] (B values).
    With bias_every = k, a second accumulator sums bias * p~ through the model (A = bias) and is
    subtracted from the first (fp32, to nearest) every k steps and at the end.

    Returns the sum over chains [d, r], or with per_chain=True (first token of each chain [c],
    accumulators [c, d, r]) in the order chains_in_order() gives."""
    dim, ratio = a_val.shape[1], p_op.shape[0]
    a_pad = np.concatenate([a_val, np.zeros((1, dim))])  # index -1: a zero token
    p_pad = np.concatenate([p_op, np.zeros((ratio, 1))], axis=1)
    block = block or max(1, CHAIN_BLOCK_ELEMENTS // (TILE * dim * ratio))
    firsts, accs = [], []
    for idx in _by_length(chains):  # [chains, tiles, 16]
        group = np.empty((idx.shape[0], ratio, dim))
        for c0 in range(0, idx.shape[0], block):
            blk = idx[c0 : c0 + block]
            # k (the 16 tokens of a step) on axis 1, d innermost: [chains, 16, r, d] products.
            acc = np.zeros((blk.shape[0], ratio, dim))
            bacc = np.zeros((blk.shape[0], ratio, 1))
            a_bias = np.full((blk.shape[0], TILE, 1, 1), bias)
            for t in range(blk.shape[1]):
                tok = blk[:, t]  # [chains, 16]
                a = a_pad[tok][:, :, None, :]  # [chains, 16, 1, d]
                b = p_pad[:, tok].transpose(1, 2, 0)[:, :, :, None]  # [chains, 16, r, 1]
                acc = mma.dot(acc, a, b, axis=1)
                if bias_every:
                    bacc = mma.dot(bacc, a_bias, b, axis=1)  # padding tokens carry p~ = 0
                    if (t + 1) % bias_every == 0 or t == blk.shape[1] - 1:
                        acc = tcmodel.round_f32(acc - bacc, "rne")
                        bacc = np.zeros_like(bacc)
            group[c0 : c0 + block] = acc
        firsts.append(idx[:, 0, 0])
        accs.append(np.ascontiguousarray(group.transpose(0, 2, 1)))  # [chains, d, r], as summed before
    if not per_chain:
        return sum(acc.sum(axis=0) for acc in accs)
    return np.concatenate(firsts), np.concatenate(accs)


def _fold_items_f32(firsts: np.ndarray, raws: np.ndarray, p_op: np.ndarray, off: np.ndarray, f_ch: np.ndarray,
                    bias: float, n: int, item_tokens: int, flush_tiles: int | None = None, warps: int = 4,
                    lanes: int = 8) -> np.ndarray:
    """Token-wise V's fold as the kernels run it (VFoldToken), rounded to fp32 at every step:
    per item of `item_tokens` tokens and warp (warp w takes tile w of every 64-token chunk), the
    output adds raw / f of each of its tiles; per lane (two tokens of each tile, `lanes` lanes a
    head) p~ and p~ z / s are summed; at the item's end (and every `flush_tiles` of the warp's
    tiles) the lanes' sums leave the output with the bias, and the items' outputs are added.
    raws [c, d, r] are one-tile products (first token `firsts`); returns [d, r]."""
    if item_tokens % (TILE * warps):
        raise ValueError(f"item_tokens={item_tokens} is not a whole number of {TILE * warps}-token chunks")
    if raws.shape[0] != math.ceil(n / TILE):
        raise ValueError("the fp32 fold models chains of one 16-token tile (the kernels' one k-step products)")
    order = np.argsort(firsts)
    firsts, raws = firsts[order], raws[order]
    dim, ratio = raws.shape[1], raws.shape[2]
    p_pad = np.concatenate([p_op, np.zeros((ratio, TILE))], axis=1)
    off_pad = np.concatenate([off, np.zeros(TILE)])
    item_of, warp_of = firsts // item_tokens, (firsts // TILE) % warps

    def flush(out, psum, osum):  # the lanes' sums into the output, with the bias; the sums restart
        out = _f32(out + _f32(osum.sum(axis=0)[None, :] - bias / f_ch[:, None] * psum.sum(axis=0)[None, :]))
        return out, np.zeros_like(psum), np.zeros_like(osum)

    total = np.zeros((dim, ratio))
    for item in range(math.ceil(n / item_tokens)):
        item_out = np.zeros((dim, ratio))
        for w in range(warps):
            out = np.zeros((dim, ratio))
            psum = np.zeros((lanes, ratio))
            osum = np.zeros((lanes, ratio))
            for i, c in enumerate(np.nonzero((item_of == item) & (warp_of == w))[0]):
                out = _f32(out + _f32(raws[c] / f_ch[:, None]))
                tile = p_pad[:, firsts[c]: firsts[c] + TILE]  # [r, 16]
                zs = off_pad[firsts[c]: firsts[c] + TILE]
                for j in range(TILE // lanes):  # lane i holds tokens 2 i and 2 i + 1 of the tile
                    pt = tile[:, j::TILE // lanes].T  # [lanes, r]
                    psum = _f32(psum + pt)
                    osum = _f32(osum + _f32(pt * zs[j::TILE // lanes, None]))
                if flush_tiles and (i + 1) % flush_tiles == 0:
                    out, psum, osum = flush(out, psum, osum)
            out, _, _ = flush(out, psum, osum)
            item_out = _f32(item_out + out)
        total = total + item_out  # the split merge (fp32 there too; its few adds are negligible)
    return total


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float64)


def _by_length(chains: list[np.ndarray]) -> list[np.ndarray]:
    by_len: dict[int, list[np.ndarray]] = {}
    for c in chains:
        by_len.setdefault(len(c), []).append(c)
    return [np.stack(group) for _, group in sorted(by_len.items())]


def chains_in_order(chains: list[np.ndarray], firsts: np.ndarray) -> list[np.ndarray]:
    """The chains in the order _run_chains(per_chain=True) returns their accumulators."""
    order = [c for group in _by_length(chains) for c in group]
    assert all(c[0, 0] == f for c, f in zip(order, firsts))
    return order


def _bf16(x: np.ndarray) -> np.ndarray:
    return tcmodel.operand_values(tcmodel.operand_bits(x, "bf16"), "bf16")


def _fp16(x: np.ndarray) -> np.ndarray:
    return tcmodel.operand_values(tcmodel.operand_bits(x, "fp16"), "fp16")


def _params(params: torch.Tensor, mode: str, group: int, n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(scale, offset) broadcast to [n, d] (token-wise) or [n, d] per token's group (channel-wise)."""
    p = params.double().numpy()
    if mode == "token":  # [n, d/G, 2]
        s = np.repeat(p[..., 0], group, axis=1)
        z = np.repeat(p[..., 1], group, axis=1)
    else:  # [n/G, d, 2]
        s = np.repeat(p[..., 0], group, axis=0)[:n]
        z = np.repeat(p[..., 1], group, axis=0)[:n]
    return s, z


def _dequant(codes: torch.Tensor, params: torch.Tensor, mode: str, group: int) -> np.ndarray:
    n, dim = codes.shape
    s, z = _params(params, mode, group, n, dim)
    return codes.numpy().astype(np.float64) * s + z

def block_radix(int4: Sequence[float], int2: Sequence[float]) -> Callable[[int, int], np.ndarray]:
    """A V schedule's radix factors by channel block: channel 32 w + 8 b + g of a block at
    int4[b] (INT4) or int2[b] (INT2), as VArithmetic.radix takes them."""
    def radix(bits: int, dim: int) -> np.ndarray:
        factors = int4 if bits == 4 else int2
        return np.array([factors[(d % 32) // 8] for d in range(dim)], dtype=np.float64)
    return radix


# v5's bf16 V operands (the warpgroup consumer, until 2026-12-02): factor 2 (INT4) or [2, 8, 8, 32].
v5_radix = block_radix([2, 2, 2, 2], [2, 8, 8, 32])


# v5 (the warpgroup consumer): V operands bf16 128 + f c as injected; each 64-token chunk's PV
# chain starts from zero and is folded into the fp32 output when it completes (a channel-wise
# chunk of two 32-token groups keeps one chain per group), the bias leaving through a sum of p.
V5 = VArithmetic("v5: bf16 128 + f c, one chain per 64-token chunk", centred=False, chains=sequential_chains(64),
                 radix=v5_radix)

# The arithmetic of the kernels v7 to v22 (and v8's paired items, whose second head's
# k-step adds exact zeros to the first head's columns and the reverse: tests/foscar/test_tcmodel.py):
# V operands fp16 1024 + f c, every code at f >= 16 (packing.py's schedule), p~ fp16; each warp's
# 16-token product (one k-step) starts from zero and is folded into the fp32 output at once; the
# bias leaves through a sum of p~.
# v7-v22's V schedule, every code at f >= 16: 16 (INT4) or [64, 16, 256, 16] (INT2).
v7_radix = block_radix([16, 16, 16, 16], [64, 16, 256, 16])


V7 = VArithmetic("v7: fp16 1024 + f c at f >= 16, each warp's 16-token product folded at once", centred=False,
                 chains=sequential_chains(16), operand="fp16", radix=v7_radix)


# How often the v16-v22 kernels took token-wise V's sums out of the output (kVFlushTrips, until
# v23 removed the bias). v7_items(n) without it models the kernels before v16.
V_FLUSH_TRIPS = 32


def v7_items(item_tokens: int, flush_tiles: int | None = None) -> VArithmetic:
    """The kernels' arithmetic (V7) with token-wise V's fp32 fold over work items (splits) of
    `item_tokens` tokens, the bias and offsets leaving the output at the item's end or every
    `flush_tiles` trips: the planner's longest split (foscar.kernels.MAX_ITEM_CHUNKS) is sized
    by it."""
    flushed = f", flushed every {flush_tiles} trips" if flush_tiles else ""
    return replace(V7, name=f"{V7.name}, fp32 fold over items of {item_tokens} tokens{flushed}",
                   item_tokens=item_tokens, flush_tiles=flush_tiles)


# v7 with token-wise V chained: one accumulator per (split, warp) over the warp's 16 tokens of
# each chunk, the bias leaving every 4 chunks; channel-wise V folds each 16-token product at once.
# Its first schedule (v7_first_radix) was wrong on the H200; at f >= 16 the model holds it, and
# it measured no faster (docs/PERFORMANCE.md), so the kernels do not chain. radix: by default
# v7's f >= 16 schedule.
def v7_chained(chunks_per_split: int, radix: Callable[[int, int], np.ndarray] = v7_radix) -> VArithmetic:
    return VArithmetic(f"v7: fp16 1024 + f c, one chain per warp and split of {chunks_per_split} chunks, "
                       "bias out every 4", centred=False, chains=warp_chains(chunks_per_split), radix=radix,
                       operand="fp16", bias_every=4, channel_chains=sequential_chains(16))


# The first fp16 V schedule measured (commit ea0b0d3): INT4 blocks at f = 1, 16, 1, 16 and INT2 at
# 64, 4, 256, 16 (codes read in place at f = 1 and 4).
v7_first_radix = block_radix([1, 16, 1, 16], [64, 4, 256, 16])


# The arithmetic of the kernels in foscar/csrc since v23: V operands fp16 subnormals f c 2^-24
# (no bias; INT4 codes read in place at f = 1 and 16, INT2 at 4 to 256: packing.py's schedule;
# the H200 aligns a subnormal by its exponent field, tcmodel.H200_MMA_FP16, and INT2 codes read at
# f = 1 lost about 2^-15 of each product toward zero, a loss that grew with the context),
# p~ fp16; each warp's 16-token product (one k-step) starts from zero and is folded into the
# fp32 output at once; the offsets leave through a sum of p~ z / s at the item's end. With no
# bias in the output there is nothing to flush (v16-v22 flushed every V_FLUSH_TRIPS trips).
V23 = VArithmetic("v23: fp16 subnormals f c 2^-24, each warp's 16-token product folded at once", centred=False,
                  chains=sequential_chains(16), operand="fp16-subnormal")
CURRENT = V23


def v23_items(item_tokens: int) -> VArithmetic:
    """The kernels' arithmetic (V23) with token-wise V's fp32 fold over work items of
    `item_tokens` tokens: the output and the lanes' offset sums in fp32 until the item ends."""
    return replace(V23, name=f"{V23.name}, fp32 fold over items of {item_tokens} tokens", item_tokens=item_tokens)


# ----------------------------------------------------------------------------- the K side's bias
# Channel-wise K rounds Q~ = q s lambda 2^e / f to an integer of 15 bits (foscar_decode.cuh,
# KFoldChannel) and adds the offsets as a bias; where the bias comes from decides whether that
# rounding errs around zero. With e_d = 2^-e f Q~_d - q_d lambda s_d (the rounding in real units):
#   "rounded"  sum Q~ f z / s 2^-e (v24-v26): the scores err by sum e_d (c_d + z_d / s_d), centred
#              only where z / s sits near -m (the group's values symmetric around zero);
#   "exact"    lambda sum q z: the error sum e_d c_d carries m sum e_d into every score of a group;
#   "centred"  lambda sum q z - m sum e_d, summed as lambda sum q (z + m s) - m 2^-e f sum Q~ (v27):
#              sum e_d (c_d - m), whatever the offsets;
# m = (2^bits - 1) / 2, the middle code.
K_BIAS_FORMS = ("rounded", "exact", "centred")


def channel_k_scores(q: np.ndarray, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray, bits: int,
                     form: str) -> tuple[np.ndarray, np.ndarray]:
    """Scores of one token group, channel-wise K, as the kernel forms them in float64.

    q [heads, d] (lambda included), codes [tokens, d], scale and offset [d] (the group's).
    Returns (scores the kernel computes, exact scores q . (s c + z)), each [heads, tokens].
    The kernel's f (radix factor) only shifts Q~'s rounding grid and is left out (f = 1).
    """
    if form not in K_BIAS_FORMS:
        raise ValueError(f"form={form!r} is not a bias form; expected one of {K_BIAS_FORMS}.")
    qt = q * scale  # [h, d]
    amax = np.abs(qt).max(axis=1, keepdims=True)
    e = 13 - np.floor(np.log2(amax))  # max |Q~| in [2^13, 2^14)
    q_int = np.rint(qt * 2.0 ** e)
    dot = (q_int @ codes.T) * 2.0 ** -e  # the int8 MMAs, exact, back in real units
    mid = 0.5 * ((1 << bits) - 1)
    if form == "rounded":
        bias = (q_int * (offset / scale)).sum(axis=1, keepdims=True) * 2.0 ** -e
    elif form == "exact":
        bias = (q * offset).sum(axis=1, keepdims=True)
    else:
        # as the kernel sums it: lambda sum q (z + m s) - m 2^-e sum Q~ = lambda sum q z - m sum e_d
        bias = (q * (offset + mid * scale)).sum(axis=1, keepdims=True) - mid * 2.0 ** -e * q_int.sum(axis=1, keepdims=True)
    exact = q @ (codes * scale + offset).T
    return dot + bias, exact


def channel_k_score_error(bits: int, form: str, *, channel_offset: float = 0.0, tokens: int = 128, heads: int = 4,
                          dim: int = 128, seed: int = 0) -> float:
    """RMS score error of one token group of Gaussian keys quantized per channel (min-max, fp16 scale
    and offset), each channel shifted by a Gaussian offset of std `channel_offset` (real keys have
    such channels); q standard normal times lambda = log2(e) / sqrt(dim)."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((tokens, dim)) + channel_offset * rng.standard_normal(dim)
    q = rng.standard_normal((heads, dim)) * (math.log2(math.e) / math.sqrt(dim))
    levels = (1 << bits) - 1
    lo, hi = k.min(axis=0), k.max(axis=0)
    scale = ((hi - lo) / levels).astype(np.float16).astype(np.float64)
    offset = lo.astype(np.float16).astype(np.float64)
    codes = np.clip(np.rint((k - offset) / scale), 0, levels)
    got, exact = channel_k_scores(q, codes, scale, offset, bits, form)
    return float(np.sqrt(np.mean((got - exact) ** 2)))


# ----------------------------------------------------------------- P as unsigned 8-bit integers
# A question for the V side (not a kernel in the tree): feed O^T = V^T P~^T to int8 Tensor Cores
# (mma.sync u8 x u8 -> exact int32, four codes a register instead of two). P~ must then be an
# integer in [0, 255]: P~_t = rint(a_t 2^E), a_t = p_t s_t (token-wise V) or p_t (channel-wise V),
# with 2^E chosen so that no P~ passes 255; the int32 sums are exact and leave at 2^-E. Forms:
#   "fp16"      today's operand: a rounded to fp16 (to nearest even), products and sums exact;
#   "u8-chunk"  E per (16-token step, query column): the largest 2^E with max_step a 2^E <= 255;
#   "u16-chunk" as u8-chunk with 16 bits (<= 65535): P~ in two u8 parts, two int8 MMAs a k-step;
#   "u8-run"    E per (query column, run): a run is a stretch of steps with one running maximum m
#               (a step that raises m starts a new one: the int32 sum leaves, scaled by the old
#               2^-E and the softmax factor), E taken from its first step, and a new run wherever
#               a later step would pass 255 (an overflow) or, channel-wise, a 128-token group
#               starts (the scale changes);
#   "e4m3"      a rounded to fp8 e4m3 (3 mantissa bits, to nearest even), no scaling: the FOSCAR
#               paper's P operand on Blackwell, for reference.
# The offsets ride on the same operand (token-wise: sum P~ 2^-E z / s; channel-wise: z sum P~ 2^-E),
# so every form errs only by the rounding of a; the denominator l = sum p is exact (fp32 p in the
# kernels). p = exp(score - m) with m the running maximum up to the current step, as an online
# softmax forms it; everything past the operand's rounding is exact (float64).
PV_OPERAND_FORMS = ("fp16", "u8-chunk", "u16-chunk", "u8-run", "u16-run", "e4m3")
PV_DATA = ("gauss", "peaked")
U8_MAX = 255
U16_MAX = 65535  # u16-chunk, u16-run: P~ = 256 hi + lo, both parts u8 (each its own int32 sum)
INT32_MAX = (1 << 31) - 1
# The largest radix factor a code is read at in its byte: INT2 64 (64 c <= 192), INT4 16 (<= 240).
U8_TOP_FACTOR = {2: 64, 4: 16}


@dataclass(frozen=True)
class PVOperandResult:
    """One form over one KV head: outputs [heads, d] and the u8 forms' integer bookkeeping."""

    form: str
    out: np.ndarray  # modelled output, before any bf16 rounding
    ref: np.ndarray  # float64 attention over the same dequantized cache
    runs: int = 0  # int32 accumulators that leave (u8 forms; all query columns together)
    overflows: int = 0  # u8-run: runs started because a step would pass 255
    longest_run: int = 0  # u8 forms: the most tokens one accumulator sums
    max_acc: float = 0.0  # u8 and u16 forms: the largest int32 sum (u16: of either part), every code at the top radix factor

    @property
    def error(self) -> float:
        return float(np.linalg.norm(self.out - self.ref) / np.linalg.norm(self.ref))

    @property
    def error_bf16(self) -> float:
        return float(np.linalg.norm(_bf16(self.out) - self.ref) / np.linalg.norm(self.ref))


def u8_run_headroom(bits: int, factor: int | None = None) -> int:
    """The most tokens an int32 accumulator of P~ (<= 255) times codes read at `factor` (default
    the top radix factor, U8_TOP_FACTOR) may sum before it could overflow: every P~ = 255 and
    every code at its largest, (2^bits - 1) factor."""
    factor = U8_TOP_FACTOR[bits] if factor is None else factor
    return INT32_MAX // (U8_MAX * ((1 << bits) - 1) * factor)


def u8_exponent(peak: np.ndarray, top: int = U8_MAX) -> np.ndarray:
    """The largest E (an integer, as float64) with peak 2^E <= top (255), per element; 0 where peak
    is 0."""
    peak = np.asarray(peak, dtype=np.float64)
    safe = np.where(peak > 0, peak, 1.0)
    e = np.floor(np.log2(top / safe))
    e -= np.ldexp(safe, e.astype(np.int64)) > top  # log2's last bit either way
    e += np.ldexp(safe, e.astype(np.int64) + 1) <= top
    return np.where(peak > 0, e, 0.0)


def e4m3(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest fp8 e4m3 value (to nearest even; subnormals down to 2^-9). Values past
    e4m3's largest, 448, are refused (e4m3fn has no infinity)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    if (a > 464).any():  # 464 rounds (to even) to 512: out of range
        raise ValueError(f"e4m3 holds at most 448; got {a.max():.4g}")
    _, ex = np.frexp(a)  # a = m 2^ex, 0.5 <= m < 1
    quantum = np.ldexp(1.0, np.maximum(ex - 1, -6) - 3)  # 3 mantissa bits; normals from 2^-6
    return np.copysign(np.minimum(np.rint(a / quantum) * quantum, 448.0), x)


def pv_inputs(kv_len: int, bits: int, v_mode: str, data: str = "gauss", *, heads: int = 4, dim: int = 128,
              peaks: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One KV head of the sweep's data (foscar.synthetic: Gaussian q, K and V, `heads` query heads
    on it), quantized by foscar.quantize (group 128, K channel-wise, V `v_mode`, fp16 parameters).

    Returns (scores [heads, n] = q . k / sqrt(d) over the dequantized K, codes [n, d], scale [n, d],
    offset [n, d]) as float64. data="peaked": `peaks` tokens (token 0, an attention sink, and
    peaks - 1 others drawn with the seed) score 8 to 12 above the largest of the rest, per head,
    so that they hold most of the probability mass at every length."""
    if data not in PV_DATA:
        raise ValueError(f"data={data!r} is not known; expected one of {PV_DATA}.")
    from foscar import synthetic
    from foscar.cache import quantize

    inp = synthetic.make_inputs(1, kv_len, num_q_heads=heads, num_kv_heads=1, head_dim=dim, seed=seed)
    cfg = QuantConfig(bits=bits, group_size=128, k_mode="channel", v_mode=v_mode, page_size=128)
    view = logical_view(quantize(inp.k, inp.v, [kv_len], cfg), 0)
    if view.k_tail.shape[0]:
        raise ValueError(f"kv_len={kv_len} leaves a BF16 tail; take a multiple of the group size (128).")
    k = _dequant(view.k_codes[:, 0], view.k_params[:, 0], cfg.k_mode, cfg.group_size)
    scores = inp.q[0].double().numpy() @ k.T / math.sqrt(dim)
    if data == "peaked":
        rng = np.random.default_rng(seed + 1)
        chosen = np.concatenate([[0], 1 + rng.choice(kv_len - 1, size=peaks - 1, replace=False)])
        rest = np.delete(scores, chosen, axis=1).max(axis=1, keepdims=True)
        scores[:, chosen] = rest + rng.uniform(8.0, 12.0, size=(heads, peaks))
    codes = view.v_codes[:, 0].numpy().astype(np.float64)
    scale, offset = _params(view.v_params[:, 0], v_mode, cfg.group_size, kv_len, dim)
    return scores, codes, scale, offset


def pv_operand_output(scores: np.ndarray, codes: np.ndarray, scale: np.ndarray, offset: np.ndarray, v_mode: str,
                      bits: int, form: str, *, group: int = 128, factor: int | None = None) -> PVOperandResult:
    """O = softmax(scores) V of one KV head with P~ in the operand `form` (PV_OPERAND_FORMS).

    scores [heads, n] (natural-log units; n a multiple of 16, and of `group` for channel-wise V),
    codes, scale and offset [n, d] as pv_inputs returns them (token-wise V: one scale per token,
    group = d). `factor`: the radix factor the accumulator bookkeeping (max_acc) reads every code
    at, default the top one (U8_TOP_FACTOR)."""
    if form not in PV_OPERAND_FORMS:
        raise ValueError(f"form={form!r} is not a PV operand form; expected one of {PV_OPERAND_FORMS}.")
    heads, n = scores.shape
    dim = codes.shape[1]
    if n % TILE or (v_mode == "channel" and n % group):
        raise ValueError(f"n={n} tokens: expected a multiple of {TILE} (and of {group} for channel-wise V)")
    if v_mode == "token" and group != dim:
        raise ValueError("the model folds token-wise V at group == head_dim only")
    steps = n // TILE
    # The online softmax: m per step (the running maximum through the step), p against it.
    m = np.maximum.accumulate(scores.reshape(heads, steps, TILE).max(axis=2), axis=1)  # [h, steps]
    p = np.exp(scores - np.repeat(m, TILE, axis=1))  # [h, n], <= 1
    s_tok = scale[:, 0]
    a = p * s_tok[None, :] if v_mode == "token" else p  # what the operand holds
    runs = overflows = longest = 0
    max_acc = 0.0
    if form == "fp16":
        w = _fp16(a)
    elif form == "e4m3":
        w = e4m3(a)
    else:
        peak = a.reshape(heads, steps, TILE).max(axis=2)  # [h, steps]
        top = U16_MAX if form.startswith("u16") else U8_MAX
        if form in ("u8-chunk", "u16-chunk"):
            e_step = u8_exponent(peak, top)
            starts = [np.arange(steps)] * heads
        else:
            e_step, starts, overflows = _u8_runs(peak, m, v_mode, group, top)
        scaled = np.ldexp(1.0, np.repeat(e_step, TILE, axis=1).astype(np.int64))
        p_int = np.rint(a * scaled)  # P~, integers in [0, top]
        assert p_int.max() <= top
        w = p_int / scaled
        f = U8_TOP_FACTOR[bits] if factor is None else factor
        # The int32 accumulators, exact: sum over a run of P~ f c, through each step's sum; the
        # u16 forms sum each u8 part, hi = floor(P~ / 256) and lo = P~ - 256 hi, on its own.
        parts = [np.floor(p_int / 256), np.mod(p_int, 256)] if top == U16_MAX else [p_int]
        for part in parts:
            step_acc = np.einsum("hst,std->hsd", part.reshape(heads, steps, TILE), codes.reshape(steps, TILE, dim))
            for h in range(heads):
                acc = np.add.reduceat(step_acc[h], starts[h], axis=0)  # [runs, d]
                max_acc = max(max_acc, float(f * acc.max()))
        for h in range(heads):
            runs += len(starts[h])
            longest = max(longest, TILE * int(np.diff(np.append(starts[h], steps)).max()))
    # Back to the final maximum (exact here, fp32 in the kernels) and through the fold.
    w = w * np.exp(np.repeat(m - m[:, -1:], TILE, axis=1))
    if v_mode == "token":  # w ~ p s: o = w . c + w . z / s
        o = w @ codes + (w @ (offset[:, 0] / s_tok))[:, None]
    else:  # w ~ p: o_d = sum over groups s_d (w . c) + z_d sum w
        g = n // group
        acc = np.einsum("hgt,gtd->hgd", w.reshape(heads, g, group), codes.reshape(g, group, dim))
        s_g, z_g = scale[::group], offset[::group]  # [g, d]
        o = np.einsum("gd,hgd->hd", s_g, acc) + w.reshape(heads, g, group).sum(axis=2) @ z_g
    p_final = np.exp(scores - m[:, -1:])
    l = p_final.sum(axis=1, keepdims=True)
    ref = p_final @ (codes * scale + offset) / l
    return PVOperandResult(form, o / l, ref, runs=runs, overflows=overflows, longest_run=longest, max_acc=max_acc)


def _u8_runs(peak: np.ndarray, m: np.ndarray, v_mode: str, group: int,
             top: int = U8_MAX) -> tuple[np.ndarray, list[np.ndarray], int]:
    """u8-run's (top 255) or u16-run's (top 65535) plan per query column: (E per step [h, steps],
    first step of each run, overflows). peak [h, steps] is each step's largest operand value
    against the running maximum m."""
    heads, steps = peak.shape
    e_step = np.zeros_like(peak)
    starts, overflows = [], 0
    for h in range(heads):
        forced = np.zeros(steps, dtype=bool)
        forced[0] = True
        forced[1:] |= m[h, 1:] > m[h, :-1]  # a rescale
        if v_mode == "channel":
            forced[:: group // TILE] = True  # a new group's scales
        nxt = np.flatnonzero(forced)
        next_forced = np.append(nxt, steps)[np.searchsorted(nxt, np.arange(steps), side="right")]
        first, i = [], 0
        while i < steps:
            e = u8_exponent(peak[h, i], top)
            end = next_forced[i]
            over = np.flatnonzero(np.ldexp(peak[h, i + 1 : end], int(e)) > top)
            j = i + 1 + over[0] if over.size else end
            overflows += bool(over.size)
            e_step[h, i:j] = e
            first.append(i)
            i = j
        starts.append(np.array(first))
    return e_step, starts, overflows


def pv_operand_errors(kv_len: int, bits: int, v_mode: str, data: str = "gauss", *, seed: int = 0,
                      forms: Sequence[str] = PV_OPERAND_FORMS) -> dict[str, PVOperandResult]:
    """Every form on one case of pv_inputs: {form: PVOperandResult}."""
    scores, codes, scale, offset = pv_inputs(kv_len, bits, v_mode, data, seed=seed)
    return {f: pv_operand_output(scores, codes, scale, offset, v_mode, bits, f) for f in forms}
