"""Seeded synthetic decode inputs (Q, K, V) for accuracy studies, the same on every machine.

numpy's PCG64 draws the values (its stream is stable across versions and platforms, unlike
a framework's device generator), so a CPU model and a GPU run see bit-identical BF16 inputs.
Distributions:
  gauss     standard normal Q, K and V (the sweep's data);
  outliers  real-model-like: a few K channels 8-20x larger, V tokens now and then 6x larger
            (attention sinks, rare large activations), Q standard normal.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DISTRIBUTIONS = ("gauss", "outliers")


@dataclass(frozen=True)
class DecodeInputs:
    q: torch.Tensor  # bf16 [batch, num_q_heads, head_dim]
    k: torch.Tensor  # bf16 [batch, max_len, num_kv_heads, head_dim]
    v: torch.Tensor
    seq_lens: list[int]


def make_inputs(batch: int, kv_len: int, num_q_heads: int = 32, num_kv_heads: int = 8, head_dim: int = 128,
                seed: int = 0, distribution: str = "gauss") -> DecodeInputs:
    """CPU BF16 tensors; every sequence `kv_len` tokens long."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution={distribution!r} is not known; expected one of {DISTRIBUTIONS}.")
    rng = np.random.default_rng(seed)
    shape = (batch, kv_len, num_kv_heads, head_dim)
    q = rng.standard_normal((batch, num_q_heads, head_dim), dtype=np.float32)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = rng.standard_normal(shape, dtype=np.float32)
    if distribution == "outliers":
        channels = rng.choice(head_dim, size=max(1, head_dim // 32), replace=False)
        k[..., channels] *= rng.uniform(8.0, 20.0, size=len(channels)).astype(np.float32)
        loud = rng.random((batch, kv_len, num_kv_heads, 1)) < 0.01
        v = np.where(loud, 6.0 * v, v)
    bf16 = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)  # noqa: E731
    return DecodeInputs(q=bf16(q), k=bf16(k), v=bf16(v), seq_lens=[kv_len] * batch)
