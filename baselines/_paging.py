"""Helpers the adapters share: paged views of the source K/V, page tables, FP8 and NVFP4
conversion with their exact dequantization (what each backend's reference attends over)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
# The 8 magnitudes an E2M1 (FP4) code stands for; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass
class PageTable:
    """A page table in the two forms kernels take: CSR (indptr/indices/last_page_len,
    FlashInfer) and dense block tables [batch, pages_per_seq] (XQA, TensorRT-LLM)."""

    indptr: torch.Tensor  # int32 [batch + 1]
    indices: torch.Tensor  # int32 [batch * pages_per_seq]
    last_page_len: torch.Tensor  # int32 [batch]
    block_tables: torch.Tensor  # int32 [batch, pages_per_seq]
    seq_lens: torch.Tensor  # int32 [batch]
    pages_per_seq: int
    page_size: int


def page_table(batch: int, kv_len: int, page_size: int, device: Any) -> PageTable:
    """Sequence b owns pages [b * P, (b + 1) * P): the layout of `paged_view` below."""
    pages = -(-kv_len // page_size)
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32, device=device)
    last = torch.full((batch,), kv_len - (pages - 1) * page_size, dtype=torch.int32, device=device)
    return PageTable(
        indptr=indptr,
        indices=indices,
        last_page_len=last,
        block_tables=indices.view(batch, pages),
        seq_lens=torch.full((batch,), kv_len, dtype=torch.int32, device=device),
        pages_per_seq=pages,
        page_size=page_size,
    )


def paged_view(x: torch.Tensor, page_size: int) -> torch.Tensor:
    """[batch, max_len, heads, d] -> [batch * max_len / page, page, heads, d] (NHD pages).
    A view when max_len is a multiple of the page size (no copy, no extra memory); else a
    zero-padded copy."""
    b, n, h, d = x.shape
    if n % page_size:
        pad = page_size - n % page_size
        x = torch.cat([x, x.new_zeros(b, pad, h, d)], dim=1)
        n += pad
    return x.contiguous().view(b * n // page_size, page_size, h, d)


def sample_rows(x: torch.Tensor, idx: Sequence[int]) -> torch.Tensor:
    return x[torch.as_tensor(list(idx), device=x.device, dtype=torch.long)]


# --- FP8 (E4M3) per-tensor ---------------------------------------------------------------
def fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-tensor E4M3: x ~ fp8 * scale with scale = amax / 448. Returns (fp8, scale)."""
    amax = float(x.abs().amax().float().item()) if x.numel() else 0.0
    scale = amax / E4M3_MAX if amax > 0 else 1.0
    out = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    # chunked so a 64 GB cache does not need a float32 copy of itself
    flat_in, flat_out = x.view(x.shape[0], -1), out.view(out.shape[0], -1)
    step = max(1, (1 << 28) // max(1, flat_in.shape[1]))
    for i in range(0, flat_in.shape[0], step):
        flat_out[i : i + step] = (flat_in[i : i + step].float() / scale).to(torch.float8_e4m3fn)
    return out, scale


def fp8_dequantize(x8: torch.Tensor, scale: float) -> torch.Tensor:
    return x8.float() * scale


# --- NVFP4 (E2M1 codes, one E4M3 scale per 16 elements, a per-tensor FP32 scale) ---------
def nvfp4_quantize(x: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor, float]:
    """x [..., d] -> (packed uint8 [..., d/2], block scales fp8 [..., d/16], global scale).

    Two codes a byte, the element with the lower index in the low nibble. A value stands for
    e2m1 * block_scale * global_scale, global_scale = amax / (6 * 448), so block scales use
    the E4M3 range."""
    d = x.shape[-1]
    if d % block:
        raise ValueError(f"head_dim={d} is not a multiple of the NVFP4 block {block}.")
    amax = float(x.abs().amax().float().item()) or 1.0
    return _nvfp4_with_global(x, amax / (E2M1_MAX * E4M3_MAX), block)


def nvfp4_dequantize(packed: torch.Tensor, bscale8: torch.Tensor, g: float, block: int = 16) -> torch.Tensor:
    lo, hi = packed & 0xF, packed >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    values = torch.tensor(E2M1_VALUES, device=packed.device)
    mag = values[(codes & 0x7).long()]
    val = torch.where((codes & 0x8) > 0, -mag, mag)
    d = val.shape[-1]
    val = val.reshape(*val.shape[:-1], d // block, block) * bscale8.float().unsqueeze(-1)
    return val.reshape(*val.shape[:-2], d) * g


def nvfp4_quantize_chunked(x: torch.Tensor, block: int = 16, rows: int = 1 << 16):
    """nvfp4_quantize over the leading dimension in chunks (bounded float32 scratch), with
    one global scale for the whole tensor."""
    amax = float(x.abs().amax().float().item()) or 1.0
    g = amax / (E2M1_MAX * E4M3_MAX)
    d = x.shape[-1]
    packed = torch.empty(*x.shape[:-1], d // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(*x.shape[:-1], d // block, dtype=torch.float8_e4m3fn, device=x.device)
    flat = x.reshape(-1, d)
    pf, sf = packed.view(-1, d // 2), scales.view(-1, d // block)
    for i in range(0, flat.shape[0], rows):
        # scale the chunk so its own quantizer picks the shared global scale
        chunk = flat[i : i + rows]
        p, s, _ = _nvfp4_with_global(chunk, g, block)
        pf[i : i + rows], sf[i : i + rows] = p, s
    return packed, scales, g


def _nvfp4_with_global(x: torch.Tensor, g: float, block: int):
    d = x.shape[-1]
    xf = x.float().reshape(*x.shape[:-1], d // block, block) / g
    bscale8 = (xf.abs().amax(-1, keepdim=True) / E2M1_MAX).clamp(min=2.0**-9).to(torch.float8_e4m3fn)
    y = xf / bscale8.float()
    values = torch.tensor(E2M1_VALUES, device=x.device)
    mag = (y.abs().unsqueeze(-1) - values).abs().argmin(-1).to(torch.uint8)
    codes = (mag | ((y < 0).to(torch.uint8) << 3)).reshape(*x.shape[:-1], d)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous(), bscale8.squeeze(-1), g


_WORKSPACES: dict[tuple[str, int], Any] = {}


def shared_workspace(device: Any, nbytes: int) -> torch.Tensor:
    """One zeroed uint8 scratch buffer per device and size, shared by every prepared copy:
    copies run one after another, never at once, so their split-KV scratch can be one."""
    key = (str(device), nbytes)
    buf = _WORKSPACES.get(key)
    if buf is None:
        buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        _WORKSPACES[key] = buf
    return buf
