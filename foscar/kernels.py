"""`foscar.decode`: validates its inputs, plans the split-KV launch, and calls libfoscar.so.

The library is bound with ctypes over a plain C struct (foscar/csrc/foscar_api.h) rather
than a torch extension: it builds with nvcc alone in seconds, carries no framework ABI, and
the same shared object is what the SASS analysis reads.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
import math
import threading
from typing import Any, Callable

import torch

from foscar.cache import QuantizedKVCache
from foscar.config import QuantConfig

CTAS_PER_SM = 3  # the planner's default; a launch asks the library's foscar_ctas_per_sm for its instance
CHUNK_TOKENS = 64
MAX_SPLITS = 64  # the planner's, where MAX_ITEM_CHUNKS does not ask for more
MAX_FORCED_SPLITS = 128  # the kernels' (foscar_dispatch.h: the split merge's shared-memory weights)
# The longest split, in chunks, by bit width. Until v16 an item kept its token-wise V offsets and
# the injection's bias (1024 sum p~ / f) in its fp32 output until it ended, so the error grew with
# the item (INT2 5.2e-3 at 128K tokens, over the gate's 4e-3) and splits were held to 32K tokens
# (INT2) and 64K (INT4). v16-v22 took those sums out every 32 trips, and since v23 the V operands
# carry no bias at all; items of 128K tokens measured 1.70e-3 for both widths with the flush, as
# short ones (docs/PERFORMANCE.md, v15, v16 and v23; foscar.precision.v7_items and v23_items
# model them). The limit stays at what was measured.
MAX_ITEM_CHUNKS = {2: 2048, 4: 2048}
# The planner's costs, in chunk times: a work item's setup and finish beside its chunks, and the
# merge of a sequence's splits. 4 fits split counts forced at six shapes, 3 and 4 CTAs per SM
# (docs/data/lab_v14_splits.json); 1.5 over-split at 4 CTAs (up to 12 % slower). The merge reads
# every split's partial, so it grows with their count: 0.09 a split fits batch 1's one-head
# kernels at four CTAs, where 64 splits of one chunk ran 18 % slower than 32 of two at 4K tokens
# and 64 of four level with 43 of six at 16K (docs/data/lab_v35_splits_b1_kv*.json).
ITEM_OVERHEAD_CHUNKS = 4.0
MERGE_CHUNKS = 1.0
MERGE_CHUNKS_PER_SPLIT = 0.09
# A kernel with a second instance at another CTA count (foscar_ctas_per_sm_alt: v37, batch 1-5's
# one-head kernels of the paper's mode and INT2's token/token at four CTAs beside three) runs it
# where that instance's plan gives a split at least this many chunks: four CTAs were 3-8 % faster
# from 8 chunks a split (batch 1 from 32K, batches 2-5 at 8K and 32K) and 1-7 % slower with 1-6
# (batch 1 at 2K-16K, batch 2 at 2K; docs/PERFORMANCE.md, nineteenth session).
ALT_MIN_CHUNKS = 8
# The widths whose kernels may take their second instance, by GPU: the first entry whose name is a
# substring of the device's name, else both. On an H100 SXM, INT4's four-CTA instance ran 1-5 %
# slower than its own three-CTA one wherever the planner took it (batch 1 at 32K-128K, batches 2
# and 4 at 32K, batch 4 at 128K) while INT2's ran 1.5-7 % faster; on the H200 both gained (v37)
# (docs/PERFORMANCE.md, twenty-fifth session). The H200's greater bandwidth wants more bytes in
# flight than the H100's.
SECOND_INSTANCE_WIDTHS: tuple[tuple[str, tuple[int, ...]], ...] = (("H100 80GB HBM3", (2,)),)


# Where a GPU was measured apart (GPU name, (rows, CTAs per SM)): a launch of at most `rows` work
# rows (sequence, KV head; a paired item's two heads count once) plans its kernel's own instance
# for at most that many CTAs per SM (the instance is the same; each SM then holds fewer of its
# CTAs, each a longer split). On an H100 SXM (twenty-eighth session) batch 1 and 2 over 8 KV heads
# ran up to 15 % faster with about two items per SM than with the three-CTA plan's one per slot:
# forced counts beside the planner (GPU-5638f44e, v40, docs/data/lab_splits_b1_b4_v40_h100.tar.gz),
# then the rule's launch beside the plan it replaced (GPU-fe45986f, v41,
# docs/data/lab_splits_planner_h100.tar.gz): INT4 b1 at 8K-32K 8-9 %, b2 at 4K and 8K 13 and 9 %,
# INT2 where its own instance runs 4-11 %, b2 / 128K 0.9 % slower. The planner's model prices an
# item's setup and finish on its own CTA only, while the CTAs of an SM share its issue slots, and
# two of them already keep the H100's bus as busy as three. Past 16 rows the two-CTA count was
# mixed (b4 / 4K 9 % faster, b5 / 16K 6 % slower). Elsewhere (other GPUs, more rows) the
# kernel's own count. The H200 showed the same pattern at the one shape where the rule's launch
# was timed (batch 2 / 4K at 16 splits 12-13 % faster than the plan's 22; twenty-ninth session,
# docs/data/lab_splits_b1_b2_v41_h200.tar.gz) but has no row until its other shapes are timed.
SMALL_LAUNCH_CTAS: tuple[tuple[str, tuple[int, int]], ...] = (("H100 80GB HBM3", (16, 2)),)


def planned_ctas_per_sm(gpu_name: str | None, rows: int, ctas_per_sm: int) -> int:
    """CTAs per SM the planner sizes the splits of a launch of `rows` (sequence, KV head) work
    rows for, on the GPU named `gpu_name`, for an instance of `ctas_per_sm` (SMALL_LAUNCH_CTAS)."""
    rule = _for_gpu(SMALL_LAUNCH_CTAS, gpu_name)
    return min(ctas_per_sm, rule[1]) if rule and rows <= rule[0] else ctas_per_sm


def _for_gpu(table: tuple[tuple[str, Any], ...], gpu_name: str | None) -> Any:
    """The value of the first (GPU name, value) entry of `table` whose name is a substring of
    `gpu_name` (torch.cuda.get_device_properties(...).name), or None."""
    return next((value for needle, value in table if gpu_name and needle.lower() in gpu_name.lower()), None)


def second_instance_widths(gpu_name: str | None) -> tuple[int, ...]:
    """The code widths whose kernels may run their second instance on the GPU named `gpu_name`
    (None or unknown: both)."""
    return _for_gpu(SECOND_INSTANCE_WIDTHS, gpu_name) or (2, 4)


VARIANTS = ("fold", "dequant")
# Lab knob FOSCAR_TIMELINE (foscar_decode.cuh, TimelinePhase): per CTA and each of its first
# TIMELINE_ITEMS items, one %globaltimer stamp (ns) per phase, in this order; 0 where not reached.
TIMELINE_ITEMS = 4
TIMELINE_PHASES = ("entry", "item", "first_copy", "first_s", "last_trip", "folded", "stored", "written", "counted",
                   "merge_fenced", "merge_weighted", "merged", "quarter1", "half", "quarter3", "scaled")


class _Args(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p), ("o", ctypes.c_void_p),
        ("k_codes", ctypes.c_void_p), ("v_codes", ctypes.c_void_p),
        ("k_params", ctypes.c_void_p), ("v_params", ctypes.c_void_p),
        ("page_table", ctypes.c_void_p), ("seq_lens", ctypes.c_void_p),
        ("k_tail", ctypes.c_void_p), ("v_tail", ctypes.c_void_p),
        ("ws_o", ctypes.c_void_p), ("ws_ml", ctypes.c_void_p), ("ws_count", ctypes.c_void_p),
        ("batch", ctypes.c_int32), ("num_q_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("bits", ctypes.c_int32), ("group_size", ctypes.c_int32),
        ("k_channel", ctypes.c_int32), ("v_channel", ctypes.c_int32), ("dequant", ctypes.c_int32),
        ("page_size", ctypes.c_int32), ("max_pages", ctypes.c_int32),
        ("num_splits", ctypes.c_int32), ("units_per_split", ctypes.c_int32),
        ("num_ctas", ctypes.c_int32), ("kv_heads_per_item", ctypes.c_int32),
        ("sm_scale", ctypes.c_float), ("device", ctypes.c_int32),
        ("timeline", ctypes.c_void_p),
        # The retired stolen tail's (v36), kept so that later fields stay in place: must be 0.
        ("reserved0", ctypes.c_int32), ("reserved1", ctypes.c_int32),
        ("ctas_per_sm", ctypes.c_int32),
    ]


_libs: dict[tuple, ctypes.CDLL] = {}
_lib_lock = threading.Lock()


def load_library(arch: str | None = None, defines: tuple[str, ...] = ()):
    """Builds libfoscar.so if the cache lacks it (first call only) and loads it.

    `defines` selects a build with kernel knobs set (foscar_decode.cuh; for experiments such
    as scripts/kernel_lab.py); each distinct set is its own library.
    """
    from foscar.build import build, detect_arch

    arch = arch or detect_arch() or "sm_90a"
    key = (arch, tuple(defines))
    with _lib_lock:
        if key not in _libs:
            _libs[key] = bind(ctypes.CDLL(str(build(arch, defines=defines).so_path)), "foscar")
        return _libs[key]


def bind(lib: ctypes.CDLL, prefix: str) -> ctypes.CDLL:
    """Declares the C API's prototypes on a loaded library (`foscar` on the GPU library,
    `foscar_emu` on the host emulation, whose decode takes no stream)."""
    decode = getattr(lib, f"{prefix}_decode")
    decode.argtypes = [ctypes.POINTER(_Args)] + ([ctypes.c_void_p] if prefix == "foscar" else [])
    decode.restype = ctypes.c_int
    getattr(lib, f"{prefix}_last_error").restype = ctypes.c_char_p
    ctas = getattr(lib, f"{prefix}_ctas_per_sm")
    ctas.argtypes = [ctypes.c_int] * 6
    ctas.restype = ctypes.c_int
    try:  # libraries built before v37 (kernel_lab --prebuilt) have no second instances
        alt = getattr(lib, f"{prefix}_ctas_per_sm_alt")
        alt.argtypes = [ctypes.c_int] * 6
        alt.restype = ctypes.c_int
    except AttributeError:
        setattr(lib, f"{prefix}_ctas_per_sm_alt", lambda *instance: 0)
    heads = getattr(lib, f"{prefix}_kv_heads_per_item")
    heads.argtypes = [ctypes.c_int, ctypes.c_int]
    heads.restype = ctypes.c_int
    return lib


@dataclass(frozen=True)
class LaunchPlan:
    """How one decode launch covers the work: splits per (sequence, KV head), 64-token chunks
    per split, and the persistent CTAs that loop over the items (batch * KV heads / KV heads
    per item, times the splits)."""

    num_splits: int
    chunks_per_split: int
    num_ctas: int
    ctas_per_sm: int = 0  # the instance launched: 0 the kernel's own, else its second's count (ALT_MIN_CHUNKS)


# Two KV heads per item (where the library can pair them) from this many (sequence, KV head)
# rows on: paired trips cost 5-12 % less per head at batch 32 and 128, but an item holds twice
# the work, so a small batch splits each sequence twice as finely and pays the per-item and merge
# costs twice: batch 1 at 32K and 128K measured 16-26 % slower paired, batch 8 (64 rows) level
# at 32K and 2-6 % faster at 128K (docs/PERFORMANCE.md, "Paired heads").
PAIR_MIN_KV_ROWS = 48
# Where a GPU was measured apart (GPU name, {bits: (rows, rows x chunks)}): pair from that many
# (sequence, KV head) rows and that much work on. On an H100 (GPU-cdd9534b, twenty-sixth session,
# docs/data/lab_hpi_h100.tar.gz) INT4's one-head launches ran 2.5-15 % faster than its paired
# ones at batch 4-16 up to 128 rows (level at batch 8 / 128K), while INT2's paired ones won
# 2-13 % from 16384 rows x chunks (batch 4 / 32K, batch 8 from 16K) and lost 2-10 % below it
# (batch 8 / 4K and 8K, batch 6 / 16K). On the H200 (GPU-23e5a4d9, v41, twenty-ninth session,
# docs/data/lab_hpi_h200.tar.gz) INT2 followed the same rule (paired 2-13 % faster from 16384,
# 3-10 % slower below it but for batch 16 / 4K, 1 % off), and INT4's paired launches won only
# from 32768 rows x chunks (batch 8 at 32K and 128K, 1 and 5 %): one head ran 2.4-12 % faster at
# batch 4-32 below it (batch 8 / 4K 12 %, batch 6 / 16K 9 %, batch 32 / 4K 3 %). Elsewhere
# PAIR_MIN_KV_ROWS.
PAIRING_RULES: tuple[tuple[str, dict[int, tuple[int, int]]], ...] = (
    ("H100 80GB HBM3", {4: (256, 0), 2: (32, 16384)}),
    ("H200", {4: (64, 32768), 2: (32, 16384)}),
)


def pairing_rule(gpu_name: str | None, bits: int | None) -> tuple[int, int]:
    """(rows, rows x chunks) from which the planner pairs KV heads for `bits`-bit codes on the GPU
    named `gpu_name` (PAIRING_RULES; None or unknown: PAIR_MIN_KV_ROWS rows, any work)."""
    return (_for_gpu(PAIRING_RULES, gpu_name) or {}).get(bits, (PAIR_MIN_KV_ROWS, 0))


def planned_kv_heads_per_item(batch: int, num_kv_heads: int, max_heads: int, *, bits: int | None = None,
                              max_chunks: int = 0, gpu_name: str | None = None) -> int:
    """KV heads per work item for a launch: `max_heads` (the library's foscar_kv_heads_per_item)
    once batch * num_kv_heads rows, and those rows times the longest sequence's `max_chunks`,
    reach the GPU's pairing_rule for `bits`-bit codes; else 1."""
    if max_heads <= 1:
        return 1
    rows = batch * num_kv_heads
    min_rows, min_work = pairing_rule(gpu_name, bits)
    return max_heads if rows >= min_rows and rows * max_chunks >= min_work else 1


def plan_launch(batch: int, num_kv_heads: int, max_chunks: int, num_sms: int,
                ctas_per_sm: int = CTAS_PER_SM, kv_heads_per_item: int = 1,
                max_item_chunks: int = MAX_ITEM_CHUNKS[2]) -> LaunchPlan:
    """The plan with the least modelled time: the busiest CTA's items, each its chunks plus a
    fixed cost, plus the merge when a sequence is split (batch 1 splits to fill the GPU; a
    full batch splits only where that evens out the last round of items), with no split over
    `max_item_chunks` (exactness: MAX_ITEM_CHUNKS of the bit width; past MAX_FORCED_SPLITS
    such splits, millions of tokens, splits grow). An item covers
    `kv_heads_per_item` KV heads (the library's foscar_kv_heads_per_item); its chunk costs
    about as much as one head's."""
    slots = num_sms * ctas_per_sm
    base = batch * (num_kv_heads // kv_heads_per_item)
    max_chunks = max(1, max_chunks)
    fewest = min(math.ceil(max_chunks / max_item_chunks), MAX_FORCED_SPLITS)  # no split over max_item_chunks
    best = None
    for splits in range(fewest, max(fewest, min(MAX_SPLITS, max_chunks)) + 1):
        per_split = math.ceil(max_chunks / splits)
        used = math.ceil(max_chunks / per_split)
        items = base * used
        ctas = min(items, slots)
        rounds = math.ceil(items / ctas)
        cost = rounds * (per_split + ITEM_OVERHEAD_CHUNKS) + (MERGE_CHUNKS + MERGE_CHUNKS_PER_SPLIT * used if used > 1 else 0.0)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, LaunchPlan(used, per_split, ctas))
    return best[1]


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
    if variant == "dequant" and (config.k_mode, config.v_mode) != ("channel", "token"):
        return "the dequantize-first ablation is built for K channel-wise, V token-wise only"
    if device is not None:
        if device.type != "cuda":
            return f"device {device} is not a CUDA GPU"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) != (9, 0):
            return f"GPU compute capability {major}.{minor}: the kernels are built for Hopper (sm_90a)"
    return None


