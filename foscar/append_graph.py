"""Append one decode token per sequence to quantized caches in device work only, so a decode
step that appends can be captured in a CUDA graph (foscar.append, the reference, loops on the host).

The bit layout comes only from foscar/packing.py's public functions (block_tokens,
tile_positions); the quantizer is foscar.cache's own, so a group closed here holds the same
codes and parameters as `foscar.quantize` of the longer sequence.

A `GraphAppender` serves the caches of every layer of one batch: they share one page table,
one seq_lens and one tail_lens (all layers grow in step). Per decode step:

    flush = appender.flush_due()            # host: does this step complete a group?
    appender.begin_step(flush)              # device: lengths + 1, the page a flush fills
    for layer ...: appender.append(layer, k, v, flush)   # device: this layer's K/V token
    appender.stepped()                      # host: the step ran

With a channel-wise K or V (a BF16 tail), a step whose new token completes a group of G
tokens must quantize that group into its page: that is the `flush` variant, chosen on the
host (capture one graph of each kind and replay the one `flush_due` names). The flush is
masked per sequence: sequences whose group is not complete write to a scratch page, so the
flush variant is correct at any step and any mix of lengths, and costs the same at every
step. Token-wise-only caches have no tail: every step quantizes its token into its page.
"""
from __future__ import annotations

from typing import Sequence

import torch

from foscar import packing
from foscar.cache import QuantizedKVCache, _quantize_block
from foscar.config import QuantConfig


