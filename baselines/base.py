"""The one interface every decode-attention kernel is measured through, ours included,
and the registry of backends.

A backend declares what it is (name, family, KV format and native width, tolerance), says
why it cannot run a case (`case_reason`; `supports` adds whether its library is there),
and builds its own cache format from the shared BF16 source K/V (`prepare`), returning a
thunk that runs one decode step. The harness alone times it. Conversion and quantization
happen in `prepare` and are never timed.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from core.bytes_model import FORMATS, Traffic, traffic_for_case
from core.case import NO_QUANT, Case
from core.gpu import GpuInfo

# Modules under baselines/ that register backends, in listing order.
BACKEND_MODULES = (
    "baselines.torch_ref",
    "baselines.flashinfer_decode",
    "baselines.trtllm",
    "baselines.bitdecoding",
    "baselines.foscar",
)


# A quantized format's page holds whole groups and whole 64-token blocks of V codes
# (foscar.config.QuantConfig); `Backend.case_for` rounds a swept page up to both.
PAGE_ALIGN = 64


class Unsupported(Exception):
    """Raised by `prepare` when a backend finds it cannot run a case after all; the
    harness records `unsupported` with the message as the reason."""


class CompileError(Exception):
    """Raised when a backend's kernel fails to build (JIT); recorded as `compile_error`."""


@dataclass
class SourceKV:
    """The attention problem every backend answers, in BF16 on the case's device.

    q [batch, num_q_heads, head_dim]; k, v [batch, max_len, num_kv_heads, head_dim] with
    max_len >= every seq_len (rows past a sequence's length are not attended);
    seq_lens int32 [batch].
    """

    q: Any
    k: Any
    v: Any
    seq_lens: Any
    sm_scale: float

    @property
    def max_len(self) -> int:
        return int(self.k.shape[1])


@dataclass
class Prepared:
    """One backend's ready-to-run decode step over its own copy of the cache.

    run: launches one decode step and returns the output [batch, num_q_heads, head_dim]
        (the same tensor each call when the backend writes into `out`).
    reference_kv: given sequence indices, returns (k, v) [n, max_len, num_kv_heads,
        head_dim] in any float dtype: the cache as THIS backend stores it, dequantized.
        The float64 reference attends over it, so quantization error is not counted
        against the kernel (it is reported separately as quant_rel_error).
    bytes: bytes one step must move, only where it differs from core.bytes_model's count for
        the case (None: the harness takes the byte model's).
    out: the output buffer `run` writes (poisoned before the checked run), or None.
    inputs: the tensors (or objects holding them) one step reads: the query and the cache
        with its scales, page table and lengths; not scratch workspaces, not the source.
        The cold-L2 check (suite.timing.verify_rotation) counts these alone; None: every
        tensor reachable from the Prepared, which counts the cloned source each copy's
        closures may reach, so set it wherever `run` or `reference_kv` reach the source.
    """

    run: Callable[[], Any]
    reference_kv: Callable[[Sequence[int]], tuple[Any, Any]]
    bytes: int | None = None
    out: Any = None
    notes: str = ""
    keepalive: list = field(default_factory=list)
    inputs: list | None = None