# Split-KV partials and per-(sequence, KV head) arrival counters, one set per device, grown
# on demand. The counters start at zero and the kernel leaves them at zero (the last split
# resets its counter). Decodes on one device share the set, so two launches on different
# streams at once would race: use one stream per device. A CUDA graph holds the addresses of
# the set its decode was captured with, so a set outgrown is kept (_retired_workspaces), never
# freed: a graph replayed after a larger decode still writes its own buffers.
_workspaces: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
_retired_workspaces: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
# After the counters, lab knob FOSCAR_COOP_MERGE's sense words, one per (sequence, KV head), this
# many words apart (kSenseStride, foscar_decode.cuh): an L2 line each.
SENSE_STRIDE = 32


def _workspace(device: torch.device, n_o: int, n_ml: int, n_count: int):
    ws = _workspaces.get(device)
    if ws is None or ws[0].numel() < n_o or ws[1].numel() < n_ml or ws[2].numel() < n_count:
        if ws is not None:
            _retired_workspaces.append(ws)
            # Grown at least twofold, so that a run of growing decodes retires few sets.
            n_o, n_ml, n_count = (max(n, 2 * old.numel()) if n > old.numel() else old.numel()
                                  for n, old in zip((n_o, n_ml, n_count), ws))
        ws = (torch.empty(max(n_o, 1), dtype=torch.float32, device=device),
              torch.empty(max(n_ml, 1), dtype=torch.float32, device=device),
              torch.zeros(max(n_count, 1), dtype=torch.int32, device=device))
        _workspaces[device] = ws
    return ws


