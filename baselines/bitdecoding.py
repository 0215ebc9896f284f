"""BitDecoding (OpenBitSys/BitDecoding, package `bit_decode`): fused INT4/INT2 decode
attention over its own packed KV cache. FP16 only, head_dim 128, K channel-wise
("k-channel"), V token-wise, group size 128 or 32. Its packing comes only from its own
`kvcache_pack_int`; `fwd_kvcache_int` runs one decode step.

It is on no package index. Without it both backends are `unsupported` with the build line.
The reference attends over an emulation of its quantization (asymmetric min/max per group,
FP16 scale and offset): its packed layout is private to its kernels, so we do not unpack it.
"""
from __future__ import annotations

import inspect
from typing import Any

from baselines.base import Backend, GpuInfo, Prepared, SourceKV, Unsupported, register
from core.case import Case

BUILD_HINT = (
    "bit_decode is not importable; build BitDecoding from source on the GPU machine: "
    "`git clone https://github.com/OpenBitSys/BitDecoding && cd BitDecoding && "
    "pip install --no-build-isolation -v .` (about 3 minutes on an H200)"
)
GROUP_SIZES = (32, 128)


def _bit_decode():
    try:
        import bit_decode
    except Exception as exc:  # noqa: BLE001
        raise Unsupported(f"{BUILD_HINT} [{type(exc).__name__}: {exc}]") from exc
    for fn in ("kvcache_pack_int", "fwd_kvcache_int"):
        if not hasattr(bit_decode, fn):
            raise Unsupported(f"bit_decode has no {fn}; this adapter expects BitDecoding's Python API.")
    return bit_decode


def emulate_quant(x: Any, bits: int, group: int, axis: str) -> Any:
    """Asymmetric min/max quantize-dequantize of x [b, s, h, d] (float), groups of `group`
    along tokens (axis='token': K channel-wise) or channels (axis='channel': V token-wise),
    scale and offset rounded to fp16 first."""
    import torch

    b, s, h, d = x.shape
    xf = x.float()
    if axis == "token":
        g = xf.view(b, s // group, group, h, d)
        lo, hi = g.amin(2, keepdim=True), g.amax(2, keepdim=True)
    else:
        g = xf.view(b, s, h, d // group, group)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    levels = (1 << bits) - 1
    scale = ((hi - lo) / levels).half().float()
    zero = lo.half().float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.clamp(torch.round((g - zero) / safe), 0, levels)
    return (codes * scale + zero).view(b, s, h, d)


class _BitDecoding(Backend):
    family = "bitdecoding"
    quantized = True
    tolerance = 3e-2  # fp16 kernel; the reference only emulates its quantizer (see above)
    kv_format = "int"

    def available(self) -> str | None:
        try:
            _bit_decode()
        except Unsupported as exc:
            return str(exc)
        return None

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        if case.head_dim != 128:
            return f"BitDecoding is built for head_dim 128 only; this case has {case.head_dim}."
        if case.k_mode != "channel" or case.v_mode != "token":
            return (
                f"BitDecoding quantizes K channel-wise and V token-wise ('k-channel'); this case "
                f"asks for K {case.k_mode}-wise, V {case.v_mode}-wise."
            )
        if case.group_size not in GROUP_SIZES:
            return f"BitDecoding takes group size 128 or 32; this case has {case.group_size}."
        if case.kv_len % 128:
            return f"kv_len={case.kv_len} is not a multiple of 128, which its packed-only path needs."
        if gpu is not None and gpu.sm and gpu.sm < 80:
            return f"BitDecoding needs sm_80 or newer; this GPU is sm_{gpu.sm}."
        return None

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        import torch

        bd = _bit_decode()
        b, hkv, d, g, bits = case.batch, case.num_kv_heads, case.head_dim, case.group_size, self.bits
        s = case.kv_len
        if source.max_len != s:
            raise Unsupported("BitDecoding's adapter needs every sequence at the same length.")
        dev = source.q.device
        k16, v16 = source.k.half(), source.v.half()
        pack_nums = 16 // bits
        k_pack = torch.zeros(b, s // pack_nums, hkv, d, dtype=torch.uint16, device=dev)
        k_params = torch.zeros(b, s // g, hkv, d, dtype=torch.float32, device=dev)
        v_pack = torch.zeros(b, s, hkv, d // pack_nums, dtype=torch.uint16, device=dev)
        v_params = torch.zeros(b, d // g, hkv, s, dtype=torch.float32, device=dev)
        cu_seqlens_k = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=dev)
        bd.kvcache_pack_int(
            k16, k_pack, k_params, v16, v_pack, v_params,
            None, cu_seqlens_k, s, "k-channel", g, bits,
        )
        del k16, v16
        q = source.q.half().unsqueeze(1).contiguous()  # [b, 1, hq, d]
        kwargs = _fwd_kwargs(bd.fwd_kvcache_int, q, k_pack, k_params, v_pack, v_params,
                             source.sm_scale, g, bits)

        def run():
            out = bd.fwd_kvcache_int(**kwargs)
            if isinstance(out, (tuple, list)):
                out = out[0]
            return out.squeeze(1)

        def reference_kv(idx):
            ii = torch.as_tensor(list(idx), device=dev)
            k = source.k.index_select(0, ii).half()
            v = source.v.index_select(0, ii).half()
            return emulate_quant(k, bits, g, "token"), emulate_quant(v, bits, g, "channel")

        return Prepared(
            run=run,
            reference_kv=reference_kv,
            out=None,
            notes="reference: emulated min/max quantization (fp16 scale/offset)",
            keepalive=[k_pack, k_params, v_pack, v_params, q],
        )


def _fwd_kwargs(fn, q, k_pack, k_params, v_pack, v_params, sm_scale, group, bits) -> dict:
    """Keyword arguments for fwd_kvcache_int, whichever of its published signatures it has."""
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {}
    names = list(params)
    for name, value in zip(names[:5], (q, k_pack, k_params, v_pack, v_params)):
        kw[name] = value
    for name in ("block_table", "opt_block_table"):
        if name in params:
            kw[name] = None
    kw.update(softmax_scale=sm_scale, quant_mode="k-channel", group_size=group, num_bits=bits)
    unknown = [k for k in kw if k not in params]
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise Unsupported(
            f"bit_decode.fwd_kvcache_int{inspect.signature(fn)} lacks {unknown}; this adapter "
            "expects (q, k_pack, k_params, v_pack, v_params, block_table, softmax_scale, "
            "quant_mode, group_size, num_bits)."
        )
    return kw


@register
class BitDecodingInt4(_BitDecoding):
    name = "bitdecoding-int4"
    bits = 4
    description = "BitDecoding INT4 (fp16, K channel-wise, V token-wise), its own packing"


@register
class BitDecodingInt2(_BitDecoding):
    name = "bitdecoding-int2"
    bits = 2
    description = "BitDecoding INT2 (fp16, K channel-wise, V token-wise), its own packing"
