"""Our own kernels as backends: FOSCAR's folded decode (`variant="fold"`) and the plain
"dequantize in registers, then MMA" kernel (`variant="dequant"`), INT4 and INT2.

The cache comes from `foscar.quantize` (docs/FORMAT.md); the reference attends over
`foscar.dequantize` of that same cache, so quantization error is not the kernel's error.
foscar.kernels builds libfoscar.so on first use: a failed build is a `compile_error` record,
never a dead sweep.
"""
from __future__ import annotations

from baselines.base import Backend, CompileError, GpuInfo, Prepared, SourceKV, Unsupported, register
from core.case import Case

# Relative L2 error against float64 over the same dequantized cache that our kernels (and
# torch-ref) must stay under: bf16 rounding level (FOSCAR.md section 8). The one gate the
# sweep, the kernel lab and docs/PERFORMANCE.md mean by "passed".
TOLERANCE = 4e-3


def _foscar():
    try:
        import foscar
    except Exception as exc:  # noqa: BLE001 - a broken install is a record, not a dead sweep
        raise Unsupported(f"the foscar package does not import: {type(exc).__name__}: {exc}") from exc
    return foscar


def quant_config(case: Case):
    return _foscar().QuantConfig(
        bits=case.bits, group_size=case.group_size, k_mode=case.k_mode, v_mode=case.v_mode,
        page_size=case.page_size,
    )


def _torch_device(gpu: GpuInfo | None):
    """The CUDA device the case runs on (None off-GPU: the kernels then skip arch checks)."""
    if gpu is None or not gpu.sm:
        return None
    import torch

    return torch.device("cuda", gpu.index) if torch.cuda.is_available() else None


class _Foscar(Backend):
    family = "foscar"
    quantized = True
    tolerance = TOLERANCE
    kv_format = "int"
    variant = "fold"
    num_splits: int | None = None  # None: the launch plan's split count
    kv_heads_per_item: int | None = None  # None: the planner's pairing of KV heads
    second_instance = True  # False: the kernel's own instance wherever the planner would take its second

    def available(self) -> str | None:
        try:
            _foscar()
        except Unsupported as exc:
            return str(exc)
        return None

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        try:
            config = quant_config(case)
            config.check_head_dim(case.head_dim)
        except ValueError as exc:
            return str(exc)
        from foscar.kernels import unsupported_reason

        return unsupported_reason(case.num_q_heads, case.num_kv_heads, case.head_dim, config,
                                  self.variant, _torch_device(gpu))

    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        import torch

        foscar = _foscar()
        library = self._library()
        from foscar import kernels

        config = quant_config(case)
        cache = self._quantize(foscar, case, source, config)
        q = source.q
        out = torch.empty_like(q)
        variant, splits, heads, second = self.variant, self.num_splits, self.kv_heads_per_item, self.second_instance

        def run():
            return kernels.decode(q, cache, sm_scale=source.sm_scale, out=out, variant=variant, num_splits=splits,
                                  library=library, kv_heads_per_item=heads, second_instance=second)

        def reference_kv(idx):
            return foscar.dequantize(cache, batch_indices=list(idx), dtype=torch.float32)

        notes = f"foscar variant={variant}"
        if q.is_cuda:  # the launch it makes (a test's CPU stand-in has no GPU to plan for)
            notes += "; " + kernels.plan_note(q, cache, variant=variant, num_splits=splits, library=library,
                                              kv_heads_per_item=heads, second_instance=second)
        return Prepared(
            run=run, reference_kv=reference_kv, out=out, notes=notes, keepalive=[cache], inputs=[q, cache],
        )

    def _library(self):
        """The loaded libfoscar.so (built on first use); a failed build is a CompileError."""
        try:
            from foscar import kernels

            return kernels.load_library()
        except Exception as exc:  # noqa: BLE001
            raise CompileError(
                f"foscar's kernels did not build or load ({type(exc).__name__}: {exc}); "
                "run `foscar-bench build` on the GPU machine to see nvcc's output."
            ) from exc

    def _quantize(self, foscar, case: Case, source: SourceKV, config):
        return foscar.quantize(source.k, source.v, source.seq_lens, config)


class FoscarVariant(_Foscar):
    """Our kernels from one build with kernel knobs set, under a name of the caller's own:
    not registered. scripts/kernel_lab.py measures each variant through the harness
    (suite.runner.measure) like any backend, so its p10, bytes and "passed" are the sweep's.

    library: foscar.kernels.load_library(defines=...) of that build. The cache's pages are
    shuffled (seeded by the case), as an allocator would leave them. num_splits overrides the
    launch plan's split count and kv_heads_per_item the planner's pairing (None: the plan's);
    second_instance=False keeps each kernel to its own instance (foscar.kernels.decode).
    """

    def __init__(self, name: str, bits: int, library, *, variant: str = "fold", defines: tuple[str, ...] = (),
                 num_splits: int | None = None, kv_heads_per_item: int | None = None, second_instance: bool = True):
        self.name, self.bits, self.variant, self.num_splits = name, bits, variant, num_splits
        self.kv_heads_per_item, self.second_instance = kv_heads_per_item, second_instance
        self.library, self.defines = library, tuple(defines)
        splits = f", {num_splits} splits" if num_splits else ""
        heads = f", {kv_heads_per_item} KV head(s) per item" if kv_heads_per_item else ""
        own = "" if second_instance else ", own instances only"
        self.description = (f"FOSCAR {variant} INT{bits}, built with {' '.join(self.defines) or 'default knobs'}"
                            f"{splits}{heads}{own}")

    def _library(self):
        return self.library

    def _quantize(self, foscar, case: Case, source: SourceKV, config):
        return foscar.quantize(source.k, source.v, source.seq_lens, config, shuffle_pages=True, seed=case.seed)


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
