"""`foscar.decode`: validates its inputs, plans the split-KV launch, and calls libfoscar.so.

The library is bound with ctypes over a plain C struct (foscar/csrc/foscar_api.h) rather
than a torch extension: it builds with nvcc alone in seconds, carries no framework ABI, and
the same shared object is what the SASS analysis reads.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading

import torch

from foscar.cache import QuantizedKVCache
from foscar.config import QuantConfig

WARPS_PER_CTA = 8
CHUNK_TOKENS = 64
MAX_SPLITS = 64
VARIANTS = ("fold", "dequant")
# Tensor Core operand type. bf16 (the default) is the one measured correct at every shape.
# fp16 takes codes at more bit positions and rounds folded operands finer; its first schedule
# (v2) measured 0.5-3.6 % error at batch 128 x 32K on the H200, the current one (v3) is not
# measured yet (docs/PERFORMANCE.md). The harness's correctness gate judges it either way.
OPERANDS = ("bf16", "fp16")
DEFAULT_OPERAND = os.environ.get("FOSCAR_OPERAND", "bf16")


class _Args(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p), ("o", ctypes.c_void_p),
        ("k_codes", ctypes.c_void_p), ("v_codes", ctypes.c_void_p),
        ("k_params", ctypes.c_void_p), ("v_params", ctypes.c_void_p),
        ("page_table", ctypes.c_void_p), ("seq_lens", ctypes.c_void_p),
        ("k_tail", ctypes.c_void_p), ("v_tail", ctypes.c_void_p),
        ("ws_o", ctypes.c_void_p), ("ws_ml", ctypes.c_void_p),
        ("batch", ctypes.c_int32), ("num_q_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("bits", ctypes.c_int32), ("group_size", ctypes.c_int32),
        ("k_channel", ctypes.c_int32), ("v_channel", ctypes.c_int32), ("dequant", ctypes.c_int32),
        ("operand_f16", ctypes.c_int32),
        ("page_size", ctypes.c_int32), ("max_pages", ctypes.c_int32),
        ("num_splits", ctypes.c_int32), ("units_per_split", ctypes.c_int32),
        ("sm_scale", ctypes.c_float), ("device", ctypes.c_int32),
    ]


_lib = None
_lib_lock = threading.Lock()


def load_library(arch: str | None = None):
    """Builds libfoscar.so if the cache lacks it (first call only) and loads it."""
    global _lib
    with _lib_lock:
        if _lib is None:
            from foscar.build import build, detect_arch

            result = build(arch or detect_arch() or "sm_90a")
            lib = ctypes.CDLL(str(result.so_path))
            lib.foscar_decode.argtypes = [ctypes.POINTER(_Args), ctypes.c_void_p]
            lib.foscar_decode.restype = ctypes.c_int
            lib.foscar_last_error.restype = ctypes.c_char_p
            _lib = lib
    return _lib


def unit_tokens(group_size: int) -> int:
    """Tokens in one unit of split-KV work: whole quantization groups, at least one chunk."""
    return max(CHUNK_TOKENS, group_size)


def plan_splits(batch: int, num_kv_heads: int, max_units: int, num_sms: int) -> tuple[int, int]:
    """(num_splits, units_per_split) that fill the GPU with the least modelled time.

    One CTA per SM runs at a time (its 8 warps use the whole register file); a CTA's time
    is the units its busiest warp streams plus a fixed cost for its prologue and combine.
    """
    base = batch * num_kv_heads
    max_units = max(1, max_units)
    best = None
    for splits in range(1, min(MAX_SPLITS, max_units) + 1):
        per_split = math.ceil(max_units / splits)
        splits_used = math.ceil(max_units / per_split)
        waves = math.ceil(base * splits_used / num_sms)
        cost = waves * (math.ceil(per_split / WARPS_PER_CTA) + 0.5)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, splits_used, per_split)
    return best[1], best[2]


def unsupported_reason(num_q_heads: int, num_kv_heads: int, head_dim: int, config: QuantConfig,
                       variant: str = "fold", device: torch.device | None = None) -> str | None:
    """Why this build of the kernels cannot run a case, or None when it can."""
    if variant not in VARIANTS:
        return f"variant={variant!r} is not a FOSCAR kernel; expected one of {VARIANTS}"
    if head_dim != 128:
        return f"head_dim={head_dim} is not built; the kernels are instantiated for head_dim 128"
    if num_q_heads % num_kv_heads or not 1 <= num_q_heads // num_kv_heads <= 8:
        return (f"{num_q_heads} query heads over {num_kv_heads} KV heads: the kernels take "
                "1 to 8 query heads per KV head")
    if config.param_dtype != "fp16":
        return f"param_dtype={config.param_dtype!r}: the kernels read fp16 scales and offsets"
    if config.page_size % CHUNK_TOKENS:
        return f"page_size={config.page_size} is not a multiple of {CHUNK_TOKENS}"
    if variant == "dequant" and (config.k_mode, config.v_mode) != ("channel", "token"):
        return "the dequantize-first ablation is built for K channel-wise, V token-wise only"
    if device is not None:
        if device.type != "cuda":
            return f"device {device} is not a CUDA GPU"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) != (9, 0):
            return f"GPU compute capability {major}.{minor}: the kernels are built for Hopper (sm_90a)"
    return None


# Split-KV partials, one buffer per device, grown on demand. Decodes on one device share it,
# so two launches on different streams at once would race: use one stream per device.
_workspaces: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, n_o: int, n_ml: int) -> tuple[torch.Tensor, torch.Tensor]:
    ws = _workspaces.get(device)
    if ws is None or ws[0].numel() < n_o or ws[1].numel() < n_ml:
        ws = (torch.empty(max(n_o, 1), dtype=torch.float32, device=device),
              torch.empty(max(n_ml, 1), dtype=torch.float32, device=device))
        _workspaces[device] = ws
    return ws


def _check_inputs(q: torch.Tensor, cache: QuantizedKVCache, out: torch.Tensor | None, variant: str) -> None:
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise ValueError(f"q has dtype {getattr(q, 'dtype', type(q))}; expected torch.bfloat16.")
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected [batch, num_q_heads, head_dim].")
    batch, num_q_heads, head_dim = q.shape
    if batch != cache.batch or head_dim != cache.head_dim:
        raise ValueError(
            f"q has shape {tuple(q.shape)} but the cache holds batch {cache.batch} and head_dim "
            f"{cache.head_dim}; pass one query row per cached sequence.")
    if not q.is_cuda:
        raise ValueError(f"q is on {q.device}; foscar.decode runs on a CUDA GPU: move q and the cache there.")
    if not q.is_contiguous():
        raise ValueError("q is not contiguous; call q.contiguous() first.")
    for name in ("k_codes", "v_codes", "k_params", "v_params", "page_table", "seq_lens", "k_tail", "v_tail"):
        t = getattr(cache, name)
        if t.device != q.device:
            raise ValueError(f"cache.{name} is on {t.device} but q is on {q.device}; keep them on one GPU.")
        if not t.is_contiguous():
            raise ValueError(f"cache.{name} is not contiguous; rebuild the cache with foscar.quantize.")
    reason = unsupported_reason(num_q_heads, cache.num_kv_heads, head_dim, cache.config, variant, q.device)
    if reason:
        raise ValueError(f"foscar.decode cannot run this case: {reason}.")
    if out is not None and (out.shape != q.shape or out.dtype != torch.bfloat16 or out.device != q.device
                            or not out.is_contiguous()):
        raise ValueError(
            f"out has shape {tuple(out.shape)}, dtype {out.dtype}, device {out.device}; expected a "
            f"contiguous bfloat16 tensor shaped like q {tuple(q.shape)} on {q.device}.")


def launch_plan(cache: QuantizedKVCache, num_sms: int) -> tuple[int, int]:
    """The split plan decode() uses for this cache (exposed for tests and the harness)."""
    max_packed = int(cache.packed_lens.max().item()) if cache.batch else 0
    unit = unit_tokens(cache.config.group_size)
    return plan_splits(cache.batch, cache.num_kv_heads, math.ceil(max_packed / unit), num_sms)


def decode(q: torch.Tensor, cache: QuantizedKVCache, *, sm_scale: float | None = None,
           out: torch.Tensor | None = None, variant: str = "fold",
           num_splits: int | None = None, operand: str | None = None) -> torch.Tensor:
    """One decode step of attention for q [batch, num_q_heads, head_dim] (BF16) over `cache`.

    Returns BF16 [batch, num_q_heads, head_dim]. `variant="dequant"` runs the ablation that
    dequantizes every element before the Tensor Cores instead of folding. `num_splits`
    overrides the split-KV plan (for experiments); `operand` picks the Tensor Core operand
    type, "bf16" (default, or $FOSCAR_OPERAND) or "fp16".
    """
    _check_inputs(q, cache, out, variant)
    operand = operand or DEFAULT_OPERAND
    if operand not in OPERANDS:
        raise ValueError(f"operand={operand!r} (from the argument or $FOSCAR_OPERAND) is not built; "
                         f"expected one of {OPERANDS}.")
    lib = load_library()
    cfg = cache.config
    batch, num_q_heads, head_dim = q.shape
    if out is None:
        out = torch.empty_like(q)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    splits, per_split = _plan_cached(cache, num_sms)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
            raise ValueError(f"num_splits={num_splits!r} is not a split count; pass an int >= 1, "
                             "or None for the automatic plan.")
        max_units = splits * per_split
        per_split = math.ceil(max_units / num_splits)
        splits = math.ceil(max_units / per_split)
    ws_o, ws_ml = _workspace(q.device, batch * num_q_heads * splits * head_dim,
                             batch * num_q_heads * splits * 2)
    args = _Args(
        q.data_ptr(), out.data_ptr(), cache.k_codes.data_ptr(), cache.v_codes.data_ptr(),
        cache.k_params.data_ptr(), cache.v_params.data_ptr(), cache.page_table.data_ptr(),
        cache.seq_lens.data_ptr(), cache.k_tail.data_ptr(), cache.v_tail.data_ptr(),
        ws_o.data_ptr(), ws_ml.data_ptr(),
        batch, num_q_heads, cache.num_kv_heads, head_dim,
        cfg.bits, cfg.group_size, int(cfg.k_mode == "channel"), int(cfg.v_mode == "channel"),
        int(variant == "dequant"), int(operand == "fp16"), cfg.page_size, cache.page_table.shape[1],
        splits, per_split, scale, q.device.index if q.device.index is not None else torch.cuda.current_device(),
    )
    stream = torch.cuda.current_stream(q.device).cuda_stream
    if lib.foscar_decode(ctypes.byref(args), ctypes.c_void_p(stream)) != 0:
        raise RuntimeError(f"foscar.decode: {lib.foscar_last_error().decode()}")
    return out


def _plan_cached(cache: QuantizedKVCache, num_sms: int) -> tuple[int, int]:
    # The plan reads seq_lens back from the GPU once per cache object, not per step, so a
    # decode step inside a CUDA graph capture never synchronizes. After `append` grows the
    # cache in place the plan may be stale; the kernel's last split takes every remaining
    # unit, so a stale plan costs balance, never correctness.
    key = ("_foscar_plan", num_sms)
    plan = getattr(cache, "_plan_memo", None)
    if plan is None or plan[0] != key or plan[2] is not cache.seq_lens:
        plan = (key, launch_plan(cache, num_sms), cache.seq_lens)
        cache._plan_memo = plan
    return plan[1]