def _check_inputs(q: torch.Tensor, cache: QuantizedKVCache, out: torch.Tensor | None, variant: str,
                  on_gpu: bool = True) -> None:
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise ValueError(f"q has dtype {getattr(q, 'dtype', type(q))}; expected torch.bfloat16.")
    if q.dim() != 3:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected [batch, num_q_heads, head_dim].")
    batch, num_q_heads, head_dim = q.shape
    if batch != cache.batch or head_dim != cache.head_dim:
        raise ValueError(
            f"q has shape {tuple(q.shape)} but the cache holds batch {cache.batch} and head_dim "
            f"{cache.head_dim}; pass one query row per cached sequence.")
    if on_gpu and not q.is_cuda:
        raise ValueError(f"q is on {q.device}; foscar.decode runs on a CUDA GPU: move q and the cache there.")
    if not on_gpu and q.device.type != "cpu":
        raise ValueError(f"q is on {q.device}; the host emulation reads CPU tensors: move q and the cache there.")
    if not q.is_contiguous():
        raise ValueError("q is not contiguous; call q.contiguous() first.")
    for name in ("k_codes", "v_codes", "k_params", "v_params", "page_table", "seq_lens", "k_tail", "v_tail"):
        t = getattr(cache, name)
        if t.device != q.device:
            raise ValueError(f"cache.{name} is on {t.device} but q is on {q.device}; keep them on one GPU.")
        if not t.is_contiguous():
            raise ValueError(f"cache.{name} is not contiguous; rebuild the cache with foscar.quantize.")
    # The kernels read these as raw pointers of one type each (docs/FORMAT.md): another dtype
    # would be read bit for bit as the wrong numbers.
    cfg = cache.config
    expected = {"k_codes": torch.int32, "v_codes": torch.int32, "k_params": cfg.torch_param_dtype,
                "v_params": cfg.torch_param_dtype, "page_table": torch.int32, "seq_lens": torch.int32,
                "k_tail": torch.bfloat16, "v_tail": torch.bfloat16}
    for name, dtype in expected.items():
        t = getattr(cache, name)
        if t.dtype != dtype:
            raise ValueError(f"cache.{name} has dtype {t.dtype}; the kernels read {dtype}: convert it "
                             f"(e.g. cache.{name} = cache.{name}.to({dtype})) or rebuild the cache with foscar.quantize.")
    if cache.page_table.dim() != 2 or tuple(cache.seq_lens.shape) != (cache.batch,):
        raise ValueError(f"cache.seq_lens has shape {tuple(cache.seq_lens.shape)} and cache.page_table "
                         f"{tuple(cache.page_table.shape)}; expected [batch] and [batch, max_pages_per_seq] with "
                         f"batch={cache.batch}: rebuild the cache with foscar.quantize.")
    reason = unsupported_reason(num_q_heads, cache.num_kv_heads, head_dim, cache.config, variant,
                                q.device if on_gpu else None)
    if reason:
        raise ValueError(f"foscar.decode cannot run this case: {reason}.")
    if out is not None and (out.shape != q.shape or out.dtype != torch.bfloat16 or out.device != q.device
                            or not out.is_contiguous()):
        raise ValueError(
            f"out has shape {tuple(out.shape)}, dtype {out.dtype}, device {out.device}; expected a "
            f"contiguous bfloat16 tensor shaped like q {tuple(q.shape)} on {q.device}.")


