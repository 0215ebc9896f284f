"""FlashInfer's paged decode (`BatchDecodeWithPagedKVCacheWrapper`, NHD pages): BF16 KV on
the CUDA-core kernel, the tensor-core (fa2) kernel and fa3; FP8 (E4M3) KV; NVFP4 KV on the
tensor-core kernel. FlashInfer is optional: without it every backend here is `unsupported`.

The wrapper is planned once in `prepare` (host work, never timed); `run` is one launch.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from baselines._paging import (
    fp8_dequantize,
    fp8_quantize,
    nvfp4_dequantize,
    nvfp4_quantize_chunked,
    page_table,
    paged_view,
    sample_rows,
    shared_workspace,
)
from baselines.base import Backend, GpuInfo, Prepared, SourceKV, Unsupported, has_module, register
from core.case import Case

WORKSPACE_BYTES = 256 * 1024 * 1024  # split-KV partial results (FlashInfer suggests 128 MB)
INSTALL_HINT = (
    "flashinfer is not importable; install it with `pip install flashinfer-python` "
    "(or `pip install -e .[flashinfer]`), or carry its wheel to an offline GPU machine"
)


def flashinfer_version() -> str | None:
    try:
        import flashinfer

        return getattr(flashinfer, "__version__", "unknown")
    except Exception:  # noqa: BLE001
        return None


def call_with_supported(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call fn, dropping keyword arguments its signature does not take (FlashInfer's
    signatures move between releases). Functions taking **kwargs get everything."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


@dataclass
class PagedKV:
    """The cache in one backend's FlashInfer format: paged K and V with their dtype, the
    arguments `run` takes beside them (scales), and the reference's dequantized view."""

    kv: tuple[Any, Any]
    kv_dtype: Any
    reference_kv: Callable[[Sequence[int]], tuple[Any, Any]]
    run_kwargs: dict[str, Any] = field(default_factory=dict)


