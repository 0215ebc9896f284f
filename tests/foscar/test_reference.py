"""The float64 references: plain attention against a loop, and the folded form against attention over dequantize."""
from __future__ import annotations

import math

import pytest
import torch

from foscar.cache import dequantize, quantize
from foscar.config import QuantConfig
from foscar.reference import attention_f64, folded_attention_f64

MODE_PAIRS = [("token", "token"), ("token", "channel"), ("channel", "token"), ("channel", "channel")]
# The folded form equals "dequantize, then attend" in exact arithmetic; in float64 the two differ
# by rounding alone (the 128 bias cancels against sums of a few thousand terms: ~1e-14 seen).
FOLD_RTOL = 1e-12


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def draw(rng, batch, max_len, num_q_heads, num_kv_heads, head_dim):
    q = torch.randn(batch, num_q_heads, head_dim, generator=rng).bfloat16()
    k = torch.randn(batch, max_len, num_kv_heads, head_dim, generator=rng).bfloat16()
    v = (torch.randn(batch, max_len, num_kv_heads, head_dim, generator=rng) * 2 - 0.5).bfloat16()
    return q, k, v


def loop_attention(q, k, v, lens, sm_scale):
    """One (sequence, query head) at a time, softmax written out."""
    batch, num_q_heads, _ = q.shape
    ratio = num_q_heads // k.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(batch):
        for h in range(num_q_heads):
            keys, values = k[b, : lens[b], h // ratio].double(), v[b, : lens[b], h // ratio].double()
            scores = keys @ q[b, h].double() * sm_scale
            weights = torch.exp(scores - scores.max())
            out[b, h] = weights @ values / weights.sum()
    return out


@pytest.mark.parametrize("ratio", [1, 4, 8])
def test_attention_f64_matches_a_loop(rng, ratio):
    q, k, v = draw(rng, 3, 50, 2 * ratio, 2, 64)
    lens = [50, 1, 33]
    assert attention_f64(q, k, v, lens).dtype == torch.float64
    assert rel_l2(attention_f64(q, k, v, lens), loop_attention(q, k, v, lens, 1 / 8)) < 1e-14
    got = attention_f64(q, k, v, torch.tensor(lens), sm_scale=0.3)
    assert rel_l2(got, loop_attention(q, k, v, lens, 0.3)) < 1e-14


def test_attention_f64_ignores_padding(rng):
    q, k, v = draw(rng, 2, 30, 4, 1, 128)
    noisy_k, noisy_v = k.clone(), v.clone()
    noisy_k[0, 20:] = torch.randn(10, 1, 128, generator=rng).bfloat16() * 100
    noisy_v[0, 20:] = float("nan")
    assert torch.equal(attention_f64(q, k, v, [20, 30]), attention_f64(q, noisy_k, noisy_v, [20, 30]))


def fold_cases():
    """Every mode pair x width x group size x head_dim that makes a cache; GQA ratio and page
    size rotate along."""
    cases = []
    for i, (k_mode, v_mode) in enumerate(MODE_PAIRS):
        for bits in (2, 4):
            for group in (32, 64, 128):
                for j, head_dim in enumerate((64, 128, 256)):
                    if "token" in (k_mode, v_mode) and head_dim % group:
                        continue  # token-wise groups of `group` channels need head_dim % group == 0
                    ratio = (1, 4, 8)[(i + j + group // 32) % 3]
                    cases.append(pytest.param(k_mode, v_mode, bits, group, head_dim, ratio))
    return cases


@pytest.mark.parametrize("k_mode, v_mode, bits, group, head_dim, ratio", fold_cases())
def test_folded_equals_dequantized_attention(rng, k_mode, v_mode, bits, group, head_dim, ratio):
    page = max(64, group) * (1 + head_dim // 128 % 2)  # page size one or two groups (or 64-token blocks)
    cfg = QuantConfig(bits=bits, group_size=group, k_mode=k_mode, v_mode=v_mode, page_size=page)
    max_len = 2 * page + group + 5
    # Lengths off every edge: past a page and a group, a whole group, inside one group, 1.
    lens = [max_len, group, group - 3, 1, page + 1 + int(torch.randint(0, group, (1,), generator=rng))]
    q, k, v = draw(rng, len(lens), max_len, 2 * ratio, 2, head_dim)
    cache = quantize(k, v, lens, cfg, extra_pages=2, shuffle_pages=True, seed=len(lens))
    k_deq, v_deq = dequantize(cache, dtype=torch.float64)
    expected = attention_f64(q, k_deq, v_deq, lens)
    assert rel_l2(folded_attention_f64(q, cache), expected) < FOLD_RTOL
    sm_scale = 0.7 / math.sqrt(head_dim)
    assert rel_l2(folded_attention_f64(q, cache, sm_scale), attention_f64(q, k_deq, v_deq, lens, sm_scale)) < FOLD_RTOL


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
@pytest.mark.parametrize("bits", [2, 4])
def test_folded_batch_129(rng, bits, k_mode, v_mode):
    """Many short sequences: every length from 1 up, so each sits differently in its group and page."""
    cfg = QuantConfig(bits=bits, group_size=32, k_mode=k_mode, v_mode=v_mode, page_size=64)
    lens = [1 + (7 * b) % 80 for b in range(129)]
    q, k, v = draw(rng, 129, 80, 8, 1, 64)
    cache = quantize(k, v, lens, cfg, shuffle_pages=True, seed=1)
    k_deq, v_deq = dequantize(cache, dtype=torch.float64)
    assert rel_l2(folded_attention_f64(q, cache), attention_f64(q, k_deq, v_deq, lens)) < FOLD_RTOL


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
def test_rounded_operands_stay_near(rng, k_mode, v_mode):
    """Rounding the folded operands to the kernels' type (fp16 for K and V) moves the output at
    fp16 level; bf16 would move it more, and still at bf16 level."""
    cfg = QuantConfig(bits=4, group_size=64, k_mode=k_mode, v_mode=v_mode, page_size=64)
    lens = [200, 77]
    q, k, v = draw(rng, 2, 200, 4, 2, 128)
    cache = quantize(k, v, lens, cfg)
    exact = folded_attention_f64(q, cache)
    kernels = rel_l2(folded_attention_f64(q, cache, round_operands=True), exact)
    fp16 = rel_l2(folded_attention_f64(q, cache, round_operands=torch.float16), exact)
    bf16 = rel_l2(folded_attention_f64(q, cache, round_operands=torch.bfloat16), exact)
    assert kernels == fp16 and 0 < fp16 < bf16 < 3e-2


def test_bad_query_shapes(rng):
    q, k, v = draw(rng, 1, 8, 3, 2, 64)
    with pytest.raises(ValueError, match="num_q_heads=3 is not a multiple of num_kv_heads=2"):
        attention_f64(q, k, v, [8])
    cache = quantize(k, v, [8], QuantConfig(group_size=32, page_size=64))
    with pytest.raises(ValueError, match="num_q_heads=3 is not a multiple of num_kv_heads=2"):
        folded_attention_f64(q, cache)
    with pytest.raises(ValueError, match="cache holds batch=1, head_dim=64"):
        folded_attention_f64(q[:, :2, :32], cache)