class Backend:
    """Base class: subclasses set the class attributes, implement `prepare`, and say in
    `case_reason` which cases or GPUs are out of their reach."""

    name: str = ""
    family: str = ""
    kv_format: str = ""  # how it keeps K and V: one of core.bytes_model.FORMATS
    bits: int = 16  # native KV storage width: 16 (BF16), 8 (FP8), 4, 2; 0 = the case's int bits
    tolerance: float = 1e-2  # relative L2 vs the float64 reference over its own cache
    quantized: bool = False  # True: follows the case's int quantization axes
    description: str = ""
    needs_cuda: bool = True  # False: also runs on the CPU (torch-ref)
    # Another project's kernel: when its check fails it is still timed, recorded
    # `inaccurate` with its error beside the time (users compare speed). Ours and the
    # reference keep the hard gate: `incorrect`, untimed.
    third_party: bool = False

    # --- declaration --------------------------------------------------------------------
    def case_for(self, case: Case) -> Case | None:
        """The case this backend really runs for a swept case, or None if it does not
        pair with it (e.g. an INT4 kernel and a 2-bit case). Unquantized formats drop the
        int axes, so every int setting maps to one case for them."""
        if self.quantized:
            if case.k_mode == "none" or (self.bits and case.bits != self.bits):
                return None
            align = math.lcm(case.group_size, PAGE_ALIGN) if case.group_size > 0 else 0
            if align and case.page_size % align:
                # Our formats need whole groups and whole 64-token blocks of V codes in a page:
                # the smallest page that holds both.
                return case.with_(page_size=align * -(-case.page_size // align))
            return case
        if self.bits < 8 and case.k_mode != "none" and case.bits != self.bits:
            return None  # a low-bit float format (NVFP4) pairs with the int sweeps of its width
        return case.with_(bits=self.bits, **NO_QUANT)

    def available(self) -> str | None:
        """None when the backend's library imports, else one sentence on how to get it."""
        return None

    def supports(self, case: Case, gpu: GpuInfo | None) -> str | None:
        """None if the backend can run `case` on `gpu`, else the reason it cannot: first
        whether its library is there, then what the case asks (`case_reason`). Subclasses
        override those two, not this."""
        return self.available() or self.case_reason(case, gpu)

    def case_reason(self, case: Case, gpu: GpuInfo | None) -> str | None:
        """Why this case or GPU is out of the backend's reach, once its library is there."""
        return None

    def traffic(self, case: Case) -> Traffic:
        """The bytes one step must move in this backend's format (core.bytes_model)."""
        return traffic_for_case(case, self.kv_format)

    def warmup_case(self, case: Case) -> Case | None:
        """A small case of the same format that builds or loads every kernel `case` needs
        (a JIT compile, a first load), run before the case's timer starts; None when there
        is nothing to build. The default: batch 1 and at most 1024 tokens."""
        kv_len = min(case.kv_len, 1024)
        if kv_len % case.page_size:
            kv_len = case.kv_len
        return case.with_(batch=1, kv_len=kv_len)

    def memory_bytes(self, case: Case) -> int:
        """Device bytes one prepared copy holds (beyond the source), for fit checks and
        for how many copies cold-L2 rotation may make. Defaults to the byte model."""
        return self.traffic(case).total

    # --- measurement input ----------------------------------------------------------------
    def prepare(self, case: Case, source: SourceKV) -> Prepared:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


_REGISTRY: dict[str, Backend] = {}
_LOADED = False
WIDTHS = (0, 2, 4, 8, 16)


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: add one instance of the backend to the registry, its declaration
    checked."""
    inst = cls()
    if not inst.name:
        raise ValueError(f"{cls.__name__} has no name.")
    if inst.kv_format not in FORMATS:
        raise ValueError(f"{inst.name}: kv_format {inst.kv_format!r} is not one of {FORMATS}.")
    if inst.bits not in WIDTHS:
        raise ValueError(f"{inst.name}: bits={inst.bits} is not one of {WIDTHS}.")
    _REGISTRY[inst.name] = inst
    return cls


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    for mod in BACKEND_MODULES:
        importlib.import_module(mod)  # these modules import optional libraries lazily
    _LOADED = True


def all_backends() -> list[Backend]:
    """Every registered backend, in listing order: by module as BACKEND_MODULES lists them
    (whichever imported first), then as each module registers them."""
    _load()
    rank = {mod: i for i, mod in enumerate(BACKEND_MODULES)}
    return sorted(_REGISTRY.values(), key=lambda b: rank.get(type(b).__module__, len(rank)))


def get_backend(name: str) -> Backend:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"backend {name!r} is unknown; expected one of {sorted(_REGISTRY)}."
        ) from None


def select_backends(names: Sequence[str] | None) -> list[Backend]:
    """Backends by name (a trailing '*' matches a prefix), or all of them for None."""
    if not names:
        return all_backends()
    chosen: list[Backend] = []
    for name in names:
        if name.endswith("*"):
            hits = [b for b in all_backends() if b.name.startswith(name[:-1])]
            if not hits:
                raise KeyError(f"no backend matches {name!r}; expected one of {sorted(_REGISTRY)}.")
            chosen.extend(h for h in hits if h not in chosen)
        else:
            b = get_backend(name)
            if b not in chosen:
                chosen.append(b)
    return chosen


def has_module(name: str) -> bool:
    """True when `name` imports (never raises: a broken install counts as absent)."""
    try:
        importlib.import_module(name)
        return True
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
