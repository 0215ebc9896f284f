"""What reports know about backends: labels, colours, order, which are ours and which is the reference."""
from __future__ import annotations

from dataclasses import dataclass

from core.record import TIMED_STATUSES  # noqa: F401 - re-exported for the figures

REFERENCE = "torch-ref"

# Statuses that carry a time (core.record): `passed`, and `inaccurate` (a third-party
# baseline timed although its accuracy check failed; drawn flagged). A record that failed
# the accuracy gate is `incorrect` (untimed) or `inaccurate` (timed): plots draw both.
GATE_FAILED = ("incorrect", "inaccurate")
FAILED_MARK = dict(marker="X", s=70, edgecolor="red", linewidth=1.3, zorder=7)
FAILED_LABEL = "failed the accuracy gate, untimed (X on the axis, in the backend's colour)"
FLAGGED_LABEL = "timed, accuracy check failed (hollow)"


@dataclass(frozen=True)
class BackendInfo:
    name: str
    label: str
    color: str
    order: int


# Colours: every pair at least 20 apart in CIELAB (tests/reports/test_reports_figures.py
# checks it), so no two backends on one plot look alike. Blues and purples for the
# full-precision and FP8 baselines, pink and plum for NVFP4, greens for BitDecoding,
# oranges for the dequantize-first ablation, reds for ours.
_KNOWN = (
    ("torch-ref", "PyTorch reference (float)", "#7f7f7f"),
    ("flashinfer-bf16", "FlashInfer BF16, CUDA-core", "#17becf"),
    ("flashinfer-bf16-tc", "FlashInfer BF16, tensor-core", "#1f77b4"),
    ("flashinfer-bf16-fa3", "FlashInfer BF16, fa3", "#aec7e8"),
    ("flashinfer-fp8", "FlashInfer FP8-KV, CUDA-core", "#bcbd22"),
    ("flashinfer-fp8-tc", "FlashInfer FP8-KV, tensor-core", "#6b6ecf"),
    ("trtllm-xqa-fp8", "TensorRT-LLM XQA FP8", "#393b79"),
    ("flashinfer-nvfp4-tc", "FlashInfer NVFP4, tensor-core", "#e377c2"),
    ("trtllm-nvfp4", "TensorRT-LLM NVFP4", "#7b4173"),
    ("bitdecoding-int4", "BitDecoding INT4", "#2ca02c"),
    ("bitdecoding-int2", "BitDecoding INT2", "#98df8a"),
    ("foscar-dequant-int4", "FOSCAR dequant-then-attend INT4", "#ff7f0e"),
    ("foscar-dequant-int2", "FOSCAR dequant-then-attend INT2", "#ffbb78"),
    ("foscar-int4", "FOSCAR INT4 (ours)", "#d62728"),
    ("foscar-int2", "FOSCAR INT2 (ours)", "#67000d"),
    # v2's all-fp16 experiment (removed in v4); labels kept for its records in bundled stores.
    ("foscar-dequant-int4-fp16", "FOSCAR dequant INT4, fp16 operands (exp.)", "#8c564b"),
    ("foscar-dequant-int2-fp16", "FOSCAR dequant INT2, fp16 operands (exp.)", "#dbdb8d"),
    ("foscar-int4-fp16", "FOSCAR INT4, fp16 operands (exp.)", "#fcbba1"),
    ("foscar-int2-fp16", "FOSCAR INT2, fp16 operands (exp.)", "#b35806"),
)
_BY_NAME = {name: BackendInfo(name, label, color, i) for i, (name, label, color) in enumerate(_KNOWN)}
_SPARE_COLORS = ("#9467bd", "#000000", "#005a32", "#fee391", "#737373", "#4a1486")


def info(name: str) -> BackendInfo:
    """A registered backend's label, colour and order; any other name (a removed backend
    in an older store) as itself, in a spare colour, after the known ones."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    color = _SPARE_COLORS[sum(map(ord, name)) % len(_SPARE_COLORS)]
    return BackendInfo(name, name, color, 100)


def label(name: str) -> str:
    return info(name).label


def color(name: str) -> str:
    return info(name).color


def sort_key(name: str) -> tuple[int, str]:
    return info(name).order, name


def is_ours(name: str, family: str | None = None) -> bool:
    """Our fused kernels: the FOSCAR family, excluding the dequantize-then-attend ablation."""
    fam = (family or "").lower()
    return (fam == "foscar" or name.startswith("foscar-")) and "dequant" not in name


def is_baseline(name: str, family: str | None = None) -> bool:
    """Anything timed against ours: every backend but ours, the float reference and the
    harness's test-only stand-ins."""
    return name != REFERENCE and (family or "") != "test" and not is_ours(name, family)


def timed(records):
    """Records with a time: passed, or timed and flagged (TIMED_STATUSES)."""
    return records[records["status"].isin(TIMED_STATUSES) & (records["median_us"] > 0)]


def failed_handle():
    """The legend entry for FAILED_MARK."""
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="none", marker="X", markersize=8, markerfacecolor="white",
                  markeredgecolor="red", markeredgewidth=1.3, label=FAILED_LABEL)


def draw_failed(ax, xs, backends) -> None:
    """FAILED_MARK at each x (data) on the x axis, filled with each backend's colour."""
    import numpy as np

    xs, backends = list(xs), list(backends)
    if xs:
        ax.scatter(xs, np.zeros(len(xs)), transform=ax.get_xaxis_transform(), clip_on=False,
                   color=[color(b) for b in backends], **FAILED_MARK)


def failed_untimed(records):
    """Records that failed the accuracy gate and carry no time: drawn at the axis."""
    return records[records["status"].isin(GATE_FAILED) & ~(records["median_us"] > 0)]
