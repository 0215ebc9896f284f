"""TensorRT-LLM's decode kernels, called without building an engine.

`trtllm-xqa-fp8` is XQA, the decode kernel family TensorRT-LLM runs for generation on
Hopper, reached through FlashInfer's port (`flashinfer.decode.xqa_batch_decode_with_kv_cache`),
over an FP8 E4M3 paged KV cache (NHD pages, per-tensor scales). Its Hopper FP8 path also
rounds Q and the softmax probabilities P to FP8 before the tensor-core products, so its
error against a float64 reference over the same FP8 cache is a few percent on random data
(FOSCAR.md section 7 saw 3.8%); its tolerance says so.

`trtllm-nvfp4`: TensorRT-LLM's NVFP4 KV-cache attention runs on trtllm-gen kernels for
Blackwell only. It is listed so that the Hopper tables say so: it is `unsupported`, with
that reason, wherever the suite runs (it carries no adapter for those kernels).
"""
from __future__ import annotations

import inspect

from baselines._paging import (
    fp8_dequantize,
    fp8_quantize,
    page_table,
    paged_view,
    sample_rows,
    shared_workspace,
)
from baselines.base import Backend, GpuInfo, Prepared, SourceKV, Unsupported, has_module, register
from baselines.flashinfer_decode import INSTALL_HINT, call_with_supported, flashinfer_version
from core.case import Case

WORKSPACE_BYTES = 256 * 1024 * 1024  # XQA keeps 8 MB of semaphores at the front
XQA_SEMAPHORE_BYTES = 8 << 20


def _xqa_fn():
    try:
        from flashinfer.decode import xqa_batch_decode_with_kv_cache
    except Exception as exc:  # noqa: BLE001
        raise Unsupported(
            f"flashinfer {flashinfer_version()} has no flashinfer.decode.xqa_batch_decode_with_kv_cache "
            f"({type(exc).__name__}); XQA's port needs a recent FlashInfer (0.5 or newer)."
        ) from exc
    return xqa_batch_decode_with_kv_cache


@register
class TrtllmXqaFP8(Backend):
    name = "trtllm-xqa-fp8"
    family = "trtllm"
    third_party = True
    bits = 8
    kv_format = "fp8"
    # Q and P are rounded to E4M3 inside the kernel (see the module docstring).
    tolerance = 8e-2
    description = (
        "TensorRT-LLM XQA decode (FlashInfer's port), FP8 E4M3 KV; the Hopper FP8 path also "
        "rounds Q and P to FP8"
    )
    page_sizes = (16, 32, 64, 128)

    def available(self) -> str | None:
        if not has_module("flashinfer"):
            return INSTALL_HINT + "."
        try:
            _xqa_fn()
        except Unsupported as exc:
            return str(exc)
        return None

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        if case.head_dim not in (64, 128, 256):
            return f"head_dim={case.head_dim} is not built into XQA; expected 64, 128 or 256."
        if case.page_size not in self.page_sizes:
            return f"page_size={case.page_size} is not one XQA takes; expected one of {self.page_sizes}."
        if gpu is not None and gpu.sm and gpu.sm < 89:
            return f"XQA's FP8 KV path needs sm_89 or newer; this GPU is sm_{gpu.sm}."
        return None

    def memory_bytes(self, case: Case) -> int:
        return WORKSPACE_BYTES + self.traffic(case).total

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        import torch

        xqa = _xqa_fn()
        dev = source.q.device
        k8, ks = fp8_quantize(source.k)
        v8, vs = fp8_quantize(source.v)
        kp, vp = paged_view(k8, case.page_size), paged_view(v8, case.page_size)
        pt = page_table(case.batch, source.max_len, case.page_size, dev)
        seq_lens = source.seq_lens.to(torch.int32).contiguous()
        workspace = shared_workspace(dev, WORKSPACE_BYTES)
        # XQA keeps semaphores at the start of its workspace and needs them zero at first
        # use; FlashInfer's decode, which shares this buffer, leaves partial results there.
        workspace[:XQA_SEMAPHORE_BYTES].zero_()
        out = torch.empty_like(source.q)
        q = source.q
        max_len = int(source.seq_lens.max())
        kwargs = dict(
            query=q,
            kv_cache=(kp, vp),
            workspace_buffer=workspace,
            block_tables=pt.block_tables,
            seq_lens=seq_lens,
            max_seq_len=max_len,
            bmm1_scale=source.sm_scale * ks,  # softmax scale times K's dequantization scale
            bmm2_scale=vs,  # V's dequantization scale
            out=out,
            kv_layout="NHD",
        )
        params = inspect.signature(xqa).parameters
        missing = [p for p in ("query", "kv_cache", "block_tables", "seq_lens") if p not in params]
        if missing:
            raise Unsupported(
                f"flashinfer {flashinfer_version()}'s xqa_batch_decode_with_kv_cache has an unknown "
                f"signature (no {missing}): {inspect.signature(xqa)}"
            )

        def run():
            return call_with_supported(xqa, **kwargs)

        return Prepared(
            run=run,
            reference_kv=lambda idx: (
                fp8_dequantize(sample_rows(k8, idx), ks),
                fp8_dequantize(sample_rows(v8, idx), vs),
            ),
            out=out,
            notes=f"flashinfer {flashinfer_version()}",
            keepalive=[workspace, pt, kp, vp],
            inputs=[q, kp, vp, pt.block_tables, seq_lens],
        )


@register
class TrtllmNVFP4(Backend):
    name = "trtllm-nvfp4"
    family = "trtllm"
    third_party = True
    bits = 4
    kv_format = "nvfp4"
    tolerance = 8e-2
    description = "TensorRT-LLM NVFP4 KV decode (trtllm-gen kernels, Blackwell only): listed as unsupported"

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        device = f"sm_{gpu.sm}" if gpu is not None and gpu.sm else "not a CUDA GPU"
        return (
            "TensorRT-LLM's NVFP4 KV-cache decode runs on trtllm-gen kernels built for Blackwell "
            f"(sm_100 and newer), which this suite does not drive; this device is {device}."
        )