def _cols(tokens: torch.Tensor, page: int) -> torch.Tensor:
    """Page-table entries a sequence owns for `tokens` packed tokens: max(1, ceil(n / page))."""
    return torch.clamp((tokens + page - 1) // page, min=1)


def _packed(lens: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    return lens - config.tail_len(lens)


def _page_schedule(config: QuantConfig, lens: torch.Tensor, max_len: int):
    """(b, col) of every page the sequences will need up to max_len, in the order foscar.append
    takes them from the free list (by the step that first writes the page, then by sequence)."""
    page, group = config.page_size, config.group_size
    steps = max_len - int(lens.max())
    have = _cols(_packed(lens, config), page)
    need = _cols(_packed(lens + steps, config), page)
    count = need - have  # pages sequence b will take
    seq = torch.repeat_interleave(torch.arange(len(lens)), count)
    rank = torch.arange(len(seq)) - torch.repeat_interleave(torch.cumsum(count, 0) - count, count)
    col = torch.repeat_interleave(have, count) + rank
    # The step that writes the first token of page `col`: a flush of the group starting there
    # (tail caches), or the token itself (token-wise caches).
    written_at = col * page + (group if config.has_tail else 1) - lens[seq]
    order = torch.argsort(written_at * len(lens) + seq, stable=True)
    return seq[order], col[order], int(need.max())


def pages_to_reserve(config: QuantConfig, seq_lens: Sequence[int] | torch.Tensor, max_len: int) -> int:
    """Spare pages a GraphAppender needs to grow sequences of these lengths to max_len (pass
    them to foscar.quantize as extra_pages): the pages the growth fills, plus one scratch page
    for the masked flush when the cache has a tail."""
    lens = torch.as_tensor(list(seq_lens) if not torch.is_tensor(seq_lens) else seq_lens.cpu()).long()
    seq, _, _ = _page_schedule(config, lens, max_len)
    return len(seq) + int(config.has_tail)


class _Layout:
    """One kind's tile layout (from packing) as device tensors: where each word slot's code comes from."""

    def __init__(self, bits: int, kind: str, head_dim: int, device: torch.device) -> None:
        positions = packing.tile_positions(bits, kind, head_dim)  # [words, 2, P] -> token * D + channel
        self.block_tokens = packing.block_tokens(kind)
        self.words = positions.shape[0]
        if positions.numel() != self.block_tokens * head_dim:
            raise ValueError(
                f"packing.tile_positions({bits}, {kind!r}, {head_dim}) covers {positions.numel()} codes but "
                f"block_tokens({kind!r}) * head_dim = {self.block_tokens * head_dim}; the two must agree.")
        self.token = (positions // head_dim).to(device)  # token inside the block
        self.channel = (positions % head_dim).to(device)
        # bit offset of position k inside its 16-bit half
        self.shift = (torch.arange(positions.shape[-1]) * bits).to(device=device, dtype=torch.int32)


class GraphAppender:
    """Appends one token per sequence to every layer's cache with device work only (see the module doc).

    caches: one QuantizedKVCache per layer, quantized alike (same config, shapes, lengths and
    page table; `foscar.quantize` with the same lengths and `extra_pages`, or clones of one
    cache). They are made to share the first cache's page_table, seq_lens and tail_lens, and
    the pages the growth to `max_len` will fill are reserved now from the free list
    (`pages_to_reserve` says how many are needed). The page table is widened to its final
    width; entries past the pages a sequence owns stay 0 until a step writes there.
    """

    def __init__(self, caches: Sequence[QuantizedKVCache], max_len: int) -> None:
        if not caches:
            raise ValueError("GraphAppender needs at least one cache; got none.")
        self.caches = list(caches)
        first = self.caches[0]
        self.config: QuantConfig = first.config
        self._check_alike()
        cfg, device = self.config, first.device
        self.page, self.group = cfg.page_size, cfg.group_size
        self.batch, self.heads, self.head_dim = first.batch, first.num_kv_heads, first.head_dim
        self.host_lens = first.seq_lens.cpu().long()
        self.max_len = int(max_len)
        if self.max_len < int(self.host_lens.max()):
            raise ValueError(
                f"max_len={max_len} is shorter than the longest sequence ({int(self.host_lens.max())}); "
                "expected room to grow.")
        self.layouts = {kind: _Layout(cfg.bits, kind, self.head_dim, device) for kind in packing.KINDS}
        for kind, layout in self.layouts.items():
            words_per_page = getattr(first, f"{kind}_codes")[0, 0].numel()  # one page, one head
            if self.page % layout.block_tokens or words_per_page != self.page // layout.block_tokens * layout.words:
                raise ValueError(
                    f"a page of {self.page} tokens holds {words_per_page} words per head, which is not "
                    f"whole blocks of {layout.block_tokens} tokens x {layout.words} words ({kind!r}); "
                    "the cache does not match foscar.packing.")
            if self.group % layout.block_tokens and layout.block_tokens % self.group:
                raise ValueError(
                    f"group_size={self.group} and {kind!r} blocks of {layout.block_tokens} tokens do not "
                    "nest; the append writes whole groups into blocks.")
        self._reserve_pages(device)
        self.rows = torch.arange(self.batch, device=device)

    # --- set-up (host) -------------------------------------------------------------------
    def _check_alike(self) -> None:
        first = self.caches[0]
        for i, c in enumerate(self.caches[1:], start=1):
            same = (c.config == first.config and c.k_codes.shape == first.k_codes.shape
                    and c.k_tail.shape == first.k_tail.shape and c.free_pages == first.free_pages
                    and torch.equal(c.page_table, first.page_table) and torch.equal(c.seq_lens, first.seq_lens)
                    and torch.equal(c.tail_lens, first.tail_lens))
            if not same:
                raise ValueError(
                    f"cache {i} differs from cache 0 in config, shapes, lengths, page table or free pages; "
                    "expected every layer quantized alike (same lengths and extra_pages).")

    def _reserve_pages(self, device: torch.device) -> None:
        first = self.caches[0]
        seq, col, width = _page_schedule(self.config, self.host_lens, self.max_len)
        need = len(seq) + int(self.config.has_tail)
        if need > len(first.free_pages):
            raise ValueError(
                f"growing to max_len={self.max_len} needs {need} spare pages but the cache has "
                f"{len(first.free_pages)}; quantize with extra_pages=foscar.append_graph.pages_to_reserve(...).")
        width = max(width, first.max_pages_per_seq)
        table = torch.zeros(self.batch, width, dtype=torch.int32)
        table[:, : first.max_pages_per_seq] = first.page_table.cpu()
        plan = table.clone()
        plan[seq, col] = torch.tensor(first.free_pages[: len(seq)], dtype=torch.int32)
        taken = need
        self.scratch_page = first.free_pages[len(seq)] if self.config.has_tail else -1
        self.page_plan = plan.to(device)
        page_table = table.to(device)
        seq_lens, tail_lens = first.seq_lens, first.tail_lens
        emptied = set()  # clones of one cache may share one free list: take its pages once
        for c in self.caches:
            c.page_table, c.seq_lens, c.tail_lens = page_table, seq_lens, tail_lens
            if id(c.free_pages) not in emptied:
                emptied.add(id(c.free_pages))
                del c.free_pages[:taken]
        self.page_table, self.seq_lens, self.tail_lens = page_table, seq_lens, tail_lens

    # --- host bookkeeping ----------------------------------------------------------------
    @property
    def flush_period(self) -> int | None:
        """Steps between flushes when all sequences share a length (None: no tail, no flush)."""
        return self.group if self.config.has_tail else None

    def flush_due(self) -> bool:
        """Whether the next step completes a group of some sequence (it then needs flush=True)."""
        if int(self.host_lens.max()) + 1 > self.max_len:
            raise ValueError(
                f"the caches were sized for max_len={self.max_len} tokens and are full; build them "
                "with a larger max_len.")
        return self.config.has_tail and bool(((self.host_lens + 1) % self.group == 0).any())

    def stepped(self) -> None:
        """Record on the host that one step (begin_step and every layer's append) ran."""
        self.host_lens += 1

    def step(self, k_new: Sequence[torch.Tensor], v_new: Sequence[torch.Tensor]) -> None:
        """One eager step: k_new[i], v_new[i] (BF16 [batch, num_kv_heads, head_dim]) go to layer i."""
        flush = self.flush_due()
        self.begin_step(flush)
        for layer, (k, v) in enumerate(zip(k_new, v_new)):
            self.append(layer, k, v, flush)
        self.stepped()

    # --- device work (capturable) --------------------------------------------------------
    def begin_step(self, flush: bool) -> None:
        """Lengths grow by one token; the page table gains the page this step writes, if new."""
        if self.config.has_tail:
            self.seq_lens += 1
            torch.remainder(self.seq_lens, self.group, out=self.tail_lens)
            if flush:
                full = self.tail_lens == 0
                col = torch.clamp(self.seq_lens.long() - self.group, min=0) // self.page
                self._open_page(col, full)
        else:
            col = self.seq_lens.long() // self.page
            self._open_page(col, torch.ones_like(col, dtype=torch.bool))
            self.seq_lens += 1

    def _open_page(self, col: torch.Tensor, where: torch.Tensor) -> None:
        col = col.clamp(max=self.page_table.shape[1] - 1)[:, None]
        planned = self.page_plan.gather(1, col)
        self.page_table.scatter_(1, col, torch.where(where[:, None], planned, self.page_table.gather(1, col)))

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, flush: bool) -> None:
        """Write layer `layer`'s new K and V (BF16 [batch, num_kv_heads, head_dim]); after begin_step."""
        cache = self.caches[layer]
        if self.config.has_tail:
            slot = (self.seq_lens.long() - 1) % self.group
            cache.k_tail[self.rows, :, slot] = k_new
            cache.v_tail[self.rows, :, slot] = v_new
            if flush:
                self._flush(cache)
        else:
            pos = self.seq_lens.long() - 1
            phys = self.page_table.gather(1, (pos // self.page)[:, None])[:, 0].long()
            for kind, x in (("k", k_new), ("v", v_new)):
                self._store(cache, kind, phys, pos % self.page, x[:, None].float())

    def _flush(self, cache: QuantizedKVCache) -> None:
        """Quantize the tails of the sequences whose group is complete into their page; zero those tails."""
        full = self.tail_lens == 0
        # A sequence whose group is not complete writes slot 0 of the scratch page instead.
        start = torch.where(full, self.seq_lens.long() - self.group, 0)
        own = self.page_table.gather(1, (start // self.page)[:, None])[:, 0].long()
        phys = torch.where(full, own, torch.full_like(own, self.scratch_page))
        for kind, tail in (("k", cache.k_tail), ("v", cache.v_tail)):
            self._store(cache, kind, phys, start % self.page, tail.permute(0, 2, 1, 3).float())
            tail.masked_fill_(full[:, None, None, None], 0)

    def _store(self, cache: QuantizedKVCache, kind: str, phys: torch.Tensor, slot: torch.Tensor,
               x: torch.Tensor) -> None:
        """Quantize x float32 [batch, T, H, D] into tokens slot .. slot+T-1 of pages phys [batch].

        The codes are ORed into their words: slots past a sequence's packed length hold 0
        (docs/FORMAT.md), so a group that fills part of a block keeps the rest of it.
        """
        cfg, layout, dim = self.config, self.layouts[kind], self.head_dim
        mode = cfg.k_mode if kind == "k" else cfg.v_mode
        codes, params = _quantize_block(x, mode, cfg)  # [B, T, H, D] uint8, [B, H, T*D/G, 2]
        tokens = codes.shape[1]
        bt = layout.block_tokens
        n_blocks = max(1, tokens // bt)
        offset = (slot % bt)[:, None, None, None, None]
        block = torch.arange(n_blocks, device=slot.device)[None, :, None, None, None]
        token = block * bt + layout.token[None, None] - offset  # [B, blocks, words, 2, P]
        index = (token.clamp(0, tokens - 1) * dim + layout.channel).view(self.batch, 1, -1)
        flat = codes.permute(0, 2, 1, 3).reshape(self.batch, self.heads, -1)
        slots = flat.gather(2, index.expand(-1, self.heads, -1))  # uint8, one per (block, word, half, position)
        if tokens < bt:  # part of a block: the slots of other tokens contribute 0
            slots = slots * ((token >= 0) & (token < tokens)).view(self.batch, 1, -1)
        slots = slots.view(self.batch, self.heads, n_blocks, layout.words, 2, -1).to(torch.int32)
        # Each 16-bit half first (< 2^16), then high * 2^16 + low with the high half made signed,
        # so every step stays inside int32 (4 bytes per code: this runs on whole batches).
        halves = (slots << layout.shift).sum(dim=-1, dtype=torch.int32)
        low, high = halves[..., 0], halves[..., 1]
        value = (high - ((high >> 15) << 16)) * 65536 + low  # [B, H, blocks, words]
        words = getattr(cache, f"{kind}_codes").view(cache.num_pages, self.heads, -1)
        first_word = (slot // bt) * layout.words
        word = (first_word[:, None] + torch.arange(n_blocks * layout.words, device=slot.device))
        old = words[phys[:, None], :, word]  # [B, words, H]
        words[phys[:, None], :, word] = old | value.view(self.batch, self.heads, -1).transpose(1, 2)
        first = slot * dim // cfg.group_size
        pidx = first[:, None] + torch.arange(params.shape[2], device=slot.device)
        getattr(cache, f"{kind}_params")[phys[:, None], :, pidx] = params.permute(0, 2, 1, 3)
