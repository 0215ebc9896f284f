"""Quantized-KV cache configuration: bit width, group size, K/V modes, parameter dtype, page size."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch

Mode = Literal["token", "channel"]
MODES: tuple[str, ...] = ("token", "channel")
BITS: tuple[int, ...] = (2, 4)
GROUP_SIZES: tuple[int, ...] = (32, 64, 128)
PARAM_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class QuantConfig:
    """How one KV cache is quantized and paged (docs/FORMAT.md defines every field)."""

    bits: int = 4
    group_size: int = 128
    k_mode: Mode = "channel"
    v_mode: Mode = "token"
    param_dtype: str = "fp16"
    page_size: int = 128

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits={self.bits!r} is not supported; expected one of {BITS}.")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(
                f"group_size={self.group_size!r} is not supported; expected one of {GROUP_SIZES}."
            )
        for name in ("k_mode", "v_mode"):
            mode = getattr(self, name)
            if mode not in MODES:
                raise ValueError(f"{name}={mode!r} is not a mode; expected 'token' or 'channel'.")
        if self.param_dtype not in PARAM_DTYPES:
            raise ValueError(
                f"param_dtype={self.param_dtype!r} is not supported; expected 'fp16' or 'fp32'."
            )
        if self.page_size <= 0 or self.page_size % self.group_size or self.page_size % 64:
            raise ValueError(
                f"page_size={self.page_size!r} must be a positive multiple of group_size="
                f"{self.group_size} and of 64 (V codes are packed in 64-token blocks); pick "
                f"page_size={max(self.group_size, 64)} for instance."
            )

    @property
    def has_tail(self) -> bool:
        """Channel-wise groups close every group_size tokens; the rest waits in a BF16 tail."""
        return "channel" in (self.k_mode, self.v_mode)

    def tail_len(self, length):
        """Tokens of a `length`-token sequence (an int or a tensor of them) in the BF16 tail;
        the rest is packed in pages."""
        return length % self.group_size if self.has_tail else 0

    @property
    def codes_per_word(self) -> int:
        return 32 // self.bits

    @property
    def torch_param_dtype(self) -> torch.dtype:
        return PARAM_DTYPES[self.param_dtype]

    def check_head_dim(self, head_dim: int) -> None:
        if head_dim not in (64, 128, 256):
            raise ValueError(
                f"head_dim={head_dim} is not supported; expected 64, 128 or 256, the head sizes "
                "the kernels are built for."
            )
        if head_dim % self.group_size and "token" in (self.k_mode, self.v_mode):
            raise ValueError(
                f"group_size={self.group_size} does not divide head_dim={head_dim}, which "
                "token-wise groups need; use a group size that divides head_dim."
            )

    def words_per_tile(self, head_dim: int) -> int:
        """int32 words holding one 16-token x head_dim tile of codes."""
        return 16 * head_dim * self.bits // 32

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def tag(self) -> str:
        """Short name, e.g. 'int4-g128-kc-vt' (K channel-wise, V token-wise)."""
        return f"int{self.bits}-g{self.group_size}-k{self.k_mode[0]}-v{self.v_mode[0]}"
