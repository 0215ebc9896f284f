"""Our own kernels as backends: FOSCAR's folded decode (`variant="fold"`) and the plain
"dequantize in registers, then MMA" kernel (`variant="dequant"`), INT4 and INT2.

The cache comes from `foscar.quantize` (docs/FORMAT.md); the reference attends over
`foscar.dequantize` of that same cache, so quantization error is not the kernel's error.
foscar.kernels is imported lazily: without a built extension these are `compile_error` or
`unsupported` records, never a dead sweep.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

from baselines.base import Backend, CompileError, GpuInfo, Prepared, SourceKV, Unsupported, register
from suite.bytes_model import traffic_for
from suite.cases import Case


def _api():
    """(quantize, dequantize, decode, QuantConfig) from foscar, top level or submodules."""
    try:
        import foscar
        from foscar.config import QuantConfig
    except Exception as exc:  # noqa: BLE001
        raise Unsupported(f"the foscar package does not import: {type(exc).__name__}: {exc}") from exc
    fns = {}
    for name, sub in (("quantize", "cache"), ("dequantize", "cache"), ("decode", "kernels")):
        fn = getattr(foscar, name, None)
        if fn is None:
            try:
                fn = getattr(importlib.import_module(f"foscar.{sub}"), name, None)
            except Exception:  # noqa: BLE001
                fn = None
        fns[name] = fn
    missing = [n for n, f in fns.items() if f is None]
    if missing:
        raise Unsupported(f"foscar has no {', '.join(missing)} yet.")
    return fns["quantize"], fns["dequantize"], fns["decode"], QuantConfig


def quant_config(case: Case):
    QuantConfig = _api()[3]
    return QuantConfig(
        bits=case.bits, group_size=case.group_size, k_mode=case.k_mode, v_mode=case.v_mode,
        page_size=case.page_size,
    )


def kernel_unsupported_reason(
    case: Case, config: Any, gpu: GpuInfo | None, variant: str = "fold"
) -> str | None:
    """foscar.kernels.unsupported_reason(...) if the kernel module offers it. Its exact
    signature belongs to the kernel module, so arguments are passed by the names it takes."""
    try:
        from foscar import kernels
    except Exception:  # noqa: BLE001 - not built yet: prepare will say why
        return None
    fn = getattr(kernels, "unsupported_reason", None)
    if fn is None:
        return None
    offered = {
        "q_shape": (case.batch, case.num_q_heads, case.head_dim),
        "batch": case.batch,
        "num_q_heads": case.num_q_heads,
        "num_kv_heads": case.num_kv_heads,
        "head_dim": case.head_dim,
        "kv_len": case.kv_len,
        "max_kv_len": case.kv_len,
        "config": config,
        "cfg": config,
        "gpu": gpu,
        "capability": gpu.capability if gpu else None,
        "variant": variant,
        "device": _torch_device(gpu),
    }
    try:
        params = inspect.signature(fn).parameters
        kwargs = {k: v for k, v in offered.items() if k in params}
        return fn(**kwargs)
    except Exception as exc:  # noqa: BLE001 - supports() must answer, never raise
        return f"foscar.kernels.unsupported_reason failed: {type(exc).__name__}: {exc}"


def _torch_device(gpu: GpuInfo | None):
    """The CUDA device the case runs on (None off-GPU: the kernels then skip arch checks)."""
    if gpu is None or not gpu.sm:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", gpu.index)


class _Foscar(Backend):
    family = "foscar"
    quantized = True
    tolerance = 4e-3  # FOSCAR.md section 8: bf16-rounding level against float64
    kv_format = "int"
    variant = "fold"
    operand = "bf16"  # Tensor Core operand type (foscar.kernels.OPERANDS)

    def available(self) -> str | None:
        try:
            _api()
        except Unsupported as exc:
            return str(exc)
        return None

    def supports(self, case: Case, gpu: GpuInfo | None) -> str | None:
        reason = self.available()
        if reason:
            return reason
        try:
            config = quant_config(case)
            config.check_head_dim(case.head_dim)
        except ValueError as exc:
            return str(exc)
        return kernel_unsupported_reason(case, config, gpu, self.variant)

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        import torch

        quantize, dequantize, decode, _ = _api()
        try:
            from foscar import kernels

            if hasattr(kernels, "load_library"):
                kernels.load_library()  # builds libfoscar.so on first use
        except Exception as exc:  # noqa: BLE001
            raise CompileError(
                f"foscar's kernels did not build or load ({type(exc).__name__}: {exc}); "
                "run `foscar-bench build` on the GPU machine to see nvcc's output."
            ) from exc
        config = quant_config(case)
        cache = quantize(source.k, source.v, source.seq_lens, config)
        q = source.q
        out = torch.empty_like(q)
        variant, operand = self.variant, self.operand

        def run():
            return decode(q, cache, sm_scale=source.sm_scale, out=out, variant=variant, operand=operand)

        def reference_kv(idx):
            return dequantize(cache, batch_indices=list(idx), dtype=torch.float32)

        return Prepared(
            run=run, reference_kv=reference_kv, bytes=traffic_for(self, case).total, out=out,
            notes=f"foscar variant={variant} operand={operand}", keepalive=[cache],
        )


@register
class FoscarInt4(_Foscar):
    name = "foscar-int4"
    bits = 4
    description = "FOSCAR folded decode, INT4 KV (ours)"


@register
class FoscarInt2(_Foscar):
    name = "foscar-int2"
    bits = 2
    description = "FOSCAR folded decode, INT2 KV (ours)"


@register
class FoscarDequantInt4(_Foscar):
    name = "foscar-dequant-int4"
    bits = 4
    variant = "dequant"
    description = "our dequantize-then-MMA decode, INT4 KV (the unfolded baseline)"


@register
class FoscarDequantInt2(_Foscar):
    name = "foscar-dequant-int2"
    bits = 2
    variant = "dequant"
    description = "our dequantize-then-MMA decode, INT2 KV (the unfolded baseline)"


# fp16 operands (v2): fewer shifts per code, but measured wrong at batch 128 x 32K on the
# H200 (docs/PERFORMANCE.md); swept under their own names so their records never mix with
# the default kernel's.
@register
class FoscarInt4Fp16(FoscarInt4):
    name = "foscar-int4-fp16"
    operand = "fp16"
    description = "FOSCAR folded decode, INT4 KV, fp16 operands (experimental)"


@register
class FoscarInt2Fp16(FoscarInt2):
    name = "foscar-int2-fp16"
    operand = "fp16"
    description = "FOSCAR folded decode, INT2 KV, fp16 operands (experimental)"


@register
class FoscarDequantInt4Fp16(FoscarDequantInt4):
    name = "foscar-dequant-int4-fp16"
    operand = "fp16"
    description = "our dequantize-then-MMA decode, INT4 KV, fp16 operands (experimental)"


@register
class FoscarDequantInt2Fp16(FoscarDequantInt2):
    name = "foscar-dequant-int2-fp16"
    operand = "fp16"
    description = "our dequantize-then-MMA decode, INT2 KV, fp16 operands (experimental)"
