"""`torch-ref`: plain PyTorch attention over the dequantized cache. Slow, and there for
correctness: it shows what "dequantize, then attend" gives with nothing clever."""
from __future__ import annotations

from baselines.base import Backend, GpuInfo, Prepared, SourceKV, Unsupported, register
from baselines.foscar import TOLERANCE, _foscar, quant_config
from core.case import Case


def _foscar_api():
    foscar = _foscar()
    return foscar.quantize, foscar.dequantize, foscar.QuantConfig


@register
class TorchRef(Backend):
    name = "torch-ref"
    family = "torch"
    bits = 0  # follows the case's int bits
    quantized = True
    tolerance = TOLERANCE  # float32 math over the BF16-stored cache; BF16 output rounding
    needs_cuda = False
    kv_format = "bf16"  # what it reads per step: the dequantized cache, in BF16
    description = "plain torch float32 attention over foscar's dequantized cache stored in BF16"

    def available(self) -> str | None:
        try:
            _foscar_api()
        except Unsupported as exc:
            return str(exc)
        return None

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        """What foscar's quantizer refuses (bits, group, modes, page, head size), as the
        foscar backends say it: such a case is `unsupported`, not a crash in `prepare`."""
        try:
            quant_config(case).check_head_dim(case.head_dim)
        except (ValueError, Unsupported) as exc:
            return str(exc)
        return None

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        import torch

        quantize, dequantize, QuantConfig = _foscar_api()
        cfg = QuantConfig(
            bits=case.bits, group_size=case.group_size, k_mode=case.k_mode,
            v_mode=case.v_mode, page_size=case.page_size,
        )
        cache = quantize(source.k, source.v, source.seq_lens, cfg)
        k, v = dequantize(cache, dtype=torch.bfloat16)  # [batch, max_len, hkv, d]
        del cache
        # SDPA wants heads before tokens; GQA by expanding the KV heads to the query heads.
        kh = k.transpose(1, 2).contiguous()
        vh = v.transpose(1, 2).contiguous()
        del k, v
        # Query heads grouped under their KV head: one batched matmul per product, no
        # expanded copy of K or V. Float32 throughout, a few sequences at a time so the
        # float32 copies stay small.
        g = case.gqa_ratio
        qg = source.q.view(case.batch, case.num_kv_heads, g, case.head_dim)
        lens = source.seq_lens
        mask = None
        if not bool((lens == kh.shape[2]).all()):
            pos = torch.arange(kh.shape[2], device=kh.device)
            mask = (pos[None, :] < lens[:, None]).view(case.batch, 1, 1, -1)
        out = torch.empty_like(source.q)
        out_g = out.view(case.batch, case.num_kv_heads, g, case.head_dim)
        per_chunk = max(1, (1 << 28) // max(1, case.num_kv_heads * kh.shape[2] * case.head_dim))

        def run():
            for s0 in range(0, case.batch, per_chunk):
                sl = slice(s0, s0 + per_chunk)
                scores = torch.matmul(qg[sl].float(), kh[sl].float().transpose(-1, -2)) * source.sm_scale
                if mask is not None:
                    scores = scores.masked_fill(~mask[sl], float("-inf"))
                out_g[sl] = torch.matmul(torch.softmax(scores, dim=-1), vh[sl].float())
            return out

        def reference_kv(idx):
            ii = torch.as_tensor(list(idx), device=kh.device)
            return kh[ii].transpose(1, 2), vh[ii].transpose(1, 2)

        return Prepared(run=run, reference_kv=reference_kv, out=out, inputs=[qg, kh, vh, mask])
