"""The quantized paged KV cache (docs/FORMAT.md): quantize BF16 K/V, dequantize, append."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from foscar.config import QuantConfig


@dataclass
class QuantizedKVCache:
    """A paged, group-quantized KV cache of one layer, for a batch of sequences.

    Shapes (docs/FORMAT.md): codes [num_pages, num_kv_heads, page_size // 16, words_per_tile]
    int32; params [num_pages, num_kv_heads, page_size * head_dim // group_size, 2];
    page_table [batch, max_pages_per_seq] int32; seq_lens [batch] int32 (tail included);
    tails [batch, num_kv_heads, group_size, head_dim] bf16.
    """

    config: QuantConfig
    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_params: torch.Tensor
    v_params: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    k_tail: torch.Tensor
    v_tail: torch.Tensor
    num_kv_heads: int
    head_dim: int