def launch_plan(cache: QuantizedKVCache, num_sms: int, ctas_per_sm: int = CTAS_PER_SM,
                kv_heads_per_item: int = 1) -> LaunchPlan:
    """The plan decode() uses for this cache (exposed for tests and the harness)."""
    return plan_launch(cache.batch, cache.num_kv_heads, max_chunks(cache), num_sms, ctas_per_sm,
                       kv_heads_per_item, MAX_ITEM_CHUNKS[cache.config.bits])


def max_chunks(cache: QuantizedKVCache) -> int:
    """The most 64-token chunks any sequence of the cache holds in pages (reads seq_lens back)."""
    max_packed = int(cache.packed_lens.max().item()) if cache.batch else 0
    return math.ceil(max_packed / CHUNK_TOKENS)


def decode(q: torch.Tensor, cache: QuantizedKVCache, *, sm_scale: float | None = None,
           out: torch.Tensor | None = None, variant: str = "fold",
           num_splits: int | None = None, library: ctypes.CDLL | None = None,
           kv_heads_per_item: int | None = None, timeline: torch.Tensor | None = None,
           second_instance: bool = True) -> torch.Tensor:
    """One decode step of attention for q [batch, num_q_heads, head_dim] (BF16) over `cache`.

    Returns BF16 [batch, num_q_heads, head_dim]. `variant="dequant"` runs the ablation that
    dequantizes every element before the Tensor Cores instead of folding. `num_splits`
    overrides the split-KV plan (for experiments); `library` runs a build from
    load_library(defines=...) instead of the default one (kernel experiments);
    `kv_heads_per_item` (1 or 2) overrides the planner's pairing of KV heads (tests).
    `timeline`, with a library built with -DFOSCAR_TIMELINE=1 only, receives the launch's
    per-CTA phase stamps: zeroed int64 on q's device, TIMELINE_ITEMS x len(TIMELINE_PHASES) per
    CTA of decode_plan(...).num_ctas (scripts/kernel_lab.py --timeline).
    `second_instance=False` launches the kernel's own instance wherever the planner would take its
    second (resolve_plan): what a library without second instances runs, from the same library
    (scripts/kernel_lab.py --instances). The planner takes a second instance only for the widths
    second_instance_widths gives the GPU.
    """
    _check_inputs(q, cache, out, variant)
    lib = library or load_library()
    out = torch.empty_like(q) if out is None else out
    props = torch.cuda.get_device_properties(q.device)
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    args = launch_args(q, cache, out, sm_scale=sm_scale, variant=variant, num_splits=num_splits,
                       num_sms=props.multi_processor_count, ctas_per_sm=lib.foscar_ctas_per_sm,
                       alt_ctas_per_sm=lib.foscar_ctas_per_sm_alt, second_instance=second_instance,
                       gpu_name=props.name,
                       max_kv_heads_per_item=lib.foscar_kv_heads_per_item(q.shape[1], cache.num_kv_heads),
                       kv_heads_per_item=kv_heads_per_item,
                       workspace=lambda *sizes: _workspace(q.device, *sizes), device=device, timeline=timeline)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    if lib.foscar_decode(ctypes.byref(args), ctypes.c_void_p(stream)) != 0:
        ws = _workspaces.get(q.device)
        if ws is not None:  # a failed launch may leave counters behind (the buffers stay: graphs may hold them)
            try:
                ws[2].zero_()
            except RuntimeError:  # the context itself failed: the launch's error below says why
                pass
        raise RuntimeError(f"foscar.decode: {lib.foscar_last_error().decode()}")
    return out


