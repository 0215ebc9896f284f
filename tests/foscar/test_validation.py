"""Bad inputs to quantize and append: one clear ValueError sentence each, raised before anything is written."""
from __future__ import annotations

import pytest
import torch

from foscar.cache import append, quantize
from foscar.config import QuantConfig

CFG = QuantConfig(bits=4, group_size=32, k_mode="channel", v_mode="token", page_size=64)
CACHE_FIELDS = ("k_codes", "v_codes", "k_params", "v_params", "page_table", "seq_lens", "tail_lens", "k_tail", "v_tail")


def kv(rng, batch=2, max_len=40, heads=2, dim=64):
    k = torch.randn(batch, max_len, heads, dim, generator=rng).bfloat16()
    v = torch.randn(batch, max_len, heads, dim, generator=rng).bfloat16()
    return k, v


def assert_one_sentence(error: pytest.ExceptionInfo, *phrases: str) -> None:
    message = str(error.value)
    assert message.endswith(".") and ". " not in message, message
    for phrase in phrases:
        assert phrase in message, (phrase, message)


def with_value(x: torch.Tensor, index, value) -> torch.Tensor:
    x = x.clone()
    x[index] = value
    return x


# name -> (k, v, seq_lens, config, extra_pages) built from clean k, v; and the phrases the message names.
QUANTIZE_CASES = {
    "k fp16": (lambda k, v: (k.half(), v, [40, 7], CFG, 0), ["k has dtype torch.float16", "torch.bfloat16"]),
    "v fp32": (lambda k, v: (k, v.float(), [40, 7], CFG, 0), ["v has dtype torch.float32"]),
    "k not a tensor": (lambda k, v: (k.tolist(), v, [40, 7], CFG, 0), ["k is a list", "torch.Tensor"]),
    "k rank 3": (lambda k, v: (k[0], v, [40, 7], CFG, 0), ["k has shape (40, 2, 64)", "num_kv_heads"]),
    "v other shape": (lambda k, v: (k, v[:, :30], [40, 7], CFG, 0), ["v has shape (2, 30, 2, 64)", "same shape"]),
    "devices": (lambda k, v: (k, v.to("meta"), [40, 7], CFG, 0), ["k is on cpu but v is on meta", ".to(device)"]),
    "head_dim 96": (
        lambda k, v: (torch.cat([k, k[..., :32]], -1), torch.cat([v, v[..., :32]], -1), [40, 7], CFG, 0),
        ["head_dim=96", "64, 128 or 256"],
    ),
    "group over head_dim": (
        lambda k, v: (k, v, [40, 7], QuantConfig(group_size=128, k_mode="token", page_size=128), 0),
        ["group_size=128 does not divide head_dim=64", "use a group size"],
    ),
    "empty sequence": (lambda k, v: (k, v, [40, 0], CFG, 0), ["seq_lens[1]=0 is an empty sequence", "drop"]),
    "too long": (lambda k, v: (k, v, [41, 7], CFG, 0), ["seq_lens[0]=41 exceeds max_kv_len=40", "pad"]),
    "too few lengths": (lambda k, v: (k, v, [40], CFG, 0), ["seq_lens has 1 entries", "batch=2"]),
    "float length": (lambda k, v: (k, v, [40, 7.5], CFG, 0), ["seq_lens[1]=7.5 is not an int"]),
    "float length tensor": (lambda k, v: (k, v, torch.tensor([40.0, 7.0]), CFG, 0), ["torch.float32 tensor", "int32"]),
    "NaN in K": (lambda k, v: (with_value(k, (1, 6, 1, 3), float("nan")), v, [40, 7], CFG, 0), ["K holds NaN or Inf at sequence 1, token 6", "finite"]),
    "Inf in V": (lambda k, v: (k, with_value(v, (0, 39, 0, 0), float("-inf")), [40, 7], CFG, 0), ["V holds NaN or Inf at sequence 0, token 39"]),
    "beyond fp16": (lambda k, v: (with_value(k, (0, 2, 0, 5), -1e5), v, [40, 7], CFG, 0), ["K holds a value of magnitude", "sequence 0, token 2", "param_dtype='fp32'"]),
    "negative extra pages": (lambda k, v: (k, v, [40, 7], CFG, -1), ["extra_pages=-1", "int >= 0"]),
    "not a config": (lambda k, v: (k, v, [40, 7], {"bits": 4}, 0), ["config is a dict", "QuantConfig"]),
}


