"""foscar.append_graph: the device-only append equals foscar.append and a fresh quantize, at any
block size packing declares, and in CUDA graphs on the GPU."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from foscar import packing
from foscar.append_graph import GraphAppender, pages_to_reserve
from foscar.cache import append, logical_view, quantize
from foscar.config import QuantConfig

MODE_PAIRS = [("token", "token"), ("token", "channel"), ("channel", "token"), ("channel", "channel")]
FIELDS = ("k_codes", "v_codes", "k_params", "v_params", "seq_lens", "tail_lens", "k_tail", "v_tail")


def make_kv(rng, batch, max_len, heads, dim, device="cpu"):
    k = torch.randn(batch, max_len, heads, dim, generator=rng).bfloat16()
    v = (torch.randn(batch, max_len, heads, dim, generator=rng) - 0.25).bfloat16()
    return k.to(device), v.to(device)


def tokens_at(x, lens, step):
    rows = torch.arange(x.shape[0], device=x.device)
    return x[rows, lens.to(x.device) + step]


def assert_equal_caches(mine, ref, appender):
    """Every tensor equal (the scratch page aside: a spare page in `ref`); the page table's extra width zero."""
    for name in FIELDS:
        a, e = getattr(mine, name).cpu().clone(), getattr(ref, name).cpu()
        if appender.scratch_page >= 0 and name.endswith(("codes", "params")):
            a[appender.scratch_page] = e[appender.scratch_page]
        assert torch.equal(a, e), name
    width = ref.page_table.shape[1]
    assert torch.equal(mine.page_table[:, :width].cpu(), ref.page_table.cpu())
    assert not mine.page_table[:, width:].any()


