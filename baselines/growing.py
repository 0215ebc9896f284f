"""Each backend's cache with room to grow, for a decode loop (`foscar-bench e2e`): a step appends
one token per sequence in the backend's own format, then attends over the whole cache.

The sweep's `prepare` builds a cache of fixed length and plans for it; a decode loop needs the
cache to grow inside CUDA graphs. This module composes the registered backends for that,
without changing them: the format comes from the backend's own conversion (FlashInfer's
`convert`, the FP8 quantizer XQA uses, `foscar.quantize` with the backend's QuantConfig),
and the attention is the same library call the backend makes, with its arguments made
growable (FlashInfer: a CUDA-graph wrapper re-planned before each step; XQA and FOSCAR read
the lengths from the device).

One `GrowingKV` holds every layer of one batch. All layers share the lengths (and, where the
format has one, the page table), since they grow together. Per step:

    flush = kv.flush_due()        # host: FOSCAR's BF16 tail completes a group this step
    kv.plan()                     # host: what the step's attention needs planned (FlashInfer)
    kv.begin_step(flush)          # device: lengths + 1
    kv.append(layer, k, v, flush) # device, per layer: the new token in the format
    kv.attend(layer, q, out)      # device, per layer: attention over the whole cache
    kv.stepped()                  # host: the step ran

Every layer starts from a copy of one layer's prefix (speed does not depend on the values;
each layer appends its own tokens from then on).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from baselines.base import Backend, SourceKV, Unsupported
from core.case import Case


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class GrowingKV:
    """Base class: the host mirror of the lengths and the step protocol (module doc)."""

    flush_period: int | None = None  # steps between flushes when all lengths are equal

    def __init__(self, backend: Backend, case: Case, source: SourceKV, num_layers: int, max_len: int,
                 release_source: bool = False):
        self.backend, self.case, self.num_layers, self.max_len = backend, case, num_layers, max_len
        self.release_source = release_source
        self.sm_scale = source.sm_scale
        self.device = source.k.device
        self.batch, self.prefix_len, self.num_kv_heads, self.head_dim = source.k.shape
        self.host_lens = source.seq_lens.cpu().long()
        if int(self.host_lens.max()) > max_len:
            raise ValueError(f"max_len={max_len} is shorter than the prefix ({int(self.host_lens.max())} tokens).")
        self.rows = torch.arange(self.batch, device=self.device)

    def _consumed(self, source: SourceKV) -> None:
        """Layer 0 holds the prefix now: let the source's K and V go before the other layers are
        copied (at capacity the BF16 source is several layers' worth of a low-bit cache)."""
        self._release(source, "k", "v")

    def _release(self, source: SourceKV, *names: str) -> None:
        """With release_source: drop the source's tensors `names` and hand the allocator's free
        blocks back to the driver. Left cached, a freed block the size of the BF16 source takes the
        next smaller buffer (an FP8 layer is half its size) and strands the rest of itself: no other
        layer fits there, and a block partly in use cannot be returned. Building Llama-3-8B's 32
        FP8 layers of 200 x 4K tokens on an H100 left 2.8 GB reserved beyond what was allocated
        (0.02 GB with this), and 292 sequences ran out of memory (they fit with this): the likely
        reason every bundled FP8 capacity point ran out of memory once."""
        if not self.release_source:
            return
        for name in names:
            setattr(source, name, None)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- host ---------------------------------------------------------------------------
    def plan(self) -> None:
        """Host work the next step's attention needs (none unless the backend plans)."""

    def flush_due(self) -> bool:
        if int(self.host_lens.max()) + 1 > self.max_len:
            raise ValueError(
                f"the caches hold at most {self.max_len} tokens per sequence and are full; build "
                "them with a larger max_len.")
        return False

    def stepped(self) -> None:
        self.host_lens += 1

    # --- device -------------------------------------------------------------------------
    def begin_step(self, flush: bool) -> None:
        raise NotImplementedError

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, flush: bool) -> None:
        raise NotImplementedError

    def attend(self, layer: int, q: torch.Tensor, out: torch.Tensor) -> None:
        raise NotImplementedError

    def warm(self, q: torch.Tensor, out: torch.Tensor) -> None:
        """Attend once per layer (attention reads, never writes, the cache): loads the kernels and
        sizes their workspaces and plans, so a capture that follows needs no host work on the GPU."""
        self.plan()
        for layer in range(self.num_layers):
            self.attend(layer, q, out)

    # --- checks and sizes -----------------------------------------------------------------
    def reference_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k, v, lens): layer's cache as stored, dequantized to float64 [batch, max len, heads, d],
        with the device lengths (eager use: it synchronizes)."""
        raise NotImplementedError

    def nbytes(self) -> int:
        """Device bytes the caches hold (every layer)."""
        raise NotImplementedError

    @classmethod
    def bytes_per_sequence(cls, case: Case, max_len: int, num_layers: int) -> int:
        """Device bytes one sequence of max_len tokens takes in this format, over all layers."""
        raise NotImplementedError

    @classmethod
    def step_bytes_per_sequence(cls, case: Case) -> int:
        """Transient device bytes the append takes per sequence during a step (one layer at a time)."""
        return 0


class _Pages(GrowingKV):
    """K and V as [batch, capacity, heads, d] buffers, each sequence's pages contiguous (the
    layout of baselines._paging.paged_view and page_table); the device lengths grow per step."""

    elem_bytes = 2

    def __init__(self, backend, case, source, num_layers, max_len, release_source=False):
        super().__init__(backend, case, source, num_layers, max_len, release_source)
        self.page = case.page_size
        self.capacity = _round_up(max_len, self.page)
        self.seq_lens = source.seq_lens.to(device=self.device, dtype=torch.int32).clone()

    def begin_step(self, flush: bool) -> None:
        self.seq_lens += 1

    def _write(self, buf: torch.Tensor, x: torch.Tensor) -> None:
        buf[self.rows, self.seq_lens.long() - 1] = x

    @classmethod
    def bytes_per_sequence(cls, case, max_len, num_layers):
        return 2 * _round_up(max_len, case.page_size) * case.num_kv_heads * case.head_dim * cls.elem_bytes * num_layers

    def _lens(self) -> torch.Tensor:
        return self.seq_lens.cpu().long()


class FlashInferKV(_Pages):
    """BF16 pages (the backend's `convert`), FlashInfer's paged decode wrapper in CUDA-graph mode:
    its buffers are fixed, and `plan` (host) refreshes them for the next step's lengths."""

    def __init__(self, backend, case, source, num_layers, max_len, release_source=False):
        import flashinfer

        from baselines._paging import shared_workspace
        from baselines.flashinfer_decode import WORKSPACE_BYTES

        super().__init__(backend, case, source, num_layers, max_len, release_source)
        if backend.kv_format != "bf16":
            raise Unsupported(f"{backend.name}: the growing cache is written for BF16 pages only.")
        shape = (self.batch, self.capacity, self.num_kv_heads, self.head_dim)
        first_k = torch.zeros(shape, dtype=source.k.dtype, device=self.device)
        first_v = torch.zeros_like(first_k)
        first_k[:, : self.prefix_len], first_v[:, : self.prefix_len] = source.k, source.v
        self._consumed(source)
        self.k_bufs, self.v_bufs, self.kv, self.run_kwargs = [], [], [], []
        for layer in range(num_layers):
            k = first_k if layer == 0 else first_k.clone()
            v = first_v if layer == 0 else first_v.clone()
            fmt = backend.convert(case, SourceKV(q=source.q, k=k, v=v, seq_lens=self.seq_lens, sm_scale=self.sm_scale))
            pages = _part(fmt, "kv")
            if pages[0].data_ptr() != k.data_ptr() or pages[1].data_ptr() != v.data_ptr():
                raise Unsupported(f"{backend.name}'s pages are not views of the K/V buffers; appends would not reach them.")
            self.k_bufs.append(k)
            self.v_bufs.append(v)
            self.kv.append(pages)
            self.run_kwargs.append(_part(fmt, "run_kwargs"))
        self.kv_dtype = _part(fmt, "kv_dtype")
        self.pages_per_seq = self.capacity // self.page
        int_buf = dict(dtype=torch.int32, device=self.device)
        kwargs: dict[str, Any] = dict(
            use_cuda_graph=True, use_tensor_cores=backend.use_tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(self.batch + 1, **int_buf),
            paged_kv_indices_buffer=torch.zeros(self.batch * self.pages_per_seq, **int_buf),
            paged_kv_last_page_len_buffer=torch.zeros(self.batch, **int_buf),
        )
        if backend.fi_backend:
            kwargs["backend"] = backend.fi_backend
        workspace = shared_workspace(self.device, WORKSPACE_BYTES)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", **kwargs)
        self._planned_for: torch.Tensor | None = None
        self._plan_copied: Any = None

    def plan(self) -> None:
        from baselines.flashinfer_decode import call_with_supported

        lens = self.host_lens + 1  # the lengths after the next step's append
        if self._planned_for is not None and torch.equal(lens, self._planned_for):
            return
        # plan() fills a pinned host buffer and queues its copy to the device; the previous plan's
        # copy must have run before the buffer is overwritten (it runs before the previous step).
        if self._plan_copied is not None:
            self._plan_copied.synchronize()
        pages = (lens + self.page - 1) // self.page
        indptr = torch.zeros(self.batch + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(pages, 0)
        # Sequence b's pages are b * pages_per_seq onwards (the layout of paged_view).
        starts = torch.arange(self.batch) * self.pages_per_seq - indptr[:-1].long()
        indices = (torch.arange(int(indptr[-1])) + torch.repeat_interleave(starts, pages)).int()
        last = (lens - (pages - 1) * self.page).int()
        call_with_supported(
            self.wrapper.plan, indptr, indices, last,
            self.case.num_q_heads, self.num_kv_heads, self.head_dim, self.page,
            pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=self.kv_dtype,
            sm_scale=self.sm_scale,
        )
        self._planned_for = lens
        if self.device.type == "cuda":
            self._plan_copied = torch.cuda.Event()
            self._plan_copied.record()

    def append(self, layer, k_new, v_new, flush):
        self._write(self.k_bufs[layer], k_new)
        self._write(self.v_bufs[layer], v_new)

    def attend(self, layer, q, out):
        from baselines.flashinfer_decode import call_with_supported

        res = call_with_supported(self.wrapper.run, q, self.kv[layer], out=out, **self.run_kwargs[layer])
        if res is not None and res.data_ptr() != out.data_ptr():
            out.copy_(res)

    def reference_kv(self, layer):
        lens = self._lens()
        n = int(lens.max())
        return self.k_bufs[layer][:, :n].double(), self.v_bufs[layer][:, :n].double(), lens

    def nbytes(self):
        return sum(b.nbytes for b in self.k_bufs + self.v_bufs)


def _part(fmt: Any, name: str) -> Any:
    """A field of the adapter's converted format, a dict today (a dataclass may replace it)."""
    return fmt[name] if isinstance(fmt, dict) else getattr(fmt, name)


FP8_CHUNK_VALUES = 1 << 26  # 256 MB of float32 at a time when quantizing a prefix


def _fp8_quantize_into(out: torch.Tensor, x: torch.Tensor, chunk_values: int = FP8_CHUNK_VALUES) -> float:
    """baselines._paging.fp8_quantize(x) written into `out` (E4M3, x's shape; a view may do), chunk
    by chunk: the same scale (amax / 448) and the same bytes, without a copy of x's size in any
    dtype (fp8_quantize holds |x| whole, then its FP8 result beside the buffer it is copied to).
    Returns the scale."""
    from baselines._paging import E4M3_MAX

    if out.shape != x.shape:
        raise ValueError(f"the FP8 buffer's shape {tuple(out.shape)} is not the source's {tuple(x.shape)}; "
                         "pass the view of the pages that the prefix fills.")
    pieces = list(_chunks(x.shape, chunk_values)) if x.numel() else []
    amax = torch.zeros((), dtype=torch.float32, device=x.device)
    for piece in pieces:
        torch.maximum(amax, x[piece].abs().amax().float(), out=amax)
    amax_value = float(amax.item())
    scale = amax_value / E4M3_MAX if amax_value > 0 else 1.0
    for piece in pieces:
        out[piece] = (x[piece].float() / scale).to(torch.float8_e4m3fn)
    return scale


def _chunks(shape: torch.Size, limit: int):
    """Index tuples over [batch, tokens, ...] of at most `limit` values each (one token at least):
    whole sequences where they fit, else a sequence's tokens in runs."""
    batch, tokens = shape[0], shape[1]
    per_token = math.prod(shape[2:])
    if tokens * per_token <= limit:
        step = max(1, limit // max(1, tokens * per_token))
        for b in range(0, batch, step):
            yield (slice(b, b + step),)
    else:
        step = max(1, limit // max(1, per_token))
        for b in range(batch):
            for t in range(0, tokens, step):
                yield (slice(b, b + 1), slice(t, t + step))


def _fp8_encode(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A new token in the per-tensor E4M3 format of baselines._paging.fp8_quantize (x ~ fp8 * scale),
    saturated at the format's range: a token beyond the prefix's amax would otherwise be NaN."""
    from baselines._paging import E4M3_MAX

    return (x.float() / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


class XqaKV(_Pages):
    """FP8 E4M3 pages with the per-tensor scales of the backend's quantizer; XQA reads the lengths
    from the device, so the step grows them in place and nothing is planned on the host."""

    elem_bytes = 1

    def __init__(self, backend, case, source, num_layers, max_len, release_source=False):
        from baselines._paging import page_table, paged_view, shared_workspace
        from baselines.trtllm import WORKSPACE_BYTES, XQA_SEMAPHORE_BYTES, _xqa_fn

        super().__init__(backend, case, source, num_layers, max_len, release_source)
        self.xqa = _xqa_fn()
        shape = (self.batch, self.capacity, self.num_kv_heads, self.head_dim)
        bufs = []
        for name in ("k", "v"):
            buf = torch.zeros(shape, dtype=torch.float8_e4m3fn, device=self.device)
            # the adapter's quantizer (scale = amax / 448), straight into the pages
            scale = _fp8_quantize_into(buf[:, : self.prefix_len], getattr(source, name))
            bufs.append((buf, scale))
            self._release(source, name)  # K's BF16 source goes before V's pages are allocated
        (first_k, self.k_scale), (first_v, self.v_scale) = bufs
        self._consumed(source)
        self.k_bufs = [first_k] + [first_k.clone() for _ in range(num_layers - 1)]
        self.v_bufs = [first_v] + [first_v.clone() for _ in range(num_layers - 1)]
        self.kv = [(paged_view(k, self.page), paged_view(v, self.page)) for k, v in zip(self.k_bufs, self.v_bufs)]
        self.block_tables = page_table(self.batch, self.capacity, self.page, self.device).block_tables
        self.workspace = shared_workspace(self.device, WORKSPACE_BYTES)
        self.workspace[:XQA_SEMAPHORE_BYTES].zero_()

    def append(self, layer, k_new, v_new, flush):
        self._write(self.k_bufs[layer], _fp8_encode(k_new, self.k_scale))
        self._write(self.v_bufs[layer], _fp8_encode(v_new, self.v_scale))

    def attend(self, layer, q, out):
        from baselines.flashinfer_decode import call_with_supported

        call_with_supported(
            self.xqa, query=q, kv_cache=self.kv[layer], workspace_buffer=self.workspace,
            block_tables=self.block_tables, seq_lens=self.seq_lens, max_seq_len=self.capacity,
            bmm1_scale=self.sm_scale * self.k_scale, bmm2_scale=self.v_scale, out=out, kv_layout="NHD",
        )

    def reference_kv(self, layer):
        from baselines._paging import fp8_dequantize

        lens = self._lens()
        n = int(lens.max())
        return (fp8_dequantize(self.k_bufs[layer][:, :n], self.k_scale).double(),
                fp8_dequantize(self.v_bufs[layer][:, :n], self.v_scale).double(), lens)

    def nbytes(self):
        return sum(b.nbytes for b in self.k_bufs + self.v_bufs)


class FoscarKV(GrowingKV):
    """Our quantized pages and BF16 tail (docs/FORMAT.md), grown by foscar.append_graph; the kernel
    reads the lengths from the device. On a CPU the kernels run in the emulator (foscar.emu)."""

    def __init__(self, backend, case, source, num_layers, max_len, release_source=False):
        import foscar
        from foscar.append_graph import GraphAppender, pages_to_reserve

        from baselines.foscar import quant_config

        super().__init__(backend, case, source, num_layers, max_len, release_source)
        config = quant_config(case)
        extra = pages_to_reserve(config, self.host_lens, max_len)
        first = foscar.quantize(source.k, source.v, source.seq_lens, config, extra_pages=extra)
        self._consumed(source)
        caches = [first] + [_clone_cache(first) for _ in range(num_layers - 1)]
        self.appender = GraphAppender(caches, max_len)
        self.caches = caches
        self.flush_period = self.appender.flush_period
        self.variant = backend.variant
        if self.device.type == "cuda":
            from foscar import kernels

            kernels.load_library()  # builds libfoscar.so on first use, before any capture
            self._decode = foscar.decode
        else:
            from foscar import emu

            self._decode = emu.decode

    def flush_due(self) -> bool:
        super().flush_due()
        return self.appender.flush_due()

    def stepped(self) -> None:
        super().stepped()
        self.appender.stepped()

    def begin_step(self, flush):
        self.appender.begin_step(flush)

    def append(self, layer, k_new, v_new, flush):
        self.appender.append(layer, k_new, v_new, flush)

    def attend(self, layer, q, out):
        self._decode(q, self.caches[layer], sm_scale=self.sm_scale, out=out, variant=self.variant)

    def reference_kv(self, layer):
        import foscar

        k, v = foscar.dequantize(self.caches[layer], dtype=torch.float64)
        return k, v, self.caches[layer].seq_lens.cpu().long()

    def nbytes(self):
        return sum(c.nbytes(allocated=True)["total"] for c in self.caches)

    @classmethod
    def bytes_per_sequence(cls, case, max_len, num_layers):
        from baselines.foscar import quant_config

        cfg = quant_config(case)
        heads, dim, page, group = case.num_kv_heads, case.head_dim, cfg.page_size, cfg.group_size
        packed = max_len - max_len % group if cfg.has_tail else max_len
        pages = max(1, math.ceil(packed / page))
        codes = 2 * pages * page * heads * dim * cfg.bits // 8
        params = 2 * pages * page * heads * dim // group * 2 * cfg.torch_param_dtype.itemsize
        tails = 2 * heads * group * dim * 2  # allocated whether or not the config has a tail
        return (codes + params + tails + 4 * pages) * num_layers


    @classmethod
    def step_bytes_per_sequence(cls, case):
        # The flush quantizes a whole tail group (K, then V): float32 values and their
        # differences, uint8 codes twice, int32 slots and shifted slots: about 20 bytes a value.
        return 24 * case.num_kv_heads * case.group_size * case.head_dim


def _clone_cache(cache):
    """A copy of a QuantizedKVCache's data (codes, parameters, tails); lengths and page table are
    shared by GraphAppender anyway."""
    return dataclasses.replace(
        cache, k_codes=cache.k_codes.clone(), v_codes=cache.v_codes.clone(),
        k_params=cache.k_params.clone(), v_params=cache.v_params.clone(),
        k_tail=cache.k_tail.clone(), v_tail=cache.v_tail.clone(), free_pages=list(cache.free_pages),
    )


# Which growing cache serves which registered backend (by the backend's family and KV format).
GROWERS: dict[tuple[str, str], type[GrowingKV]] = {
    ("flashinfer", "bf16"): FlashInferKV,
    ("trtllm", "fp8"): XqaKV,
    ("foscar", "int"): FoscarKV,
}


def grower_for(backend: Backend) -> type[GrowingKV]:
    key = (backend.family, getattr(backend, "kv_format", ""))
    if key not in GROWERS:
        served = sorted(f"{f}/{k}" for f, k in GROWERS)
        raise Unsupported(
            f"{backend.name} (family {key[0]}, KV format {key[1] or 'unknown'}) has no growing cache for "
            f"the decode loop; the families and formats served are {served}.")
    return GROWERS[key]


def grow(backend: Backend, case: Case, source: SourceKV, num_layers: int, max_len: int, *,
         release_source: bool = False) -> GrowingKV:
    """num_layers caches in `backend`'s format for `case` (run `backend.case_for` first), filled
    with `source`'s prefix (k, v [batch, prefix, heads, d] BF16; seq_lens int32 [batch]) and
    with room for max_len tokens per sequence. release_source=True sets source.k and source.v
    to None once the first layer holds them, so their memory is free for the other layers."""
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers} must be at least 1.")
    return grower_for(backend)(backend, case, source, num_layers, max_len, release_source)


def bytes_per_sequence(backend: Backend, case: Case, max_len: int, num_layers: int) -> int:
    """Cache bytes of one sequence in the backend's format (every layer), plus the append's transient."""
    grower = grower_for(backend)
    return grower.bytes_per_sequence(case, max_len, num_layers) + grower.step_bytes_per_sequence(case)
