"""quantize / dequantize / append / the folded reference on CUDA give the CPU's bytes (GPU only)."""
from __future__ import annotations

import pytest
import torch

from foscar.cache import append, dequantize, quantize
from foscar.config import QuantConfig
from foscar.reference import folded_attention_f64

pytestmark = pytest.mark.gpu

MODE_PAIRS = [("token", "token"), ("token", "channel"), ("channel", "token"), ("channel", "channel")]
FIELDS = ("k_codes", "v_codes", "k_params", "v_params", "page_table", "seq_lens", "tail_lens", "k_tail", "v_tail")


@pytest.mark.parametrize("k_mode, v_mode", MODE_PAIRS)
@pytest.mark.parametrize("bits", [2, 4])
def test_cuda_matches_cpu(rng, bits, k_mode, v_mode):
    cfg = QuantConfig(bits=bits, group_size=64, k_mode=k_mode, v_mode=v_mode, page_size=128)
    k = torch.randn(5, 700, 2, 128, generator=rng).bfloat16()
    v = torch.randn(5, 700, 2, 128, generator=rng).bfloat16()
    q = torch.randn(5, 8, 128, generator=rng).bfloat16()
    lens = [700, 1, 64, 300, 129]
    on_cpu = quantize(k, v, lens, cfg, extra_pages=10, shuffle_pages=True)
    on_gpu = quantize(k.cuda(), v.cuda(), lens, cfg, extra_pages=10, shuffle_pages=True)
    for name in FIELDS:
        assert torch.equal(getattr(on_cpu, name), getattr(on_gpu, name).cpu()), name
    for a, b in zip(dequantize(on_cpu, dtype=torch.float64), dequantize(on_gpu, dtype=torch.float64)):
        assert torch.equal(a, b.cpu())
    ref_cpu, ref_gpu = folded_attention_f64(q, on_cpu), folded_attention_f64(q.cuda(), on_gpu).cpu()
    assert float((ref_cpu - ref_gpu).norm() / ref_cpu.norm()) < 1e-13
    for _ in range(70):  # through a tail completion and a page boundary
        k_new = torch.randn(5, 2, 128, generator=rng).bfloat16()
        v_new = torch.randn(5, 2, 128, generator=rng).bfloat16()
        append(on_cpu, k_new, v_new)
        append(on_gpu, k_new.cuda(), v_new.cuda())
    for name in FIELDS:
        assert torch.equal(getattr(on_cpu, name), getattr(on_gpu, name).cpu()), name