def decode_plan(q: torch.Tensor, cache: QuantizedKVCache, *, variant: str = "fold", num_splits: int | None = None,
                library: ctypes.CDLL | None = None, kv_heads_per_item: int | None = None,
                second_instance: bool = True) -> LaunchPlan:
    """The plan decode() launches with the same arguments (its num_ctas sizes a timeline)."""
    return _device_plan(q, cache, variant=variant, num_splits=num_splits, library=library,
                        kv_heads_per_item=kv_heads_per_item, second_instance=second_instance)[1]


def plan_note(q: torch.Tensor, cache: QuantizedKVCache, *, variant: str = "fold", num_splits: int | None = None,
              library: ctypes.CDLL | None = None, kv_heads_per_item: int | None = None,
              second_instance: bool = True) -> str:
    """The launch decode() makes with the same arguments, in words (a record's notes: a planner
    change shows in the results it moves)."""
    lib = library or load_library()
    heads, plan = _device_plan(q, cache, variant=variant, num_splits=num_splits, library=lib,
                               kv_heads_per_item=kv_heads_per_item, second_instance=second_instance)
    own = lib.foscar_ctas_per_sm(*kernel_instance(cache.config, variant), heads)
    return describe_plan(heads, plan, own, forced=num_splits is not None)


def describe_plan(kv_heads_per_item: int, plan: LaunchPlan, own_ctas_per_sm: int, forced: bool = False) -> str:
    """'32 splits x 16 chunks, 256 CTAs of the 3-an-SM instance, 1 KV head an item' (and whose
    split count it is: the planner's or forced)."""
    ctas = plan.ctas_per_sm or own_ctas_per_sm
    which = "second" if plan.ctas_per_sm else "own"
    heads = f"{kv_heads_per_item} KV head{'s' if kv_heads_per_item > 1 else ''} an item"
    return (f"{plan.num_splits} splits ({'forced' if forced else 'planned'}) x {plan.chunks_per_split} chunks, "
            f"{plan.num_ctas} CTAs of the {ctas}-an-SM ({which}) instance, {heads}")