def assert_same_as_fresh(mine, k, v, lens, config):
    fresh = quantize(k.cpu(), v.cpu(), lens.tolist(), config)
    assert torch.equal(mine.seq_lens.cpu(), fresh.seq_lens) and torch.equal(mine.tail_lens.cpu(), fresh.tail_lens)
    mine_cpu = dataclasses.replace(mine, **{f.name: getattr(mine, f.name).cpu() for f in dataclasses.fields(mine)
                                            if torch.is_tensor(getattr(mine, f.name))})
    for b in range(len(lens)):
        got, want = logical_view(mine_cpu, b), logical_view(fresh, b)
        for name in ("k_codes", "v_codes", "k_params", "v_params", "k_tail", "v_tail"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (b, name)


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
@pytest.mark.parametrize("bits", [2, 4])
def test_matches_foscar_append_step_by_step(rng, bits, k_mode, v_mode):
    """Unequal lengths around group and page edges, shuffled pages: every tensor as foscar.append leaves it."""
    cfg = QuantConfig(bits=bits, group_size=32, k_mode=k_mode, v_mode=v_mode, page_size=64)
    start, steps = [30, 64, 1, 95, 31], 70
    k, v = make_kv(rng, len(start), max(start) + steps, 2, 64)
    extra = pages_to_reserve(cfg, start, max(start) + steps)
    ref = quantize(k, v, start, cfg, extra_pages=extra, shuffle_pages=True, seed=5)
    mine = quantize(k, v, start, cfg, extra_pages=extra, shuffle_pages=True, seed=5)
    appender = GraphAppender([mine], max(start) + steps)
    lens = torch.tensor(start)
    for step in range(steps):
        append(ref, tokens_at(k, lens, step), tokens_at(v, lens, step))
        appender.step([tokens_at(k, lens, step)], [tokens_at(v, lens, step)])
        if step in (0, 33, steps - 1):
            assert_equal_caches(mine, ref, appender)
    assert_same_as_fresh(mine, k, v, lens + steps, cfg)


@pytest.mark.parametrize("bits", [2, 4])
def test_300_appended_tokens_equal_quantizing_them_at_once(rng, bits):
    """The e2e format (K channel-wise, V token-wise, group 128): two flushes, a page boundary, one tail left."""
    cfg = QuantConfig(bits=bits, group_size=128, k_mode="channel", v_mode="token", page_size=128)
    start, steps = [1, 37, 128], 300
    k, v = make_kv(rng, len(start), max(start) + steps, 2, 128)
    cache = quantize(k, v, start, cfg, extra_pages=pages_to_reserve(cfg, start, max(start) + steps))
    appender = GraphAppender([cache], max(start) + steps)
    lens = torch.tensor(start)
    flushes = 0
    for step in range(steps):
        flushes += appender.flush_due()
        appender.step([tokens_at(k, lens, step)], [tokens_at(v, lens, step)])
    assert flushes == 6  # steps completing a group: 1 -> 301 and 37 -> 337 at 128, 256; 128 -> 428 at 256, 384
    assert_same_as_fresh(cache, k, v, lens + steps, cfg)


def test_layers_share_lengths_and_grow_apart(rng):
    """Two layers quantized alike, fed different tokens: each equals its own foscar.append."""
    cfg = QuantConfig(bits=4, group_size=64, k_mode="channel", v_mode="token", page_size=64)
    start, steps = [10, 63], 70
    layers = [make_kv(rng, 2, max(start) + steps, 1, 128) for _ in range(2)]
    extra = pages_to_reserve(cfg, start, max(start) + steps)
    k0, v0 = layers[0]
    mine = [quantize(k0, v0, start, cfg, extra_pages=extra) for _ in layers]
    refs = [quantize(k0, v0, start, cfg, extra_pages=extra) for _ in layers]
    appender = GraphAppender(mine, max(start) + steps)
    assert mine[0].seq_lens is mine[1].seq_lens and mine[0].page_table is mine[1].page_table
    lens = torch.tensor(start)
    for step in range(steps):
        ks = [tokens_at(k, lens, step) for k, _ in layers]
        vs = [tokens_at(v, lens, step) for _, v in layers]
        for ref, kt, vt in zip(refs, ks, vs):
            append(ref, kt, vt)
        appender.step(ks, vs)
    for got, ref in zip(mine, refs):
        assert_equal_caches(got, ref, appender)


def test_clones_sharing_a_free_list_give_up_the_growths_pages_once():
    # dataclasses.replace clones share the free_pages list: the reservation takes its pages once.
    cfg = QuantConfig(bits=4, group_size=128, page_size=128)
    lens, max_len = [100, 300], 600
    extra = pages_to_reserve(cfg, lens, max_len) + 3
    k = torch.randn(2, 300, 1, 128).bfloat16()
    first = quantize(k, k, lens, cfg, extra_pages=extra)
    clones = [dataclasses.replace(first, k_codes=first.k_codes.clone(), v_codes=first.v_codes.clone())
              for _ in range(3)]
    assert clones[0].free_pages is first.free_pages
    GraphAppender([first, *clones], max_len)
    assert len(first.free_pages) == 3


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("k_mode, v_mode", [("channel", "token"), ("token", "token"), ("token", "channel")])
def test_64_token_v_blocks(rng, group, k_mode, v_mode):
    """V is packed in 64-token blocks (four 16-token rows): the appender writes what foscar.append
    writes (group 32 fills half a block per flush; token-wise V writes one token into a block)."""
    cfg = QuantConfig(bits=2, group_size=group, k_mode=k_mode, v_mode=v_mode, page_size=128)
    start, steps = [5, 100, 200], 140
    k, v = make_kv(rng, len(start), max(start) + steps, 2, 128)
    extra = pages_to_reserve(cfg, start, max(start) + steps)
    ref = quantize(k, v, start, cfg, extra_pages=extra)
    mine = quantize(k, v, start, cfg, extra_pages=extra)
    appender = GraphAppender([mine], max(start) + steps)
    assert appender.layouts["v"].block_tokens == 64
    lens = torch.tensor(start)
    for step in range(steps):
        append(ref, tokens_at(k, lens, step), tokens_at(v, lens, step))
        appender.step([tokens_at(k, lens, step)], [tokens_at(v, lens, step)])
    assert_equal_caches(mine, ref, appender)


def test_errors_name_the_fix(rng):
    cfg = QuantConfig(bits=4, group_size=32, k_mode="channel", v_mode="token", page_size=64)
    k, v = make_kv(rng, 2, 100, 1, 64)
    short = quantize(k, v, [40, 40], cfg, extra_pages=0)
    with pytest.raises(ValueError, match="needs 3 spare pages but the cache has 0; quantize with extra_pages"):
        GraphAppender([short], 100)
    cache = quantize(k, v, [40, 40], cfg, extra_pages=pages_to_reserve(cfg, [40, 40], 41))
    appender = GraphAppender([cache], 41)
    appender.step([k[:, 40]], [v[:, 40]])
    with pytest.raises(ValueError, match="sized for max_len=41"):
        appender.flush_due()
    other = quantize(k, v, [40, 41], cfg, extra_pages=8)
    with pytest.raises(ValueError, match="cache 1 differs from cache 0"):
        GraphAppender([quantize(k, v, [40, 40], cfg, extra_pages=8), other], 60)
    with pytest.raises(ValueError, match="shorter than the longest sequence"):
        GraphAppender([quantize(k, v, [40, 40], cfg, extra_pages=8)], 30)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [2, 4])
