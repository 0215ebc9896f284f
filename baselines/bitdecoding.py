"""BitDecoding (github.com/DD-DuDa/BitDecoding, package `bit_decode`): fused INT4/INT2 decode
attention over its own packed KV cache. FP16 only, head_dim 128, K channel-wise
("k-channel"), V token-wise, group size 128 or 32. Its packing comes only from its own
`kvcache_pack_int`; `fwd_kvcache_int` runs one decode step. The buffers and the call are
those of its own test (evaluation/test.py at e829b5a); baselines/README.md has what we
read of its quantizer and what its error says.

It is on no package index. Without it both backends are `unsupported` with the build line.
The reference attends over an emulation of its quantizer (emulate_quant): its packed
layout is private to its kernels, so we do not unpack it.
"""
from __future__ import annotations

import inspect
from typing import Any

from baselines.base import Backend, GpuInfo, Prepared, SourceKV, Unsupported, register
from core.case import Case

BUILD_HINT = (
    "bit_decode is not importable; build BitDecoding from source on the GPU machine: "
    "`git clone --recursive https://github.com/DD-DuDa/BitDecoding .bitdecoding && "
    "python scripts/bitdecoding_build.py` (sm_90 only, about 2.5 minutes on an H200), then put "
    "the two folders it prints on PYTHONPATH"
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
    """BitDecoding's quantize-dequantize of x [b, s, h, d] (fp16 values), as its pack and
    decode kernels do it (csrc/bit_decode/src/include/qpack.h, dequantize.h):

    - groups of `group` along tokens (axis='token': K channel-wise) or along channels
      (axis='channel': V token-wise); per group lo = min, range = max - min (fp32);
    - codes from the fp32 inverse scale: clamp(roundf((x - lo) * levels / range), 0, levels),
      roundf rounding halves away from zero; a flat group (range 0) gets code 0;
    - scale (1 / inverse scale) and lo are stored as fp16 (recast to half2);
    - dequantized in fp16 with one rounding: fp16(code * scale + lo) (__hfma2).

    Codes come from the unrounded fp32 scale, values from the fp16-rounded one: rounding
    the scale first, as a plain min-max emulation would, moves about 0.1% of the codes, which
    at INT4 alone gives 2e-2 of relative output error on random data (baselines/README.md).
    """
    import torch

    b, s, h, d = x.shape
    xf = x.float()
    if axis == "token":
        g = xf.view(b, s // group, group, h, d)
        lo, hi = g.amin(2, keepdim=True), g.amax(2, keepdim=True)
    else:
        g = xf.view(b, s, h, d // group, group)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    levels = float((1 << bits) - 1)
    span = hi - lo
    inv = torch.where(span > 0, levels / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(span))
    v = ((g - lo) * inv).double()  # an fp32 product, rounded below exactly as roundf would
    codes = torch.clamp(torch.floor(v) + ((v - torch.floor(v)) >= 0.5).double(), 0, levels)
    scale = torch.where(inv > 0, 1.0 / torch.where(inv > 0, inv, torch.ones_like(inv)), torch.zeros_like(inv))
    deq = codes * scale.half().double() + lo.half().double()
    return deq.half().float().view(b, s, h, d)


class _BitDecoding(Backend):
    family = "bitdecoding"
    third_party = True
    quantized = True
    tolerance = 3e-2  # fp16 kernel (fp16 P and dequantized K/V) against its emulated quantizer
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
            notes="reference: BitDecoding's quantizer emulated (fp32 codes, fp16 scale and offset)",
            keepalive=[k_pack, k_params, v_pack, v_params, q],
            inputs=[q, k_pack, k_params, v_pack, v_params],
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
