"""Sweep declaration: the `Case` one decode step is measured on, model presets, and the
expansion of a TOML preset plus command-line axes into cases."""
from __future__ import annotations

import itertools
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

PRESET_DIR = Path(__file__).parent / "presets"

# (num_q_heads, num_kv_heads, head_dim) of one attention layer.
MODELS: dict[str, tuple[int, int, int]] = {
    "llama3-8b": (32, 8, 128),
    "llama3-70b": (64, 8, 128),
}

# Quantization fields a full-precision backend (BF16, FP8) does not use; it sees them
# normalised to these values so that its case is one case whatever the int axes are.
NO_QUANT = {"k_mode": "none", "v_mode": "none", "group_size": 0}


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
        return (
            f"b{self.batch}-kv{self.kv_len}-h{self.num_q_heads}x{self.num_kv_heads}"
            f"-d{self.head_dim}-{quant}-p{self.page_size}-s{self.seed}"
        )

    @property
    def gqa_ratio(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def shape_key(self) -> str:
        """The attention problem without its KV format: what speedups compare across."""
        return (
            f"b{self.batch}-kv{self.kv_len}-h{self.num_q_heads}x{self.num_kv_heads}"
            f"-d{self.head_dim}"
        )

    def with_(self, **changes: Any) -> "Case":
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Case":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class SweepSpec:
    """The axes of a sweep; lists expand as a cartesian product."""

    batch: list[int]
    kv_len: list[int]
    models: list[str]  # names in MODELS, or "custom" with the explicit heads below
    bits: list[int]
    k_mode: list[str]
    v_mode: list[str]
    group_size: list[int]
    page_size: int = 64
    seed: int = 0
    backends: list[str] | None = None  # None: every registered backend
    num_q_heads: int | None = None  # explicit shape overrides the model preset
    num_kv_heads: int | None = None
    head_dim: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_AXES: dict[str, Any] = {
    "batch": [128],
    "kv_len": [32768],
    "models": ["llama3-8b"],
    "bits": [4, 2],
    "k_mode": ["channel"],
    "v_mode": ["token"],
    "group_size": [128],
    "page_size": 64,
    "seed": 0,
    "backends": None,
}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by name (suite/presets/<name>.toml) or by path; returns its [sweep] table."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise ValueError(
            f"preset {name_or_path!r} not found; expected one of {preset_names()} or a .toml path."
        )
    with path.open("rb") as f:
        data = tomllib.load(f)
    sweep = data.get("sweep", data)
    unknown = set(sweep) - set(DEFAULT_AXES) - {"num_q_heads", "num_kv_heads", "head_dim", "description"}
    if unknown:
        raise ValueError(f"preset {path.name}: unknown keys {sorted(unknown)}.")
    return sweep


def make_spec(preset: str | None = None, **overrides: Any) -> SweepSpec:
    """Preset axes (or the defaults) with every non-None override applied on top."""
    axes = dict(DEFAULT_AXES)
    if preset:
        axes.update({k: v for k, v in load_preset(preset).items() if k != "description"})
    axes.update({k: v for k, v in overrides.items() if v is not None})
    for name in ("batch", "kv_len", "models", "bits", "k_mode", "v_mode", "group_size"):
        if not isinstance(axes[name], list):
            axes[name] = [axes[name]]
    return SweepSpec(**axes)


def expand(spec: SweepSpec) -> list[Case]:
    """Every case of the spec's cartesian product (before pairing with backends)."""
    shapes: list[tuple[str, int, int, int]] = []
    if spec.num_q_heads or spec.num_kv_heads or spec.head_dim:
        base = MODELS[spec.models[0]] if spec.models and spec.models[0] in MODELS else (32, 8, 128)
        shapes.append(
            (
                "custom",
                spec.num_q_heads or base[0],
                spec.num_kv_heads or base[1],
                spec.head_dim or base[2],
            )
        )
    else:
        for model in spec.models:
            if model not in MODELS:
                raise ValueError(f"model {model!r} is unknown; expected one of {sorted(MODELS)}.")
            shapes.append((model, *MODELS[model]))
    cases = []
    for (model, hq, hkv, d), batch, kv_len, bits, km, vm, g in itertools.product(
        shapes, spec.batch, spec.kv_len, spec.bits, spec.k_mode, spec.v_mode, spec.group_size
    ):
        cases.append(
            Case(
                batch=int(batch), kv_len=int(kv_len), num_q_heads=hq, num_kv_heads=hkv,
                head_dim=d, bits=int(bits), k_mode=km, v_mode=vm, group_size=int(g),
                page_size=int(spec.page_size), model=model, seed=int(spec.seed),
            )
        )
    return cases


def pair(cases: Iterable[Case], backends: Sequence[Any]) -> list[tuple[Case, Any]]:
    """(case, backend) work items: each backend sees each case normalised to its own
    format (`backend.case_for`), duplicates dropped, order kept (grouped by shape so a
    worker reuses one source K/V across backends)."""
    seen: set[tuple[str, str]] = set()
    items: list[tuple[Case, Any]] = []
    for case in cases:
        for backend in backends:
            own = backend.case_for(case)
            if own is None:
                continue
            ident = (own.key, backend.name)
            if ident not in seen:
                seen.add(ident)
                items.append((own, backend))
    items.sort(key=lambda cb: (cb[0].shape_key, cb[0].seed))  # stable: keeps backend order
    return items


def parse_int_list(text: str | None) -> list[int] | None:
    """'1,8,32' or '1k,32k' -> ints (k = 1024)."""
    if text is None:
        return None
    out = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        mult = 1
        if part[-1] in "kK":
            mult, part = 1024, part[:-1]
        out.append(int(part) * mult)
    return out


def parse_str_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [p.strip() for p in str(text).split(",") if p.strip()]
