"""The quantized paged KV cache (docs/FORMAT.md): quantize BF16 K/V, dequantize, append one token.

Only foscar/packing.py knows the bit layout; this module knows pages, parameters and tails.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Sequence

import torch

from foscar import packing
from foscar.config import QuantConfig

# K (or V) elements handled per step: bounds the temporaries of quantize/dequantize to a few
# hundred MB whatever the cache size (about 15 bytes per element at the peak).
CHUNK_ELEMENTS = 1 << 25
FP16_MAX = 65504.0


class OutOfPagesError(RuntimeError):
    """append needed a fresh page and the free list was empty."""


@dataclass
class QuantizedKVCache:
    """A paged, group-quantized KV cache of one layer, for a batch of sequences.

    Shapes (docs/FORMAT.md): codes [num_pages, num_kv_heads, page_size // 16, words_per_tile]
    int32; params [num_pages, num_kv_heads, page_size * head_dim // group_size, 2] (scale,
    offset) in the param dtype; page_table [batch, max_pages_per_seq] int32 (entries past a
    sequence's pages hold 0); seq_lens [batch] int32 (tail included); tail_lens [batch] int32;
    tails [batch, num_kv_heads, group_size, head_dim] bf16 (allocated even without a tail).
    """

    config: QuantConfig
    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_params: torch.Tensor
    v_params: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    tail_lens: torch.Tensor
    k_tail: torch.Tensor
    v_tail: torch.Tensor
    num_kv_heads: int
    head_dim: int
    free_pages: list[int] = field(default_factory=list)  # physical pages append may take, in order

    @property
    def batch(self) -> int:
        return self.page_table.shape[0]

    @property
    def num_pages(self) -> int:
        return self.k_codes.shape[0]

    @property
    def max_pages_per_seq(self) -> int:
        return self.page_table.shape[1]

    @property
    def packed_lens(self) -> torch.Tensor:
        """Tokens held in pages, per sequence (int32 [batch]): seq_lens - tail_lens."""
        return self.seq_lens - self.tail_lens

    @property
    def device(self) -> torch.device:
        return self.k_codes.device

    def nbytes(self, allocated: bool = False) -> dict[str, int]:
        """Bytes by part: codes, params, tails, page_table, seq_lens and total.

        By default the bytes one decode step must read: codes and parameters of the packed
        tokens, the used tail rows, the used page-table entries, seq_lens. With
        allocated=True, the storage of every tensor instead (spare pages included).
        """
        if allocated:
            parts = {
                "codes": self.k_codes.nbytes + self.v_codes.nbytes,
                "params": self.k_params.nbytes + self.v_params.nbytes,
                "tails": self.k_tail.nbytes + self.v_tail.nbytes,
                "page_table": self.page_table.nbytes,
                "seq_lens": self.seq_lens.nbytes + self.tail_lens.nbytes,
            }
        else:
            cfg, heads, dim = self.config, self.num_kv_heads, self.head_dim
            packed = [int(n) for n in self.packed_lens.tolist()]
            tokens, tail_tokens = sum(packed), int(self.tail_lens.sum())
            param_bytes = self.k_params.element_size()
            # Both modes hold head_dim / group_size (scale, offset) pairs per token and head.
            parts = {
                "codes": 2 * tokens * heads * dim * cfg.bits // 8,
                "params": 2 * tokens * heads * dim // cfg.group_size * 2 * param_bytes,
                "tails": 2 * tail_tokens * heads * dim * 2,
                "page_table": 4 * sum(math.ceil(n / cfg.page_size) for n in packed),
                "seq_lens": 4 * self.batch,
            }
        parts["total"] = sum(parts.values())
        return parts


@dataclass
class LogicalSequence:
    """One sequence of a cache, unpacked: codes and parameters in logical (token, channel) order.

    codes [packed_len, num_kv_heads, head_dim] uint8; params (scale, offset) in the param
    dtype, token-wise [packed_len, num_kv_heads, head_dim // G, 2] or channel-wise
    [packed_len // G, num_kv_heads, head_dim, 2]; tails [tail_len, num_kv_heads, head_dim] bf16.
    """

    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_params: torch.Tensor
    v_params: torch.Tensor
    k_tail: torch.Tensor
    v_tail: torch.Tensor


# ----------------------------------------------------------------------------- quantize


def quantize(
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    config: QuantConfig,
    *,
    extra_pages: int = 0,
    shuffle_pages: bool = False,
    seed: int = 0,
) -> QuantizedKVCache:
    """Quantize padded BF16 K/V [batch, max_kv_len, num_kv_heads, head_dim] into a paged cache.

    Rows past each sequence's length are ignored. `extra_pages` spare pages wait in the free
    list for append; `shuffle_pages` permutes the physical page order (seeded).
    """
    lens = _check_quantize_inputs(k, v, seq_lens, config, extra_pages)
    batch, _, heads, dim = k.shape
    tails = [config.tail_len(n) for n in lens]
    packed = [n - t for n, t in zip(lens, tails)]
    cache = _allocate(config, batch, heads, dim, packed, extra_pages, shuffle_pages, seed, k.device)
    cache.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    cache.tail_lens.copy_(torch.tensor(tails, dtype=torch.int32))
    _fill_pages(cache, k, v, packed)
    if config.has_tail:
        _fill_tails(cache, k, v)
    return cache


def _allocate(config, batch, heads, dim, packed, extra_pages, shuffle, seed, device):
    """Empty cache with max(1, ceil(L_packed / page_size)) pages per sequence plus the spares."""
    page = config.page_size
    pages_per_seq = [max(1, math.ceil(n / page)) for n in packed]
    num_pages = sum(pages_per_seq) + extra_pages
    if shuffle:
        order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    else:
        order = torch.arange(num_pages)
    table = torch.zeros(batch, max(pages_per_seq), dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per_seq):  # one row per sequence, not per token
        table[b, :n] = order[used : used + n]
        used += n
    words = config.words_per_tile(dim)
    params = page * dim // config.group_size
    pdt = config.torch_param_dtype

    def zeros(*shape, dtype):
        return torch.zeros(*shape, dtype=dtype, device=device)

    def unwritten_params(*shape):  # (scale 1, offset 0): no scale is 0 (docs/FORMAT.md)
        params = zeros(*shape, 2, dtype=pdt)
        params[..., 0] = 1
        return params

    return QuantizedKVCache(
        config=config,
        k_codes=zeros(num_pages, heads, page // 16, words, dtype=torch.int32),
        v_codes=zeros(num_pages, heads, page // 16, words, dtype=torch.int32),
        k_params=unwritten_params(num_pages, heads, params),
        v_params=unwritten_params(num_pages, heads, params),
        page_table=table.to(device),
        seq_lens=zeros(batch, dtype=torch.int32),
        tail_lens=zeros(batch, dtype=torch.int32),
        k_tail=zeros(batch, heads, config.group_size, dim, dtype=torch.bfloat16),
        v_tail=zeros(batch, heads, config.group_size, dim, dtype=torch.bfloat16),
        num_kv_heads=heads,
        head_dim=dim,
        free_pages=order[used:].tolist(),
    )


def _fill_pages(cache: QuantizedKVCache, k: torch.Tensor, v: torch.Tensor, packed: list[int]) -> None:
    """Quantize every page holding packed tokens, a bounded number of pages at a time."""
    page, device = cache.config.page_size, k.device
    data_pages = torch.tensor([math.ceil(n / page) for n in packed])
    seq = torch.repeat_interleave(torch.arange(len(packed)), data_pages)
    first = torch.cumsum(data_pages, 0) - data_pages
    logical = torch.arange(len(seq)) - first[seq]
    physical = cache.page_table.cpu()[seq, logical].long()
    packed_dev = torch.tensor(packed, device=device)
    step = max(1, CHUNK_ELEMENTS // (page * cache.num_kv_heads * cache.head_dim))
    rows = torch.arange(page, device=device)
    for start in range(0, len(seq), step):
        b = seq[start : start + step].to(device)
        tok = logical[start : start + step].to(device)[:, None] * page + rows
        valid = tok < packed_dev[b][:, None]
        tok = tok.clamp(max=k.shape[1] - 1)
        phys = physical[start : start + step].to(device)
        slot = torch.zeros_like(phys)
        for kind, src in (("k", k), ("v", v)):  # one at a time: half the temporaries
            x = src[b[:, None], tok].float()
            # Zeroed padding rows quantize to code 0 with (scale, offset) = (1, 0), as FORMAT.md asks
            # (a constant group stores scale 1: no scale is 0).
            x.masked_fill_(~valid[:, :, None, None], 0.0)
            _store(cache, kind, phys, slot, x)


def _fill_tails(cache: QuantizedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
    group, device = cache.config.group_size, k.device
    rows = torch.arange(group, device=device)
    tok = cache.packed_lens.long()[:, None] + rows
    valid = rows < cache.tail_lens[:, None]
    tok = tok.clamp(max=k.shape[1] - 1)
    seq = torch.arange(cache.batch, device=device)[:, None]
    for src, tail in ((k, cache.k_tail), (v, cache.v_tail)):
        x = src[seq, tok].masked_fill(~valid[:, :, None, None], 0)
        tail.copy_(x.permute(0, 2, 1, 3))


# ----------------------------------------------------------------------------- one block


def _quantize_block(x: torch.Tensor, mode: str, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """x float32 [n, T, H, D] -> codes uint8 [n, T, H, D], params [n, H, T*D/G, 2] in page order."""
    n, tokens, heads, dim = x.shape
    group = config.group_size
    if mode == "token":
        grouped = x.view(n, tokens, heads, dim // group, group)
        reduce_dim = -1
    else:
        grouped = x.view(n, tokens // group, group, heads, dim)
        reduce_dim = 2
    lo, hi = grouped.amin(reduce_dim), grouped.amax(reduce_dim)
    scale, offset = _scale_offset(lo, hi, config)
    codes = _codes(grouped, scale.unsqueeze(reduce_dim), offset.unsqueeze(reduce_dim), config.bits)
    # token-wise: index token * (D/G) + channel // G; channel-wise: (token // G) * D + channel.
    params = torch.stack([scale, offset], dim=-1).permute(0, 2, 1, 3, 4)
    return codes.view(n, tokens, heads, dim), params.reshape(n, heads, -1, 2)


def _scale_offset(lo: torch.Tensor, hi: torch.Tensor, config: QuantConfig):
    """Min/max parameters, rounded to the param dtype before any code is computed. A constant
    group (a scale that rounds to 0) stores the scale 1: its codes come out 0 and it stands for
    z, and the kernels divide by every scale as it is (docs/FORMAT.md)."""
    levels = (1 << config.bits) - 1
    pdt = config.torch_param_dtype
    scale = ((hi.double() - lo.double()) / levels).to(pdt)
    return scale.masked_fill_(scale == 0, 1.0), lo.to(pdt)


def _codes(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int) -> torch.Tensor:
    """clamp(round((x - z) / s)) with the stored s and z (a constant group's s is 1 and its values
    are within fp16's smallest step of z, so its codes are 0)."""
    codes = (x - offset.float()).div_(scale.float()).round_().clamp_(0, (1 << bits) - 1)
    return codes.to(torch.uint8)


def _store(cache: QuantizedKVCache, kind: str, phys: torch.Tensor, slot: torch.Tensor, x: torch.Tensor) -> None:
    """Quantize x [n, T, H, D] (float32) into tokens slot .. slot+T-1 of pages phys [n].

    With B = packing.block_tokens(kind): T a multiple of B at B-aligned slots (whole blocks,
    written straight), or T inside one block (that block is unpacked, patched and packed again).
    """
    cfg, dim = cache.config, cache.head_dim
    mode = cfg.k_mode if kind == "k" else cfg.v_mode
    codes, params = _quantize_block(x, mode, cfg)
    n, tokens, heads, _ = codes.shape
    blk = packing.block_tokens(kind)
    words = _blocks_view(cache, kind)  # [pages, heads, page / blk, words_per_block]
    n_blocks = max(1, tokens // blk)
    blocks = (slot // blk)[:, None] + torch.arange(n_blocks, device=slot.device)
    if tokens % blk == 0 and bool((slot % blk == 0).all()):
        block = codes.view(n, n_blocks, blk, heads, dim).permute(0, 1, 3, 2, 4)
    else:
        block = packing.unpack_tiles(words[phys[:, None], :, blocks].reshape(-1, words.shape[-1]), cfg.bits, kind, dim)
        block = block.view(n, heads, blk, dim)
        rows = (slot % blk)[:, None] + torch.arange(tokens, device=slot.device)
        block[torch.arange(n, device=slot.device)[:, None], :, rows] = codes
        block = block.unsqueeze(1)
    packed = packing.pack_tiles(block.reshape(-1, blk, dim), cfg.bits, kind)
    words[phys[:, None], :, blocks] = packed.view(n, n_blocks, heads, -1)
    first = slot * dim // cfg.group_size  # both modes: D / G parameter pairs per token
    index = first[:, None] + torch.arange(params.shape[2], device=slot.device)
    getattr(cache, f"{kind}_params")[phys[:, None], :, index] = params.permute(0, 2, 1, 3)


def _blocks_view(cache: QuantizedKVCache, kind: str) -> torch.Tensor:
    """A kind's code tensor seen as [pages, heads, page / block, words_per_block] (same memory:
    a block is consecutive 16-token storage rows)."""
    words = getattr(cache, f"{kind}_codes")
    pages, heads = words.shape[:2]
    blk = packing.block_tokens(kind)
    return words.view(pages, heads, cache.config.page_size // blk, -1)


# ----------------------------------------------------------------------------- read back


def logical_view(cache: QuantizedKVCache, b: int) -> LogicalSequence:
    """Codes, parameters and tails of sequence b in logical order (for tests and references)."""
    if not 0 <= b < cache.batch:
        raise ValueError(f"sequence index b={b} is out of range; expected 0 <= b < batch={cache.batch}.")
    packed, tail = int(cache.packed_lens[b]), int(cache.tail_lens[b])
    index = torch.tensor([b], device=cache.device)
    k_codes, v_codes = gather_codes(cache, index)
    k_params, v_params = gather_params(cache, index)
    group = cache.config.group_size

    def params_of(p, mode):
        return p[0, : packed if mode == "token" else packed // group]

    return LogicalSequence(
        k_codes=k_codes[0, :packed],
        v_codes=v_codes[0, :packed],
        k_params=params_of(k_params, cache.config.k_mode),
        v_params=params_of(v_params, cache.config.v_mode),
        k_tail=cache.k_tail[b, :, :tail].transpose(0, 1),
        v_tail=cache.v_tail[b, :, :tail].transpose(0, 1),
    )


def dequantize(
    cache: QuantizedKVCache,
    batch_indices: Sequence[int] | torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [n, max_len, num_kv_heads, head_dim] as s*c + z, tails included, zeros past each length."""
    if batch_indices is None:
        index = list(range(cache.batch))
    else:
        index = [int(b) for b in (batch_indices.tolist() if torch.is_tensor(batch_indices) else batch_indices)]
        bad = [b for b in index if not 0 <= b < cache.batch]
        if bad:
            raise ValueError(f"batch_indices {bad} are out of range; expected 0 <= b < batch={cache.batch}.")
    lens = cache.seq_lens.cpu()[index]
    max_len = int(lens.max()) if index else 0
    shape = (len(index), max_len, cache.num_kv_heads, cache.head_dim)
    out_k = torch.zeros(shape, dtype=dtype, device=cache.device)
    out_v = torch.zeros(shape, dtype=dtype, device=cache.device)
    tokens = cache.max_pages_per_seq * cache.config.page_size
    step = max(1, CHUNK_ELEMENTS // (tokens * cache.num_kv_heads * cache.head_dim))
    for start in range(0, len(index), step):
        chunk = torch.tensor(index[start : start + step], device=cache.device)
        _dequantize_chunk(cache, chunk, out_k[start : start + step], out_v[start : start + step], dtype)
    return out_k, out_v


def _dequantize_chunk(cache, seqs, out_k, out_v, dtype) -> None:
    cfg = cache.config
    k_codes, v_codes = gather_codes(cache, seqs)
    k_params, v_params = gather_params(cache, seqs)
    span = min(k_codes.shape[1], out_k.shape[1])
    packed = cache.packed_lens[seqs].long()
    valid = torch.arange(span, device=seqs.device) < packed[:, None]
    group = cfg.group_size
    rows = torch.arange(group, device=seqs.device)
    tail_tok = packed[:, None] + rows
    tail_valid = rows < cache.tail_lens[seqs][:, None]
    tail_seq = torch.arange(len(seqs), device=seqs.device)[:, None].expand_as(tail_tok)
    # Tokens in slices of whole groups, so that the fp32 temporaries (codes, the scale and offset
    # repeated to every element, their product) stay near CHUNK_ELEMENTS however long a sequence
    # is: one 128K-token sequence of 8 heads took about 4 GB at once (the harness's check).
    piece = max(group, CHUNK_ELEMENTS // max(1, len(seqs) * cache.num_kv_heads * cache.head_dim) // group * group)
    for codes, params, mode, tail, out in (
        (k_codes, k_params, cfg.k_mode, cache.k_tail, out_k),
        (v_codes, v_params, cfg.v_mode, cache.v_tail, out_v),
    ):
        for t0 in range(0, span, piece):
            t1 = min(t0 + piece, codes.shape[1])  # whole groups: the codes hold whole pages
            # token-wise params are per token; channel-wise per group of tokens
            p = params[:, t0:t1] if mode == "token" else params[:, t0 // group : t1 // group]
            x = _dequantize_codes(codes[:, t0:t1], p, mode, group, dtype)
            end = min(t1, span)
            # Padding entries of the page table point at page 0, which belongs to someone else.
            out[:, t0:end] = x[:, : end - t0].masked_fill(~valid[:, t0:end, None, None], 0)
        rows_tail = tail[seqs].permute(0, 2, 1, 3)
        out[tail_seq[tail_valid], tail_tok[tail_valid]] = rows_tail[tail_valid].to(dtype)


def _dequantize_codes(codes, params, mode, group, dtype) -> torch.Tensor:
    """codes [n, T, H, D] and logical params -> s*c + z in dtype."""
    # Computed in at least fp32 and rounded once, so a bf16 result is round(s*c + z) rather
    # than the sum of already-rounded terms.
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    scale, offset = params[..., 0].to(work), params[..., 1].to(work)
    dim_of_group = -1 if mode == "token" else 1
    scale = scale.repeat_interleave(group, dim=dim_of_group)
    offset = offset.repeat_interleave(group, dim=dim_of_group)
    return (codes.to(work) * scale + offset).to(dtype)


def gather_codes(cache: QuantizedKVCache, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpacked K and V codes of whole page-table rows: uint8 [n, max_pages_per_seq * page_size, H, D].

    Tokens past each packed length are garbage (padding entries point at page 0): mask them.
    """
    cfg, heads, dim = cache.config, cache.num_kv_heads, cache.head_dim
    page = cfg.page_size
    phys = cache.page_table[seqs].long()
    n, pages = phys.shape
    out = []
    for kind in ("k", "v"):
        blk = packing.block_tokens(kind)
        words = _blocks_view(cache, kind)[phys]
        codes = packing.unpack_tiles(words.reshape(-1, words.shape[-1]), cfg.bits, kind, dim)
        codes = codes.view(n, pages, heads, page // blk, blk, dim).permute(0, 1, 3, 4, 2, 5)
        out.append(codes.reshape(n, pages * page, heads, dim))
    return out[0], out[1]


def gather_params(cache: QuantizedKVCache, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V (scale, offset) of whole page-table rows, in logical indexing.

    Token-wise [n, T, H, D / G, 2], channel-wise [n, T / G, H, D, 2], T = max_pages_per_seq *
    page_size; entries past each packed length are garbage, as in gather_codes.
    """
    cfg, heads, dim = cache.config, cache.num_kv_heads, cache.head_dim
    page, group = cfg.page_size, cfg.group_size
    phys = cache.page_table[seqs].long()
    n, pages = phys.shape
    out = []
    for mode, params in ((cfg.k_mode, cache.k_params), (cfg.v_mode, cache.v_params)):
        p = params[phys]
        if mode == "token":
            p = p.view(n, pages, heads, page, dim // group, 2).permute(0, 1, 3, 2, 4, 5)
            out.append(p.reshape(n, pages * page, heads, dim // group, 2))
        else:
            p = p.view(n, pages, heads, page // group, dim, 2).permute(0, 1, 3, 2, 4, 5)
            out.append(p.reshape(n, pages * page // group, heads, dim, 2))
    return out[0], out[1]


# ----------------------------------------------------------------------------- append


def append(cache: QuantizedKVCache, k_new: torch.Tensor, v_new: torch.Tensor) -> QuantizedKVCache:
    """Add one decode token per sequence (BF16 [batch, num_kv_heads, head_dim]), in place.

    Token-wise-only caches quantize it straight into its page. Caches with a tail put it in
    the tail; a tail that reaches group_size tokens is quantized into pages and cleared.
    Raises OutOfPagesError (and changes nothing) when a page is needed and none is free.
    """
    _check_append_inputs(cache, k_new, v_new)
    cfg = cache.config
    lens = [int(n) for n in cache.seq_lens.tolist()]
    tails = [int(n) for n in cache.tail_lens.tolist()]
    packed = [n - t for n, t in zip(lens, tails)]
    if cfg.has_tail:
        writers = [b for b, t in enumerate(tails) if t + 1 == cfg.group_size]
    else:
        writers = list(range(cache.batch))
    _take_pages(cache, writers, packed)
    device = cache.device
    if cfg.has_tail:
        seq = torch.arange(cache.batch, device=device)
        cache.k_tail[seq, :, cache.tail_lens.long()] = k_new
        cache.v_tail[seq, :, cache.tail_lens.long()] = v_new
        cache.tail_lens += 1
        cache.seq_lens += 1
        if writers:
            _flush_tails(cache, writers, packed)
    else:
        seq = torch.arange(cache.batch, device=device)
        slot = cache.seq_lens.long() % cfg.page_size
        phys = cache.page_table[seq, cache.seq_lens.long() // cfg.page_size].long()
        _store(cache, "k", phys, slot, k_new[:, None].float())
        _store(cache, "v", phys, slot, v_new[:, None].float())
        cache.seq_lens += 1
    from foscar.kernels import forget_plans  # here: foscar.kernels imports this module

    forget_plans(cache)  # the next decode plans the grown lengths
    return cache


def _take_pages(cache: QuantizedKVCache, writers: list[int], packed: list[int]) -> None:
    """Give each writer that starts a new page one from the free list (all or nothing)."""
    page = cache.config.page_size
    needy = [b for b in writers if packed[b] // page >= max(1, math.ceil(packed[b] / page))]
    if len(needy) > len(cache.free_pages):
        raise OutOfPagesError(
            f"append needs {len(needy)} fresh page{'s' if len(needy) > 1 else ''} but "
            f"{len(cache.free_pages)} {'is' if len(cache.free_pages) == 1 else 'are'} free; "
            "quantize with more extra_pages, about batch * (tokens_to_append // page_size + 1)."
        )
    if not needy:
        return
    need_cols = max(packed[b] // page for b in needy) + 1
    if need_cols > cache.max_pages_per_seq:
        grow = torch.zeros(cache.batch, need_cols - cache.max_pages_per_seq, dtype=torch.int32, device=cache.device)
        cache.page_table = torch.cat([cache.page_table, grow], dim=1)
    fresh = cache.free_pages[: len(needy)]
    del cache.free_pages[: len(needy)]
    device = cache.device
    rows = torch.tensor(needy, device=device)
    cols = torch.tensor([packed[b] // page for b in needy], device=device)
    cache.page_table[rows, cols] = torch.tensor(fresh, dtype=torch.int32, device=device)


def _flush_tails(cache: QuantizedKVCache, writers: list[int], packed: list[int]) -> None:
    """Quantize the full tails of `writers` into their pages and clear those tails."""
    page, device = cache.config.page_size, cache.device
    seq = torch.tensor(writers, device=device)
    start = torch.tensor([packed[b] for b in writers], device=device)
    phys = cache.page_table[seq, start // page].long()
    for kind, tail in (("k", cache.k_tail), ("v", cache.v_tail)):
        _store(cache, kind, phys, start % page, tail[seq].permute(0, 2, 1, 3).float())
        tail[seq] = 0
    cache.tail_lens[seq] = 0


# ----------------------------------------------------------------------------- validation


def _check_quantize_inputs(k, v, seq_lens, config, extra_pages) -> list[int]:
    """Every check of quantize, before anything is allocated; returns the lengths as ints."""
    if not isinstance(config, QuantConfig):
        raise ValueError(f"config is a {type(config).__name__}; expected a foscar.config.QuantConfig.")
    for name, x in (("k", k), ("v", v)):
        _check_tensor(name, x, (None, None, None, None), "[batch, max_kv_len, num_kv_heads, head_dim]")
    if v.shape != k.shape:
        raise ValueError(
            f"v has shape {tuple(v.shape)} but k has shape {tuple(k.shape)}; expected the same "
            "shape: pad both to [batch, max_kv_len, num_kv_heads, head_dim]."
        )
    if v.device != k.device:
        raise ValueError(f"k is on {k.device} but v is on {v.device}; expected one device: move both with .to(device).")
    batch, max_kv_len, _, head_dim = k.shape
    config.check_head_dim(head_dim)
    if isinstance(extra_pages, bool) or not isinstance(extra_pages, int) or extra_pages < 0:
        raise ValueError(f"extra_pages={extra_pages!r} is not a page count; expected an int >= 0.")
    lens = _check_seq_lens(seq_lens, batch, max_kv_len)
    for name, x in (("K", k), ("V", v)):
        _check_values(name, x, lens, config)
    return lens


def _check_seq_lens(seq_lens, batch: int, max_kv_len: int) -> list[int]:
    if torch.is_tensor(seq_lens):
        if seq_lens.dim() != 1 or seq_lens.dtype.is_floating_point or seq_lens.dtype == torch.bool:
            raise ValueError(
                f"seq_lens is a {seq_lens.dtype} tensor of shape {tuple(seq_lens.shape)}; expected "
                "integers of shape [batch]: pass a list of ints or an int32/int64 tensor."
            )
        lens = [int(n) for n in seq_lens.tolist()]
    else:
        lens = list(seq_lens)
        for i, n in enumerate(lens):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral):
                raise ValueError(f"seq_lens[{i}]={n!r} is not an int; expected token counts: pass ints.")
        lens = [int(n) for n in lens]  # numpy and torch integers become plain ints
    if len(lens) != batch:
        raise ValueError(
            f"seq_lens has {len(lens)} entries but k and v hold batch={batch} sequences; expected one "
            "length per sequence."
        )
    for i, n in enumerate(lens):
        if n <= 0:
            raise ValueError(
                f"seq_lens[{i}]={n} is an empty sequence; expected lengths from 1 to max_kv_len="
                f"{max_kv_len}: drop empty sequences from the batch."
            )
        if n > max_kv_len:
            raise ValueError(
                f"seq_lens[{i}]={n} exceeds max_kv_len={max_kv_len} (k.shape[1]); expected at most "
                f"{max_kv_len}: pad K and V to the longest sequence."
            )
    return lens


def _check_tensor(name: str, x, shape: tuple, pattern: str) -> None:
    """dtype bf16, rank and (where given) sizes of shape; every size at least 1."""
    if not torch.is_tensor(x):
        raise ValueError(f"{name} is a {type(x).__name__}; expected a torch.Tensor of shape {pattern}.")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"{name} has dtype {x.dtype}; expected torch.bfloat16: convert with {name}.to(torch.bfloat16).")
    if x.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, x.shape)) or 0 in x.shape:
        wanted = tuple(s if s is not None else "?" for s in shape)
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {pattern} = {wanted}, no size 0.")


def _check_values(name: str, x: torch.Tensor, lens: list[int], config: QuantConfig) -> None:
    """No NaN/Inf in the rows that count; within fp16 range when the parameters are fp16."""
    limit = FP16_MAX if config.param_dtype == "fp16" else math.inf
    step = max(1, CHUNK_ELEMENTS // (x.shape[2] * x.shape[3]))
    for b, n in enumerate(lens):
        for t0 in range(0, n, step):
            peak = float(x[b, t0 : min(n, t0 + step)].abs().amax())  # NaN propagates through amax
            if math.isfinite(peak) and peak <= limit:
                continue
            rows = x[b, t0 : min(n, t0 + step)].float().abs().flatten(1).amax(1)
            bad = ~torch.isfinite(rows) if not math.isfinite(peak) else rows > limit
            t = t0 + int(torch.nonzero(bad)[0])
            where = f"sequence {b}" if x.shape[1] == 1 else f"sequence {b}, token {t}"
            if not math.isfinite(peak):
                raise ValueError(
                    f"{name} holds NaN or Inf at {where}; expected finite values: "
                    "clean or mask the input before quantizing."
                )
            raise ValueError(
                f"{name} holds a value of magnitude {peak:.4g} at {where}, beyond the "
                f"fp16 range of scale and offset ({FP16_MAX:g}); use QuantConfig(param_dtype='fp32')."
            )


def _check_append_inputs(cache: QuantizedKVCache, k_new, v_new) -> None:
    shape = (cache.batch, cache.num_kv_heads, cache.head_dim)
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        _check_tensor(name, x, shape, "[batch, num_kv_heads, head_dim]")
        if x.device != cache.device:
            raise ValueError(
                f"{name} is on {x.device} but the cache is on {cache.device}; expected one device: "
                f"move it with {name}.to(cache.device)."
            )
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        _check_values(name, x.unsqueeze(1), [1] * cache.batch, cache.config)