def _device_plan(q: torch.Tensor, cache: QuantizedKVCache, *, variant: str, num_splits: int | None,
                 library: ctypes.CDLL | None, kv_heads_per_item: int | None,
                 second_instance: bool) -> tuple[int, LaunchPlan]:
    lib = library or load_library()
    props = torch.cuda.get_device_properties(q.device)
    return resolve_plan(cache, q.shape[1], variant=variant, num_splits=num_splits,
                        num_sms=props.multi_processor_count,
                        ctas_per_sm=lib.foscar_ctas_per_sm, alt_ctas_per_sm=lib.foscar_ctas_per_sm_alt,
                        second_instance=second_instance, gpu_name=props.name,
                        max_kv_heads_per_item=lib.foscar_kv_heads_per_item(q.shape[1], cache.num_kv_heads),
                        kv_heads_per_item=kv_heads_per_item)


def timeline_entries(num_ctas: int) -> int:
    """Stamps of a timeline for a launch of `num_ctas` CTAs (lab knob FOSCAR_TIMELINE)."""
    return num_ctas * TIMELINE_ITEMS * len(TIMELINE_PHASES)


def kernel_instance(cfg: QuantConfig, variant: str) -> tuple[int, int, int, int, int]:
    """The kernel instance, as the C API names it: bits, group, K channel, V channel, dequant."""
    return (cfg.bits, cfg.group_size, int(cfg.k_mode == "channel"), int(cfg.v_mode == "channel"),
            int(variant == "dequant"))