class _FlashInferDecode(Backend):
    family = "flashinfer"
    third_party = True
    use_tensor_cores = False
    fi_backend: str | None = None  # the wrapper's `backend` argument; None: its default
    kv_format = "bf16"
    head_dims = (64, 128, 256)

    def available(self) -> str | None:
        return None if has_module("flashinfer") else INSTALL_HINT + "."

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        if case.head_dim not in self.head_dims:
            return f"head_dim={case.head_dim} is not compiled in FlashInfer's decode; expected one of {self.head_dims}."
        return self._arch_reason(gpu)

    def _arch_reason(self, gpu: GpuInfo | None) -> str | None:
        if gpu is not None and gpu.sm and gpu.sm < 80:
            return f"{self.name} needs sm_80 or newer; this GPU is sm_{gpu.sm}."
        return None

    def memory_bytes(self, case: Case) -> int:
        if self.kv_format == "bf16":
            return WORKSPACE_BYTES  # pages are views of the source K/V: no copy
        return WORKSPACE_BYTES + self.traffic(case).total

    # --- the cache in this backend's format ---------------------------------------------
    def convert(self, case: Case, source: SourceKV) -> PagedKV:
        """Paged K and V (plus scales) and the reference's dequantized K/V."""
        return PagedKV(
            kv=(paged_view(source.k, case.page_size), paged_view(source.v, case.page_size)),
            kv_dtype=source.k.dtype,
            reference_kv=lambda idx: (sample_rows(source.k, idx), sample_rows(source.v, idx)),
        )

    def _wrapper(self, workspace: Any) -> Any:
        import flashinfer

        kwargs: dict[str, Any] = {"use_tensor_cores": self.use_tensor_cores}
        if self.fi_backend:
            sig = inspect.signature(flashinfer.BatchDecodeWithPagedKVCacheWrapper.__init__)
            if "backend" not in sig.parameters:
                raise Unsupported(
                    f"flashinfer {flashinfer_version()} has no `backend` argument on "
                    f"BatchDecodeWithPagedKVCacheWrapper, so {self.fi_backend} cannot be selected."
                )
            kwargs["backend"] = self.fi_backend
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", **kwargs)

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        import torch

        dev = source.q.device
        fmt = self.convert(case, source)
        pt = page_table(case.batch, source.max_len, case.page_size, dev)
        # lengths are the real ones, which may be shorter than the padded max_len
        pages = -(-source.seq_lens.long() // case.page_size)
        if not bool((pages == pt.pages_per_seq).all()):
            raise Unsupported("sequences of different page counts are not wired up in this adapter.")
        pt.last_page_len.copy_((source.seq_lens - (pages.int() - 1) * case.page_size).int())
        workspace = shared_workspace(dev, WORKSPACE_BYTES)
        wrapper = self._wrapper(workspace)
        call_with_supported(
            wrapper.plan,
            pt.indptr, pt.indices, pt.last_page_len,
            case.num_q_heads, case.num_kv_heads, case.head_dim, case.page_size,
            pos_encoding_mode="NONE",
            q_data_type=source.q.dtype,
            kv_data_type=fmt.kv_dtype,
            sm_scale=source.sm_scale,
        )
        q = source.q
        takes_out = "out" in inspect.signature(wrapper.run).parameters
        out = torch.empty_like(q) if takes_out else None
        kv, run_kwargs = fmt.kv, fmt.run_kwargs

        if takes_out:
            def run():
                return wrapper.run(q, kv, out=out, **run_kwargs)
        else:
            def run():
                return wrapper.run(q, kv, **run_kwargs)

        return Prepared(
            run=run,
            reference_kv=fmt.reference_kv,
            out=out,
            notes=f"flashinfer {flashinfer_version()}",
            keepalive=[workspace, wrapper, pt, fmt],
            inputs=[q, kv, run_kwargs, pt],
        )


@register
class FlashInferBF16(_FlashInferDecode):
    name = "flashinfer-bf16"
    tolerance = 1e-2
    description = "FlashInfer paged decode, BF16 KV, CUDA-core kernel (use_tensor_cores=False)"


@register
class FlashInferBF16TC(_FlashInferDecode):
    name = "flashinfer-bf16-tc"
    use_tensor_cores = True
    tolerance = 1e-2
    description = "FlashInfer paged decode, BF16 KV, tensor-core (fa2 prefill) kernel"


@register
class FlashInferBF16FA3(_FlashInferDecode):
    name = "flashinfer-bf16-fa3"
    use_tensor_cores = True
    fi_backend = "fa3"
    tolerance = 1e-2
    description = "FlashInfer paged decode, BF16 KV, fa3 (Hopper) kernel"

    def _arch_reason(self, gpu: GpuInfo | None) -> str | None:
        if gpu is not None and gpu.sm and gpu.sm != 90:
            return f"FlashInfer's fa3 backend is built for sm_90 (Hopper); this GPU is sm_{gpu.sm}."
        return None


class _FlashInferFP8(_FlashInferDecode):
    bits = 8
    kv_format = "fp8"
    # Q stays BF16, K/V are exact E4M3 values dequantized in the kernel: bf16-level error
    # against the reference over the same E4M3 cache.
    tolerance = 2e-2

    def convert(self, case: Case, source: SourceKV) -> PagedKV:
        import torch

        k8, ks = fp8_quantize(source.k)
        v8, vs = fp8_quantize(source.v)
        return PagedKV(
            kv=(paged_view(k8, case.page_size), paged_view(v8, case.page_size)),
            kv_dtype=torch.float8_e4m3fn,
            run_kwargs={"k_scale": ks, "v_scale": vs},
            reference_kv=lambda idx: (
                fp8_dequantize(sample_rows(k8, idx), ks),
                fp8_dequantize(sample_rows(v8, idx), vs),
            ),
        )


@register
class FlashInferFP8(_FlashInferFP8):
    name = "flashinfer-fp8"
    description = "FlashInfer paged decode, FP8 E4M3 KV (per-tensor scale), CUDA-core kernel"


@register
class FlashInferFP8TC(_FlashInferFP8):
    name = "flashinfer-fp8-tc"
    use_tensor_cores = True
    description = "FlashInfer paged decode, FP8 E4M3 KV, tensor-core path (FlashInfer picks fa2/fa3)"


@register
class FlashInferNVFP4TC(_FlashInferDecode):
    name = "flashinfer-nvfp4-tc"
    bits = 4
    kv_format = "nvfp4"
    use_tensor_cores = True
    fi_backend = "fa2"
    tolerance = 2e-2
    description = (
        "FlashInfer tensor-core (fa2) decode over NVFP4 KV: E2M1 codes, one E4M3 scale per "
        "16 elements (linear layout), a per-tensor scale; dequantized to BF16 in registers"
    )

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        reason = super().case_reason(case, gpu)
        if reason:
            return reason
        try:
            import flashinfer

            run_sig = inspect.signature(flashinfer.BatchDecodeWithPagedKVCacheWrapper.run)
        except Exception as exc:  # noqa: BLE001
            return f"flashinfer's decode wrapper could not be inspected: {exc}"
        if "kv_cache_sf" not in run_sig.parameters:
            return (
                f"flashinfer {flashinfer_version()} has no NVFP4 KV cache support "
                "(BatchDecodeWithPagedKVCacheWrapper.run takes no kv_cache_sf); it came in 0.6."
            )
        return None

    def convert(self, case: Case, source: SourceKV) -> PagedKV:
        import torch

        kp, ksf, kg = nvfp4_quantize_chunked(source.k)
        vp, vsf, vg = nvfp4_quantize_chunked(source.v)
        ps = case.page_size
        return PagedKV(
            kv=(paged_view(kp, ps), paged_view(vp, ps)),
            kv_dtype=torch.uint8,
            run_kwargs={
                "kv_cache_sf": (paged_view(ksf, ps), paged_view(vsf, ps)),
                "k_scale": kg,
                "v_scale": vg,
            },
            reference_kv=lambda idx: (
                nvfp4_dequantize(sample_rows(kp, idx), sample_rows(ksf, idx), kg),
                nvfp4_dequantize(sample_rows(vp, idx), sample_rows(vsf, idx), vg),
            ),
        )
