"""append: one decode token per sequence matches a fresh quantize of the longer K/V; pages run out cleanly."""
from __future__ import annotations

import pytest
import torch

from foscar.cache import OutOfPagesError, append, dequantize, logical_view, quantize
from foscar.config import QuantConfig

MODE_PAIRS = [("token", "token"), ("token", "channel"), ("channel", "token"), ("channel", "channel")]
CACHE_FIELDS = ("k_codes", "v_codes", "k_params", "v_params", "page_table", "seq_lens", "tail_lens", "k_tail", "v_tail")


def make_kv(rng, batch, max_len, heads, dim):
    k = torch.randn(batch, max_len, heads, dim, generator=rng).bfloat16()
    v = (torch.randn(batch, max_len, heads, dim, generator=rng) - 0.25).bfloat16()
    return k, v


def assert_same_sequences(grown, fresh):
    """Equal logical content: codes, parameters, tails and lengths (physical pages may differ)."""
    assert torch.equal(grown.seq_lens, fresh.seq_lens)
    assert torch.equal(grown.tail_lens, fresh.tail_lens)
    for b in range(fresh.batch):
        a, e = logical_view(grown, b), logical_view(fresh, b)
        for name in ("k_codes", "v_codes", "k_params", "v_params", "k_tail", "v_tail"):
            assert torch.equal(getattr(a, name), getattr(e, name)), (b, name)
    for a, e in zip(dequantize(grown), dequantize(fresh)):
        assert torch.equal(a, e)


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
@pytest.mark.parametrize("bits", [2, 4])
def test_append_matches_fresh_quantize(rng, bits, k_mode, v_mode):
    """40 steps from lengths around group and page edges: tails complete, pages fill and are taken."""
    cfg = QuantConfig(bits=bits, group_size=32, k_mode=k_mode, v_mode=v_mode, page_size=64)
    start = [30, 64, 1, 95, 31]
    steps = 40
    k, v = make_kv(rng, len(start), max(start) + steps, 2, 64)
    lens = torch.tensor(start)
    grown = quantize(k, v, start, cfg, extra_pages=len(start) * 2, shuffle_pages=True, seed=3)
    for step in range(steps):
        rows = torch.arange(len(start))
        append(grown, k[rows, lens + step], v[rows, lens + step])
        if step % 9 == 0 or step == steps - 1:
            fresh = quantize(k, v, (lens + step + 1).tolist(), cfg)
            assert_same_sequences(grown, fresh)
    used = [max(1, -(-n // 64)) for n in grown.packed_lens.tolist()]
    owned = [p for row, n in zip(grown.page_table.tolist(), used) for p in row[:n]]
    assert sorted(owned + grown.free_pages) == list(range(grown.num_pages))


def test_append_grows_the_page_table(rng):
    cfg = QuantConfig(bits=4, group_size=32, k_mode="token", v_mode="token", page_size=64)
    k, v = make_kv(rng, 2, 72, 2, 128)
    c = quantize(k, v, [64, 5], cfg, extra_pages=1)
    assert c.max_pages_per_seq == 1
    append(c, k[:, 64], v[:, 64])
    assert c.max_pages_per_seq == 2 and c.free_pages == []
    assert c.page_table.tolist() == [[0, 2], [1, 0]]


@pytest.mark.parametrize("k_mode, v_mode", [("token", "token"), ("channel", "token")])
def test_running_out_of_pages_changes_nothing(rng, k_mode, v_mode):
    cfg = QuantConfig(bits=2, group_size=32, k_mode=k_mode, v_mode=v_mode, page_size=64)
    k, v = make_kv(rng, 2, 100, 2, 64)
    # token-wise: the next token of sequence 0 opens page 1; channel-wise: its tail of 31 completes
    # a group past its full first page.
    c = quantize(k, v, [64 if k_mode == "token" else 95, 10], cfg, extra_pages=0)
    before = {name: getattr(c, name).clone() for name in CACHE_FIELDS}
    with pytest.raises(OutOfPagesError, match="needs 1 fresh page but 0 are free"):
        append(c, k[:, 96], v[:, 96])
    for name in CACHE_FIELDS:
        assert torch.equal(getattr(c, name), before[name]), name
