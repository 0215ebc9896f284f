"""FOSCAR decode attention over 2/4-bit quantized paged KV caches (docs/FORMAT.md is the cache contract)."""
from __future__ import annotations

from foscar.cache import (
    LogicalSequence,
    OutOfPagesError,
    QuantizedKVCache,
    append,
    dequantize,
    logical_view,
    quantize,
)
from foscar.config import QuantConfig

__all__ = [
    "LogicalSequence",
    "OutOfPagesError",
    "QuantConfig",
    "QuantizedKVCache",
    "append",
    "decode",
    "dequantize",
    "logical_view",
    "quantize",
]


def __getattr__(name: str):
    # The kernels module is imported on first use, so `import foscar` works on a CPU-only box.
    if name == "decode":
        from foscar.kernels import decode

        return decode
    raise AttributeError(f"module 'foscar' has no attribute {name!r}")
