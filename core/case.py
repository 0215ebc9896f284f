"""The `Case` one decode step is measured on, and the model shapes cases are drawn from.

A new sweep axis is a new field of `Case`, with its default: sweeps, presets and the
`sweep` command take it by its name, records and the store gain its column, and the case
key names it whenever it differs from its default (so older records keep their keys).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

# (num_q_heads, num_kv_heads, head_dim) of one attention layer.
MODELS: dict[str, tuple[int, int, int]] = {
    "llama3-8b": (32, 8, 128),
    "llama3-70b": (64, 8, 128),
}

# Quantization fields a full-precision backend (BF16, FP8) does not use; it sees them
# normalised to these values so that its case is one case whatever the int axes are.
NO_QUANT = {"k_mode": "none", "v_mode": "none", "group_size": 0}

# The fields the model preset sets; every other field is a sweep axis.
SHAPE_FIELDS = ("model", "num_q_heads", "num_kv_heads", "head_dim")
# The fields `Case.key` spells out by hand (the model through its heads); any other field
# joins the key by its name.
_KEYED = ("batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim", "bits", "k_mode", "v_mode",
          "group_size", "page_size", "model", "seed")


@dataclass(frozen=True)
class Case:
    """One decode-attention problem: shapes, the KV format's parameters and the data seed.

    `bits` is the KV storage width the backend runs at (16 BF16, 8 FP8, 4 or 2 packed ints);
    `k_mode`/`v_mode` are 'token' | 'channel' (or 'none' for unquantized formats).
    Every sequence of the batch holds `kv_len` tokens.
    """

    batch: int
    kv_len: int
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    bits: int = 4
    k_mode: str = "channel"
    v_mode: str = "token"
    group_size: int = 128
    page_size: int = 64
    model: str = "llama3-8b"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Case.{name}={value!r} must be a positive integer.")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_q_heads={self.num_q_heads} is not a multiple of num_kv_heads="
                f"{self.num_kv_heads}; GQA needs whole query groups."
            )

    @property
    def key(self) -> str:
        """Stable, readable identity of the case (the store's resume key, with the backend)."""
        quant = (
            f"int{self.bits}-g{self.group_size}-k{self.k_mode[0]}-v{self.v_mode[0]}"
            if self.k_mode != "none"
            else f"b{self.bits}"
        )
        return f"{self.shape_key}-{quant}-p{self.page_size}-s{self.seed}{self.extra_key}"

    @property
    def shape_key(self) -> str:
        """The attention problem without its KV format: what speedups compare across."""
        return (
            f"b{self.batch}-kv{self.kv_len}-h{self.num_q_heads}x{self.num_kv_heads}"
            f"-d{self.head_dim}"
        )

    @property
    def extra_key(self) -> str:
        """'-name<value>' for each field beyond the classic ones that is not at its default."""
        tail = ""
        for f in fields(self):
            if f.name not in _KEYED and getattr(self, f.name) != f.default:
                tail += f"-{f.name}{getattr(self, f.name)}"
        return tail

    @property
    def gqa_ratio(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    def with_(self, **changes: Any) -> "Case":
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Case":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def axes() -> dict[str, tuple[type, Any]]:
    """Every sweep axis: field name -> (int or str, its default; dataclasses.MISSING when
    it has none)."""
    kinds = {"int": int, "str": str}
    return {f.name: (kinds[str(f.type)], f.default) for f in fields(Case) if f.name not in SHAPE_FIELDS}

