"""The kernel tests' seeded cases, shared by tests/foscar/test_kernels_gpu.py,
tests/foscar/test_kernels_emu.py and scripts/probe_race.py, so that a script that replays a
test's case draws exactly the test's inputs.

Unlike foscar.synthetic (the sweep's data, numpy's stream, the same on every machine), these draw
with torch's generator on the device they run on: a case is reproducible on one kind of device,
which is what a test id and its printed seed need.
"""
from __future__ import annotations

import random

import torch

from foscar.cache import QuantizedKVCache, quantize
from foscar.config import QuantConfig


def gpu_case(bits: int, group: int, k_mode: str, v_mode: str, seed: int, *, batch: int | None = None,
             ratio: int | None = None) -> tuple[QuantConfig, list[int], int, int]:
    """test_kernels_gpu's shape drawn from `seed`: (config, lens, num_kv_heads, ratio), lengths
    that are not multiples of the group or page size, unequal within the batch."""
    rng = random.Random(seed)
    batch = batch or rng.choice([1, 2, 3, 5])
    ratio = ratio or rng.choice([1, 4, 8])
    num_kv_heads = rng.choice([1, 2, 8]) if ratio < 8 else rng.choice([1, 2])
    page = rng.choice([p for p in (64, 128, 256) if p % group == 0])
    lens = [rng.randrange(1, 3 * page + group + 37) for _ in range(batch)]
    config = QuantConfig(bits=bits, group_size=group, k_mode=k_mode, v_mode=v_mode, page_size=page)
    return config, lens, num_kv_heads, ratio


def case_inputs(config: QuantConfig, lens: list[int], num_kv_heads: int, ratio: int, seed: int, *,
                device: str = "cpu", shuffle: bool = True) -> tuple[torch.Tensor, QuantizedKVCache]:
    """(q, cache) on `device`, drawn from `seed`: Gaussian K, V and Q in bf16, head_dim 128, the
    keys with per-channel outliers (as real keys have, so that channel-wise groups matter)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    batch, dim, max_len = len(lens), 128, max(lens)
    k = torch.randn(batch, max_len, num_kv_heads, dim, device=device, generator=gen).to(torch.bfloat16)
    v = torch.randn(batch, max_len, num_kv_heads, dim, device=device, generator=gen).to(torch.bfloat16)
    k = k * (1 + 4 * torch.rand(dim, device=device, generator=gen)).to(torch.bfloat16)
    q = torch.randn(batch, num_kv_heads * ratio, dim, device=device, generator=gen).to(torch.bfloat16)
    return q, quantize(k, v, lens, config, shuffle_pages=shuffle, seed=seed)