def resolve_plan(cache: QuantizedKVCache, num_q_heads: int, *, variant: str, num_splits: int | None, num_sms: int,
                 ctas_per_sm: int | Callable[..., int], max_kv_heads_per_item: int = 1,
                 kv_heads_per_item: int | None = None,
                 alt_ctas_per_sm: int | Callable[..., int] = 0, second_instance: bool = True,
                 gpu_name: str | None = None) -> tuple[int, LaunchPlan]:
    """The KV heads per item and the plan of one launch: the planner's, or its chunks over a
    forced `num_splits`. `ctas_per_sm` and `alt_ctas_per_sm` as in launch_args: where the kernel
    has a second instance and its plan's splits are at least ALT_MIN_CHUNKS long, the plan is
    that instance's (its `ctas_per_sm` field says which), unless `second_instance` is False or
    the GPU named `gpu_name` keeps the cache's width off it (second_instance_widths). The own
    instance's plan is sized for planned_ctas_per_sm of the GPU (fewer CTAs per SM for small
    launches on an H100)."""
    if not isinstance(second_instance, bool):
        raise ValueError(f"second_instance={second_instance!r} is not a bool; pass True (the planner may launch "
                         f"a kernel's second instance) or False (always its own).")
    cfg = cache.config
    if not second_instance or cfg.bits not in second_instance_widths(gpu_name):
        alt_ctas_per_sm = 0
    instance = kernel_instance(cfg, variant)
    if kv_heads_per_item is None:
        kv_heads_per_item = planned_kv_heads_per_item(cache.batch, cache.num_kv_heads, max_kv_heads_per_item,
                                                      bits=cfg.bits, max_chunks=_memo(cache)[1], gpu_name=gpu_name)
    elif kv_heads_per_item not in (1, max_kv_heads_per_item):
        raise ValueError(f"kv_heads_per_item={kv_heads_per_item!r} is not possible for {num_q_heads} query heads "
                         f"over {cache.num_kv_heads} KV heads with this build; pass 1, "
                         f"{max_kv_heads_per_item} or None for the planner's choice.")
    if callable(ctas_per_sm):
        ctas_per_sm = ctas_per_sm(*instance, kv_heads_per_item)
        if ctas_per_sm < 1:
            raise ValueError(f"the library builds no {variant} kernel for {cfg.bits}-bit codes, group_size="
                             f"{cfg.group_size}, K {cfg.k_mode}-wise, V {cfg.v_mode}-wise with {kv_heads_per_item} "
                             f"KV head(s) per item; check foscar.kernels.unsupported_reason first.")
    if callable(alt_ctas_per_sm):
        alt_ctas_per_sm = max(0, alt_ctas_per_sm(*instance, kv_heads_per_item))
    if num_splits is None and alt_ctas_per_sm:
        alt = _plan_cached(cache, num_sms, alt_ctas_per_sm, kv_heads_per_item)
        if alt.chunks_per_split >= ALT_MIN_CHUNKS:
            return kv_heads_per_item, replace(alt, ctas_per_sm=alt_ctas_per_sm)
    rows = cache.batch * (cache.num_kv_heads // kv_heads_per_item)
    plan = _plan_cached(cache, num_sms, planned_ctas_per_sm(gpu_name, rows, ctas_per_sm), kv_heads_per_item)
    if num_splits is None:
        return kv_heads_per_item, plan
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= MAX_FORCED_SPLITS:
        raise ValueError(f"num_splits={num_splits!r} is not a split count; pass an int from 1 to "
                         f"{MAX_FORCED_SPLITS} (what the split merge holds), or None for the automatic plan.")
    # The cache's own chunk count (not the plan's splits x chunks, which rounds up): the forced
    # count is split over what the longest sequence holds.
    total = max(1, _memo(cache)[1])
    per_split = math.ceil(total / num_splits)
    splits = math.ceil(total / per_split)
    longest = MAX_ITEM_CHUNKS[cfg.bits]
    if per_split > max(longest, plan.chunks_per_split):
        raise ValueError(
            f"num_splits={num_splits} leaves {per_split} chunks ({per_split * CHUNK_TOKENS} tokens) in a split; "
            f"the {cfg.bits}-bit kernels hold the gate's accuracy up to {longest} chunks a split: pass at "
            f"least {math.ceil(total / longest)}, or None for the automatic plan.")
    chosen = alt_ctas_per_sm if alt_ctas_per_sm and per_split >= ALT_MIN_CHUNKS else 0
    ctas = min(cache.batch * (cache.num_kv_heads // kv_heads_per_item) * splits, num_sms * (chosen or ctas_per_sm))
    return kv_heads_per_item, LaunchPlan(splits, per_split, ctas, chosen)


def launch_args(q: torch.Tensor, cache: QuantizedKVCache, out: torch.Tensor, *, sm_scale: float | None,
                variant: str, num_splits: int | None, num_sms: int, ctas_per_sm: int | Callable[..., int],
                workspace, device: int = 0, max_kv_heads_per_item: int = 1,
                kv_heads_per_item: int | None = None, timeline: torch.Tensor | None = None,
                alt_ctas_per_sm: int | Callable[..., int] = 0, second_instance: bool = True,
                gpu_name: str | None = None) -> _Args:
    """The C ABI's argument struct for one decode (shared by the GPU path and foscar.emu).

    `ctas_per_sm` is a count, or the library's foscar_ctas_per_sm, asked for the kernel instance
    this launch runs (instances of one build may hold different numbers of CTAs per SM);
    `alt_ctas_per_sm` likewise the count of the kernel's second instance, or 0 (none), or the
    library's foscar_ctas_per_sm_alt, and `second_instance` whether the planner may take it on
    the GPU named `gpu_name` (see resolve_plan; None: any width may).

    `workspace(n_o, n_ml, n_count)` returns the split-KV partial buffers and the arrival
    counters, zeroed (their first batch x num_kv_heads words; the sense words after them may hold
    anything); the struct holds raw pointers, so the caller keeps every tensor alive until the
    launch has run. `timeline`: see decode().
    """
    cfg = cache.config
    batch, num_q_heads, head_dim = q.shape
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    kv_heads_per_item, plan = resolve_plan(cache, num_q_heads, variant=variant, num_splits=num_splits,
                                           num_sms=num_sms, ctas_per_sm=ctas_per_sm,
                                           max_kv_heads_per_item=max_kv_heads_per_item,
                                           kv_heads_per_item=kv_heads_per_item, alt_ctas_per_sm=alt_ctas_per_sm,
                                           second_instance=second_instance, gpu_name=gpu_name)
    splits, per_split, ctas = plan.num_splits, plan.chunks_per_split, plan.num_ctas
    if timeline is not None and not (isinstance(timeline, torch.Tensor) and timeline.dtype == torch.int64
                                     and timeline.device == q.device and timeline.is_contiguous()
                                     and timeline.numel() == timeline_entries(ctas)):
        got = (f"{timeline.numel()} elements of {timeline.dtype} on {timeline.device}"
               if isinstance(timeline, torch.Tensor) else type(timeline).__name__)
        raise ValueError(f"timeline has {got}; expected a contiguous torch.int64 tensor of {timeline_entries(ctas)} "
                         f"elements ({ctas} CTAs x {TIMELINE_ITEMS} items x {len(TIMELINE_PHASES)} phases) on "
                         f"{q.device}.")
    ws_o, ws_ml, ws_count = workspace(batch * num_q_heads * splits * head_dim, batch * num_q_heads * splits * 2,
                                      (1 + SENSE_STRIDE) * batch * cache.num_kv_heads)
    return _Args(
        q.data_ptr(), out.data_ptr(), cache.k_codes.data_ptr(), cache.v_codes.data_ptr(),
        cache.k_params.data_ptr(), cache.v_params.data_ptr(), cache.page_table.data_ptr(),
        cache.seq_lens.data_ptr(), cache.k_tail.data_ptr(), cache.v_tail.data_ptr(),
        ws_o.data_ptr(), ws_ml.data_ptr(), ws_count.data_ptr(),
        batch, num_q_heads, cache.num_kv_heads, head_dim,
        *kernel_instance(cfg, variant), cfg.page_size, cache.page_table.shape[1],
        splits, per_split, ctas, kv_heads_per_item, scale, device,
        None if timeline is None else timeline.data_ptr(), 0, 0, plan.ctas_per_sm,  # 0, 0: reserved0, reserved1
    )


def _memo(cache: QuantizedKVCache) -> tuple[torch.Tensor, int, dict]:
    # The plans read seq_lens back from the GPU once per cache object and length, not per step,
    # so a decode step inside a CUDA graph capture never synchronizes: (seq_lens, the longest
    # sequence's chunks, the plans by (SMs, CTAs per SM, heads per item); a kernel with a second
    # instance plans both). foscar.append drops the memo (forget_plans), so the next decode plans
    # the grown lengths. A graph captures its launch's plan: replayed while the cache grows in
    # place (foscar.append_graph), the kernel's last split takes every chunk past the plan's, so
    # a stale plan costs balance; plan before a growth that would take a split past
    # MAX_ITEM_CHUNKS (the accuracy limit), i.e. capture again.
    memo = getattr(cache, "_plan_memo", None)
    if memo is None or memo[0] is not cache.seq_lens:
        memo = (cache.seq_lens, max_chunks(cache), {})
        cache._plan_memo = memo
    return memo


def forget_plans(cache: QuantizedKVCache) -> None:
    """Drops the plans memoized for `cache` (its lengths changed): the next decode plans afresh."""
    cache._plan_memo = None


def _plan_cached(cache: QuantizedKVCache, num_sms: int, ctas_per_sm: int, kv_heads_per_item: int = 1) -> LaunchPlan:
    _, chunks, plans = _memo(cache)
    key = (num_sms, ctas_per_sm, kv_heads_per_item)
    if key not in plans:
        plans[key] = plan_launch(cache.batch, cache.num_kv_heads, chunks, num_sms, ctas_per_sm, kv_heads_per_item,
                                 MAX_ITEM_CHUNKS[cache.config.bits])
    return plans[key]
