"""quantize / dequantize / logical_view of the paged cache: shapes, error bounds, pages, tails, nbytes."""
from __future__ import annotations

import math

import pytest
import torch

from foscar import cache as cache_mod
from foscar.cache import dequantize, gather_codes, gather_params, logical_view, quantize
from foscar.config import QuantConfig

MODE_PAIRS = [("token", "token"), ("token", "channel"), ("channel", "token"), ("channel", "channel")]


def make_kv(rng, batch, max_len, heads, dim, scale=1.0):
    k = (torch.randn(batch, max_len, heads, dim, generator=rng) * scale).bfloat16()
    v = (torch.randn(batch, max_len, heads, dim, generator=rng) * scale + 0.5).bfloat16()
    return k, v


def group_min_max(x: torch.Tensor, mode: str, group: int):
    """lo, hi of each group of x [L, H, D] (float64), in logical parameter indexing."""
    tokens, heads, dim = x.shape
    if mode == "token":
        grouped, axis = x.view(tokens, heads, dim // group, group), -1
    else:
        grouped, axis = x.view(tokens // group, group, heads, dim), 1
    return grouped.amin(axis), grouped.amax(axis)


def expand(p: torch.Tensor, mode: str, group: int) -> torch.Tensor:
    """Per-group values -> per element [L, H, D]."""
    return p.repeat_interleave(group, dim=-1 if mode == "token" else 0)


def test_shapes_and_dtypes_follow_format(rng):
    """The table of docs/FORMAT.md, field by field: what the kernels read."""
    cfg = QuantConfig(bits=2, group_size=64, k_mode="channel", v_mode="token", page_size=128)
    k, v = make_kv(rng, 3, 300, 4, 128)
    c = quantize(k, v, [300, 100, 5], cfg, extra_pages=2)
    pages = 2 + 1 + 1 + 2  # ceil(256/128), ceil(64/128), max(1, 0), extra
    assert c.num_pages == pages and c.batch == 3 and c.max_pages_per_seq == 2
    for codes in (c.k_codes, c.v_codes):
        assert codes.dtype == torch.int32 and codes.shape == (pages, 4, 128 // 16, 16 * 128 * 2 // 32)
    for params in (c.k_params, c.v_params):
        assert params.dtype == torch.float16 and params.shape == (pages, 4, 128 * 128 // 64, 2)
    assert c.page_table.dtype == torch.int32 and c.page_table.shape == (3, 2)
    assert c.seq_lens.dtype == torch.int32 and c.seq_lens.tolist() == [300, 100, 5]
    assert c.tail_lens.dtype == torch.int32 and c.tail_lens.tolist() == [300 % 64, 100 % 64, 5]
    assert c.packed_lens.tolist() == [256, 64, 0]
    for tail in (c.k_tail, c.v_tail):
        assert tail.dtype == torch.bfloat16 and tail.shape == (3, 4, 64, 128)
    fp32 = quantize(k, v, [300, 100, 5], QuantConfig(param_dtype="fp32", k_mode="token", v_mode="token"))
    assert fp32.k_params.dtype == torch.float32 and fp32.tail_lens.tolist() == [0, 0, 0]


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
@pytest.mark.parametrize("bits", [2, 4])
def test_round_trip_within_half_a_step(rng, bits, k_mode, v_mode, group):
    """|dequantized - x| <= s/2 + |z - min| + (2^b - 1) |s - (max - min)/(2^b - 1)| + 1e-6 |x|.

    s/2 is the rounding of the code; the other two terms are the rounding of z and s to the
    parameter dtype (a clamped code can lose them); 1e-6 |x| covers float32 code arithmetic.
    """
    cfg = QuantConfig(bits=bits, group_size=group, k_mode=k_mode, v_mode=v_mode, page_size=2 * group)
    k, v = make_kv(rng, 3, 5 * group + 7, 2, 128, scale=3.0)
    lens = [5 * group + 7, group, 2 * group - 1]
    c = quantize(k, v, lens, cfg)
    levels = (1 << bits) - 1
    deq_k, deq_v = dequantize(c, dtype=torch.float64)
    for b, length in enumerate(lens):
        view = logical_view(c, b)
        packed = int(c.packed_lens[b])
        assert packed == (length - length % group if cfg.has_tail else length)
        for x, codes, params, mode, deq in (
            (k[b], view.k_codes, view.k_params, k_mode, deq_k[b]),
            (v[b], view.v_codes, view.v_params, v_mode, deq_v[b]),
        ):
            x = x[:packed].double()
            lo, hi = group_min_max(x, mode, group)
            scale, offset = params[..., 0], params[..., 1]
            # The definition: rounded to the param dtype before the codes are computed.
            assert torch.equal(scale, ((hi - lo) / levels).half())
            assert torch.equal(offset, lo.half())
            assert int(codes.max()) <= levels
            scale, offset = scale.double(), offset.double()
            bound = scale / 2 + (offset - lo).abs() + levels * (scale - (hi - lo) / levels).abs()
            error = (deq[:packed] - x).abs()
            assert bool((error <= expand(bound, mode, group) + 1e-6 * x.abs()).all())
            assert torch.equal(deq[:packed], expand(scale, mode, group) * codes.double() + expand(offset, mode, group))
        # The tail is the BF16 input itself, and nothing lives past the length.
        assert torch.equal(deq_k[b, packed:length], k[b, packed:length].double())
        assert torch.equal(deq_v[b, packed:length], v[b, packed:length].double())
        assert not deq_k[b, length:].any() and not deq_v[b, length:].any()


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
def test_fp32_params(rng, k_mode, v_mode):
    """fp32 parameters: exact min as offset; values beyond the fp16 range are fine."""
    cfg = QuantConfig(bits=4, group_size=32, k_mode=k_mode, v_mode=v_mode, param_dtype="fp32", page_size=64)
    k, v = make_kv(rng, 2, 100, 2, 64, scale=1e5)
    c = quantize(k, v, [100, 33], cfg)
    deq_k, _ = dequantize(c, dtype=torch.float64)
    view = logical_view(c, 0)
    packed = int(c.packed_lens[0])
    x = k[0, :packed].double()
    lo, _ = group_min_max(x, k_mode, 32)
    assert torch.equal(view.k_params[..., 1].double(), lo)
    scale = expand(view.k_params[..., 0].double(), k_mode, 32)
    assert bool(((deq_k[0, :packed] - x).abs() <= scale * (0.5 + 1e-5)).all())


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
def test_constant_groups(rng, k_mode, v_mode):
    """A constant group stores s = 1 and codes 0; its value comes back as z, with no NaN anywhere."""
    cfg = QuantConfig(bits=2, group_size=32, k_mode=k_mode, v_mode=v_mode, page_size=64)
    k, v = make_kv(rng, 2, 96, 2, 64)
    value = torch.randn(2, generator=rng) + 2.0
    k[0, 3, 1, 32:64] = value[0].bfloat16()  # one token-wise group of K (token 3, head 1, channels 32..63)
    k[0, 0:32, 1, 5] = value[0].bfloat16()  # one channel-wise group of K (tokens 0..31, head 1, channel 5)
    v[1] = value[1].bfloat16()  # a whole constant sequence of V
    c = quantize(k, v, [96, 70], cfg)
    view0, view1 = logical_view(c, 0), logical_view(c, 1)
    deq_k, deq_v = dequantize(c, dtype=torch.float64)
    assert torch.isfinite(deq_k).all() and torch.isfinite(deq_v).all()
    group = (3, 1, 1) if k_mode == "token" else (0, 1, 5)
    assert float(view0.k_params[group][0]) == 1.0
    assert float(view0.k_params[group][1]) == float(value[0].bfloat16().half())
    assert not view1.v_codes.any() and bool((view1.v_params[..., 0] == 1).all())
    packed = int(c.packed_lens[1])
    assert torch.equal(deq_v[1, :packed], torch.full_like(deq_v[1, :packed], float(value[1].bfloat16().half())))


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
def test_pages_are_allocated_per_sequence(rng, k_mode, v_mode):
    cfg = QuantConfig(bits=4, group_size=32, k_mode=k_mode, v_mode=v_mode, page_size=64)
    k, v = make_kv(rng, 4, 200, 2, 64)
    lens = [200, 64, 20, 129]
    c = quantize(k, v, lens, cfg, extra_pages=3)
    packed = c.packed_lens.tolist()
    per_seq = [max(1, math.ceil(n / 64)) for n in packed]
    assert c.num_pages == sum(per_seq) + 3 and c.max_pages_per_seq == max(per_seq)
    table = c.page_table.tolist()
    owned = [p for b, n in enumerate(per_seq) for p in table[b][:n]]
    assert sorted(owned + c.free_pages) == list(range(c.num_pages))
    assert all(p == 0 for b, n in enumerate(per_seq) for p in table[b][n:])  # padding entries
    # Unused token slots of the allocated pages, and the spare pages, hold code 0 and (1, 0): no
    # scale is 0, written or not.
    codes_k, codes_v = gather_codes(c, torch.arange(4))
    params_k, params_v = gather_params(c, torch.arange(4))
    for b, n in enumerate(per_seq):
        assert not codes_k[b, packed[b] : n * 64].any() and not codes_v[b, packed[b] : n * 64].any()
        for params, mode in ((params_k, k_mode), (params_v, v_mode)):
            first = packed[b] if mode == "token" else packed[b] // 32
            last = n * 64 if mode == "token" else n * 2
            assert bool((params[b, first:last, ..., 0] == 1).all()) and not params[b, first:last, ..., 1].any()
    free = torch.tensor(c.free_pages)
    for t in (c.k_codes, c.v_codes):
        assert not t[free].any()
    for t in (c.k_params, c.v_params):
        assert bool((t[free][..., 0] == 1).all()) and not t[free][..., 1].any()
    assert not any(bool((t[..., 0] == 0).any()) for t in (c.k_params, c.v_params))


def test_shuffled_pages_hold_the_same_cache(rng):
    cfg = QuantConfig(bits=2, group_size=32, k_mode="channel", v_mode="token", page_size=64)
    k, v = make_kv(rng, 3, 150, 2, 128)
    lens = [150, 97, 40]
    plain = quantize(k, v, lens, cfg, extra_pages=4)
    mixed = quantize(k, v, lens, cfg, extra_pages=4, shuffle_pages=True, seed=7)
    again = quantize(k, v, lens, cfg, extra_pages=4, shuffle_pages=True, seed=7)
    assert not torch.equal(plain.page_table, mixed.page_table)
    assert torch.equal(mixed.page_table, again.page_table) and mixed.free_pages == again.free_pages
    for a, b in zip(dequantize(plain), dequantize(mixed)):
        assert torch.equal(a, b)


def test_chunking_does_not_change_the_cache(rng, monkeypatch):
    """One page per step (the memory-frugal path on a big GPU cache) gives the same bytes."""
    cfg = QuantConfig(bits=4, group_size=64, k_mode="token", v_mode="channel", page_size=64)
    k, v = make_kv(rng, 3, 300, 2, 128)
    lens = [300, 200, 65]
    whole = quantize(k, v, lens, cfg)
    monkeypatch.setattr(cache_mod, "CHUNK_ELEMENTS", 1)
    chunked = quantize(k, v, lens, cfg)
    for name in ("k_codes", "v_codes", "k_params", "v_params", "k_tail", "v_tail", "page_table"):
        assert torch.equal(getattr(whole, name), getattr(chunked, name)), name
    for a, b in zip(dequantize(whole, [2, 0]), dequantize(chunked, torch.tensor([2, 0]))):
        assert torch.equal(a, b)


@pytest.mark.parametrize("k_mode,v_mode", [("channel", "token"), ("token", "channel")])
def test_dequantize_in_token_slices_gives_the_same_values(rng, monkeypatch, k_mode, v_mode):
    """dequantize works through a sequence's tokens in slices of whole groups (its temporaries
    bounded by CHUNK_ELEMENTS: one 128K-token sequence took about 4 GB at once); one group a
    slice, with a last slice cut short by the length, gives what one slice does."""
    cfg = QuantConfig(bits=2, group_size=32, k_mode=k_mode, v_mode=v_mode, page_size=64)  # 300: 288 packed, 5 pages
    k, v = make_kv(rng, 3, 300, 2, 128)
    c = quantize(k, v, [300, 200, 65], cfg)
    whole = dequantize(c)
    monkeypatch.setattr(cache_mod, "CHUNK_ELEMENTS", 1)  # one sequence a step, one group a slice
    sliced = dequantize(c)
    for a, b in zip(whole, sliced):
        assert torch.equal(a, b)


def test_dequantize_selected_sequences(rng):
    cfg = QuantConfig(bits=4, group_size=32, k_mode="channel", v_mode="channel", page_size=64)
    k, v = make_kv(rng, 3, 90, 2, 64)
    c = quantize(k, v, [90, 40, 70], cfg)
    all_k, all_v = dequantize(c)
    some_k, some_v = dequantize(c, batch_indices=[2, 1], dtype=torch.float64)
    assert some_k.dtype == torch.float64 and some_k.shape == (2, 70, 2, 64)
    assert torch.equal(some_k.float(), all_k[[2, 1], :70]) and torch.equal(some_v.float(), all_v[[2, 1], :70])
    with pytest.raises(ValueError, match="out of range"):
        dequantize(c, batch_indices=[3])


def test_nbytes(rng):
    """Bytes a decode step reads, counted by hand for one small cache."""
    cfg = QuantConfig(bits=4, group_size=32, k_mode="channel", v_mode="token", page_size=64)
    k, v = make_kv(rng, 2, 100, 2, 64)
    c = quantize(k, v, [100, 40], cfg, extra_pages=5)
    # packed 96 and 32 tokens; tails 4 and 8 tokens; 2 heads, d 64, fp16 params.
    tokens, heads, dim = 128, 2, 64
    expected = {
        "codes": 2 * tokens * heads * dim // 2,
        "params": 2 * tokens * heads * (dim // 32) * 2 * 2,
        "tails": 2 * 12 * heads * dim * 2,
        "page_table": 4 * (2 + 1),
        "seq_lens": 4 * 2,
    }
    expected["total"] = sum(expected.values())
    assert c.nbytes() == expected
    allocated = c.nbytes(allocated=True)
    assert allocated["codes"] == 2 * c.num_pages * heads * 64 * dim // 2
    assert allocated["total"] == sum(v for name, v in allocated.items() if name != "total")
