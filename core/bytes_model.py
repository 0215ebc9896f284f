"""The byte and FLOP model: the fewest bytes one decode step must move through device
memory for each KV format, and its FLOPs. Decimal units (1 TB/s = 1e12 B/s), never TiB.

Counted once per step: the KV cache as stored (packed codes, per-group scales and
offsets, BF16 tails, FP8/FP4 scale factors), Q read, O written, and the page table and
sequence lengths. Rows a kernel may over-read (padding in the last page, split-KV partial
results) are not counted: this is the work the problem needs, not what a kernel chose.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Bytes per element of each full-precision dtype used for Q, O and tails.
BF16 = 2
FP16 = 2
INT32 = 4
FORMATS = ("bf16", "fp16", "fp8", "nvfp4", "int")

# Datasheet HBM peaks in TB/s (decimal), the nvbench habit: kept beside the bus-derived
# peak, never instead of it. Matched by substring of the NVML name, first hit wins.
DATASHEET_TBPS: tuple[tuple[str, float], ...] = (
    ("GH200", 4.0),  # before "H200" and "H100", which its name contains
    ("H200", 4.8),
    ("H100 NVL", 3.9),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),  # SXM
    ("B200", 8.0),
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIe", 1.935),
    ("A100", 1.555),  # 40 GB
)


def datasheet_peak_tbps(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    for needle, tbps in DATASHEET_TBPS:
        if needle.lower() in gpu_name.lower():
            return tbps
    return None


def bus_peak_tbps(mem_clock_mhz: float | None, bus_width_bits: int | None) -> float | None:
    """2 (DDR) x memory clock x bus width / 8, in TB/s: 2 x 3201 MHz x 6016 bit = 4.81."""
    if not mem_clock_mhz or not bus_width_bits:
        return None
    return 2 * mem_clock_mhz * 1e6 * bus_width_bits / 8 / 1e12


@dataclass
class Traffic:
    """Bytes of one decode step, by part."""

    kv_codes: int = 0  # K and V values as stored (BF16, FP8, packed 4/2-bit, E2M1)
    kv_params: int = 0  # per-group scale+offset, or FP8 block scale factors
    kv_tail: int = 0  # BF16 tail tokens of channel-wise groups not yet complete
    q: int = 0
    o: int = 0
    metadata: int = 0  # page table + sequence lengths
    flops: int = 0

    @property
    def total(self) -> int:
        return self.kv_codes + self.kv_params + self.kv_tail + self.q + self.o + self.metadata

    @property
    def kv_total(self) -> int:
        return self.kv_codes + self.kv_params + self.kv_tail

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def _common(batch: int, kv_len: int, hq: int, d: int, page_size: int, io_bytes: int) -> dict:
    pages_per_seq = -(-kv_len // page_size)
    return {
        "q": batch * hq * d * io_bytes,
        "o": batch * hq * d * io_bytes,
        "metadata": batch * pages_per_seq * INT32 + batch * INT32,
        "flops": 4 * batch * hq * kv_len * d,  # QK^T and PV, one multiply-add = 2 FLOPs each
    }


def traffic(
    fmt: str,
    *,
    batch: int,
    kv_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int = 64,
    bits: int | None = None,
    group_size: int | None = None,
    k_mode: str | None = None,
    v_mode: str | None = None,
    param_bytes: int = FP16,
    tail_bytes: int = BF16,
    io_bytes: int = BF16,
    nvfp4_block: int = 16,
) -> Traffic:
    """Bytes one decode step must move for a KV format.

    fmt: 'bf16' / 'fp16' (2 B per element), 'fp8' (1 B, per-tensor scales: a few bytes,
    not counted), 'nvfp4' (E2M1 codes at 0.5 B plus one E4M3 scale per `nvfp4_block`
    elements), or 'int' (packed `bits`-bit codes, a (scale, offset) pair of `param_bytes`
    each per group of `group_size`, and a BF16 tail of kv_len mod group_size tokens when K
    or V is channel-wise; docs/FORMAT.md).
    """
    elems = batch * kv_len * num_kv_heads * head_dim  # of K (and again of V)
    t = Traffic(**_common(batch, kv_len, num_q_heads, head_dim, page_size, io_bytes))
    if fmt in ("bf16", "fp16"):
        t.kv_codes = 2 * elems * 2
    elif fmt == "fp8":
        t.kv_codes = 2 * elems
    elif fmt == "nvfp4":
        if elems * 2 % nvfp4_block or head_dim % nvfp4_block:
            raise ValueError(f"head_dim={head_dim} is not a multiple of the NVFP4 block {nvfp4_block}.")
        t.kv_codes = 2 * elems // 2
        t.kv_params = 2 * elems // nvfp4_block  # one E4M3 byte per block
    elif fmt == "int":
        if bits not in (2, 4) or not group_size or k_mode not in ("token", "channel") or v_mode not in (
            "token", "channel"
        ):
            raise ValueError(
                f"int format needs bits in (2, 4), a group size and token/channel modes; got "
                f"bits={bits}, group_size={group_size}, k_mode={k_mode}, v_mode={v_mode}."
            )
        tail_len = kv_len % group_size if "channel" in (k_mode, v_mode) else 0
        packed_len = kv_len - tail_len
        packed = batch * packed_len * num_kv_heads * head_dim
        t.kv_codes = 2 * packed * bits // 8
        # token-wise: head_dim/G groups per token; channel-wise: head_dim groups per G
        # tokens. Both are packed*/G groups per tensor, each a (scale, offset) pair.
        t.kv_params = 2 * (packed // group_size) * 2 * param_bytes
        t.kv_tail = 2 * batch * tail_len * num_kv_heads * head_dim * tail_bytes
    else:
        raise ValueError(f"KV format {fmt!r} is unknown; expected one of {FORMATS}.")
    return t


def traffic_for_case(case: Any, fmt: str) -> Traffic:
    """`traffic` for a core.case.Case in KV format `fmt` (a backend's `kv_format`)."""
    args = dict(
        batch=case.batch, kv_len=case.kv_len, num_q_heads=case.num_q_heads,
        num_kv_heads=case.num_kv_heads, head_dim=case.head_dim, page_size=case.page_size,
    )
    if fmt == "int":
        args.update(bits=case.bits, group_size=case.group_size, k_mode=case.k_mode, v_mode=case.v_mode)
    return traffic(fmt, **args)


def eff_bandwidth_tbps(nbytes: int | float, time_us: float | None) -> float | None:
    if not time_us or time_us <= 0:
        return None
    return nbytes / (time_us * 1e-6) / 1e12


def fraction(value: float | None, peak: float | None) -> float | None:
    if value is None or not peak:
        return None
    return value / peak
