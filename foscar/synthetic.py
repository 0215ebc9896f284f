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
                seed: int = 0, distribution: str = "gauss", keep_sequences: int | None = None,
                keep_kv_heads: int | None = None) -> DecodeInputs:
    """CPU BF16 tensors; every sequence `kv_len` tokens long.

    keep_sequences / keep_kv_heads: return only the first sequences (Q, K and V) and the first KV
    heads (K and V; Q keeps every head), the values those slices of the whole set hold. The whole
    stream is still drawn (a value's place in it depends on every draw before it), a slice of
    rows at a time, so that a long context's 8 heads never sit in memory at once for a caller
    that models two of them."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution={distribution!r} is not known; expected one of {DISTRIBUTIONS}.")
    n_seq = batch if keep_sequences is None else keep_sequences
    n_kv = num_kv_heads if keep_kv_heads is None else keep_kv_heads
    if not (1 <= n_seq <= batch and 1 <= n_kv <= num_kv_heads):
        raise ValueError(f"keep_sequences={keep_sequences}, keep_kv_heads={keep_kv_heads}: expected 1 to "
                         f"batch={batch} and 1 to num_kv_heads={num_kv_heads}.")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, num_q_heads, head_dim), dtype=np.float32)[:n_seq]
    k = _normal_rows(rng, batch, kv_len, num_kv_heads, head_dim, n_seq, n_kv)
    v = _normal_rows(rng, batch, kv_len, num_kv_heads, head_dim, n_seq, n_kv)
    if distribution == "outliers":
        channels = rng.choice(head_dim, size=max(1, head_dim // 32), replace=False)
        k[..., channels] *= rng.uniform(8.0, 20.0, size=len(channels)).astype(np.float32)
        loud = _kept_rows(lambda rows: rng.random((rows, num_kv_heads, 1)), batch, kv_len, n_seq, n_kv, 1,
                          np.float64) < 0.01
        v = np.where(loud, 6.0 * v, v)
    bf16 = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)  # noqa: E731
    return DecodeInputs(q=bf16(q), k=bf16(k), v=bf16(v), seq_lens=[kv_len] * n_seq)


# Rows (tokens of all heads) drawn per call by _kept_rows: the draws are the same in one call or many.
_DRAW_ROWS = 4096


def _normal_rows(rng, batch, kv_len, heads, dim, n_seq, n_kv) -> np.ndarray:
    """rng.standard_normal((batch, kv_len, heads, dim), float32)[:n_seq, :, :n_kv], drawn in slices."""
    return _kept_rows(lambda rows: rng.standard_normal((rows, heads, dim), dtype=np.float32), batch, kv_len, n_seq,
                      n_kv, dim, np.float32)


def _kept_rows(draw, batch, kv_len, n_seq, n_kv, width, dtype) -> np.ndarray:
    """draw(rows) -> [rows, heads, width] for consecutive (sequence, token) rows of the stream; the
    first n_seq sequences' rows, heads :n_kv, as [n_seq, kv_len, n_kv, width]. The rows past
    n_seq are drawn too (in slices), so that the stream ends where one whole draw would."""
    out = np.empty((n_seq * kv_len, n_kv, width), dtype=dtype)
    kept, total = n_seq * kv_len, batch * kv_len
    for r0 in range(0, total, _DRAW_ROWS):
        rows = min(_DRAW_ROWS, total - r0)
        x = draw(rows)
        if r0 < kept:
            out[r0 : min(r0 + rows, kept)] = x[: min(rows, kept - r0), :n_kv]
    return out.reshape(n_seq, kv_len, n_kv, width)