@pytest.mark.parametrize("case", list(QUANTIZE_CASES))
def test_quantize_rejects(rng, case):
    build, phrases = QUANTIZE_CASES[case]
    k, v, lens, config, extra = build(*kv(rng))
    with pytest.raises(ValueError) as error:
        quantize(k, v, lens, config, extra_pages=extra)
    assert_one_sentence(error, *phrases)


def test_padding_rows_are_ignored(rng):
    """NaN, Inf and huge values past a sequence's length are padding, not errors."""
    k, v = kv(rng)
    k = with_value(k, (1, 20), float("nan"))
    v = with_value(v, (1, 39), 1e6)
    c = quantize(k, v, [40, 7], CFG)
    assert int(c.seq_lens[1]) == 7


APPEND_CASES = {
    "k_new fp32": (lambda k, v: (k.float(), v), ["k_new has dtype torch.float32"]),
    "k_new batch": (lambda k, v: (k[:1], v), ["k_new has shape (1, 2, 64)", "[batch, num_kv_heads, head_dim]"]),
    "v_new rank 4": (lambda k, v: (k, v[:, None]), ["v_new has shape (2, 1, 2, 64)"]),
    "v_new device": (lambda k, v: (k, v.to("meta")), ["v_new is on meta but the cache is on cpu", "cache.device"]),
    "NaN k_new": (lambda k, v: (with_value(k, (1, 0, 9), float("nan")), v), ["k_new holds NaN or Inf at sequence 1"]),
    "Inf v_new": (lambda k, v: (k, with_value(v, (0, 1, 0), float("inf"))), ["v_new holds NaN or Inf at sequence 0"]),
    "beyond fp16": (lambda k, v: (with_value(k, (0, 0, 0), 7e4), v), ["k_new holds a value of magnitude 7", "param_dtype='fp32'"]),
}


@pytest.mark.parametrize("case", list(APPEND_CASES))
def test_append_rejects_and_writes_nothing(rng, case):
    k, v = kv(rng)
    c = quantize(k, v, [31, 7], CFG, extra_pages=2)  # sequence 0's tail completes on this append
    before = {name: getattr(c, name).clone() for name in CACHE_FIELDS}
    build, phrases = APPEND_CASES[case]
    k_new, v_new = build(k[:, 35], v[:, 35])
    with pytest.raises(ValueError) as error:
        append(c, k_new, v_new)
    assert_one_sentence(error, *phrases)
    for name in CACHE_FIELDS:
        assert torch.equal(getattr(c, name), before[name]), name
    assert c.free_pages == sorted(c.free_pages) and len(c.free_pages) == 2


def test_config_errors_are_sentences():
    for kwargs, phrase in (
        (dict(bits=3), "bits=3"),
        (dict(group_size=48), "group_size=48"),
        (dict(k_mode="row"), "k_mode='row'"),
        (dict(param_dtype="bf16"), "param_dtype='bf16'"),
        (dict(group_size=128, page_size=64), "page_size=64"),
    ):
        with pytest.raises(ValueError) as error:
            QuantConfig(**kwargs)
        assert_one_sentence(error, phrase)


def test_numpy_integer_lengths_are_accepted():
    import numpy as np

    import foscar

    k = torch.randn(2, 100, 1, 128).bfloat16()
    cache = foscar.quantize(k, k.clone(), [np.int64(100), np.int32(50)], foscar.QuantConfig(page_size=128))
    assert cache.seq_lens.tolist() == [100, 50]


def test_bf16_dequantize_rounds_once():
    import foscar

    k = (torch.randn(1, 128, 1, 128) * 20).bfloat16()
    cache = foscar.quantize(k, k.clone(), [128], foscar.QuantConfig(bits=4, page_size=128))
    kf, _ = foscar.dequantize(cache, dtype=torch.float32)
    kb, _ = foscar.dequantize(cache, dtype=torch.bfloat16)
    assert torch.equal(kb, kf.to(torch.bfloat16))