def test_cuda_graph_append_matches_foscar_append(rng, bits):
    """On the GPU, captured: one graph per step kind (normal, flush) replayed as flush_due says,
    300 tokens, two layers; each layer equals foscar.append run on the CPU."""
    cfg = QuantConfig(bits=bits, group_size=128, k_mode="channel", v_mode="token", page_size=128)
    start, steps, dev = [3, 3, 3], 300, torch.device("cuda")
    max_len = max(start) + steps
    layers = [make_kv(rng, len(start), max_len, 2, 128) for _ in range(2)]
    extra = pages_to_reserve(cfg, start, max_len)
    k0, v0 = layers[0]
    refs = [quantize(k0, v0, start, cfg, extra_pages=extra) for _ in layers]
    mine = [quantize(k0.to(dev), v0.to(dev), start, cfg, extra_pages=extra) for _ in layers]
    appender = GraphAppender(mine, max_len)
    k_in = [torch.empty(len(start), 2, 128, dtype=torch.bfloat16, device=dev) for _ in layers]
    v_in = [torch.empty_like(x) for x in k_in]

    def step(flush):
        appender.begin_step(flush)
        for i in range(len(layers)):
            appender.append(i, k_in[i], v_in[i], flush)

    graphs = {}
    for flush in (False, True):
        # Warm up on a side stream, then capture; both are undone by quantizing afresh below.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(flush)
        torch.cuda.current_stream().wait_stream(side)
        graphs[flush] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[flush]):
            step(flush)
    # Capture ran the steps for real: start again from fresh caches, copied into the captured tensors.
    for got in mine:
        fresh = quantize(k0.to(dev), v0.to(dev), start, cfg, extra_pages=extra)
        for name in ("k_codes", "v_codes", "k_params", "v_params", "k_tail", "v_tail"):
            getattr(got, name).copy_(getattr(fresh, name))
    appender.seq_lens.copy_(torch.tensor(start, dtype=torch.int32))
    appender.tail_lens.copy_(torch.tensor(start, dtype=torch.int32) % cfg.group_size)
    appender.page_table.zero_()
    appender.page_table[:, :1].copy_(refs[0].page_table[:, :1])
    lens = torch.tensor(start)
    for s in range(steps):
        for i, (k, v) in enumerate(layers):
            k_in[i].copy_(tokens_at(k, lens, s).to(dev))
            v_in[i].copy_(tokens_at(v, lens, s).to(dev))
            append(refs[i], tokens_at(k, lens, s), tokens_at(v, lens, s))
        graphs[appender.flush_due()].replay()
        appender.stepped()
    torch.cuda.synchronize()
    for got, ref in zip(mine, refs):
        assert_equal_caches(got, ref, appender)
