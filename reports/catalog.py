"""What reports know about backends: labels, colours, order, which are ours and which is the reference."""
from __future__ import annotations

from dataclasses import dataclass

REFERENCE = "torch-ref"


@dataclass(frozen=True)
class BackendInfo:
    name: str
    label: str
    color: str
    order: int


# Colours: greys/blues for full-precision baselines, greens/oranges for low-bit
# baselines, reds for ours; solid for our fused kernels, lighter for the dequant ablation.
_KNOWN = (
    ("torch-ref", "PyTorch reference (float)", "#7f7f7f"),
    ("flashinfer-bf16", "FlashInfer BF16, CUDA-core", "#9ecae1"),
    ("flashinfer-bf16-tc", "FlashInfer BF16, tensor-core", "#3182bd"),
    ("flashinfer-bf16-fa3", "FlashInfer BF16, fa3", "#c6dbef"),
    ("flashinfer-fp8", "FlashInfer FP8-KV, CUDA-core", "#6baed6"),
    ("flashinfer-fp8-tc", "FlashInfer FP8-KV, tensor-core", "#4292c6"),
    ("trtllm-xqa-fp8", "TensorRT-LLM XQA FP8", "#08519c"),
    ("flashinfer-nvfp4-tc", "FlashInfer NVFP4, tensor-core", "#9e9ac8"),
    ("trtllm-nvfp4", "TensorRT-LLM NVFP4", "#54278f"),
    ("bitdecoding-int4", "BitDecoding INT4", "#31a354"),
    ("bitdecoding-int2", "BitDecoding INT2", "#a1d99b"),
    ("foscar-dequant-int4", "FOSCAR dequant-then-attend INT4", "#fdae6b"),
    ("foscar-dequant-int2", "FOSCAR dequant-then-attend INT2", "#fdd0a2"),
    ("foscar-int4", "FOSCAR INT4 (ours)", "#de2d26"),
    ("foscar-int2", "FOSCAR INT2 (ours)", "#a50f15"),
)
_BY_NAME = {name: BackendInfo(name, label, color, i) for i, (name, label, color) in enumerate(_KNOWN)}
_SPARE_COLORS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf", "#9467bd", "#ff7f0e")


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
