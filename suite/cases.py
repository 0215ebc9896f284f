"""Sweep declaration: a TOML preset plus command-line axes expand into cases
(core.case.Case), and the cases pair with backends.

The axes are the fields of `Case` (core.case.axes()): a field added there is an axis here,
in presets and on the `sweep` command line, with nothing to change in this module.
"""
from __future__ import annotations

import itertools
import re
import tomllib
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from core.case import MODELS, Case, axes
from foscar.config import BITS as INT_BITS, GROUP_SIZES, MODES

PRESET_DIR = Path(__file__).parent / "presets"

# What a sweep runs for an axis that neither the preset nor the command line names; any
# other axis sweeps its Case default alone.
SWEEP_DEFAULTS: dict[str, list] = {"batch": [128], "kv_len": [32768], "bits": [4, 2]}
DEFAULT_MODELS = ["llama3-8b"]
# An explicit shape (overrides the model preset), scalars.
SHAPE_OVERRIDES = ("num_q_heads", "num_kv_heads", "head_dim")
# Case fields that must be positive (core.case.Case checks them too, without saying where).
POSITIVE = ("batch", "kv_len", "page_size", "num_q_heads", "num_kv_heads", "head_dim")
# What the quantization axes take. The int formats (ours, BitDecoding, torch-ref) follow
# foscar.config: widths 2 and 4, these group sizes, K and V each token- or channel-wise.
# A full-precision format's case (what its reproducer spells out) has modes 'none', group
# size 0 and its own width: 16 (BF16), 8 (FP8) or 4 (NVFP4).
FLOAT_BITS = (4, 8, 16)
NO_MODE = "none"
ALLOWED = {
    "bits": tuple(sorted(set(INT_BITS) | set(FLOAT_BITS))),
    "k_mode": (*MODES, NO_MODE),
    "v_mode": (*MODES, NO_MODE),
    "group_size": (*GROUP_SIZES, 0),
}


@dataclass
class SweepSpec:
    """The axes of a sweep; their lists expand as a cartesian product."""

    axes: dict[str, list]  # every axis of core.case.axes() -> its values
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))  # names in MODELS
    backends: list[str] | None = None  # None: every registered backend
    num_q_heads: int | None = None  # explicit shape overrides the model preset
    num_kv_heads: int | None = None
    head_dim: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Flat, as runs record it (and `make_spec(None, **d)` reads it back on --resume)."""
        return {**self.axes, "models": self.models, "backends": self.backends,
                **{name: getattr(self, name) for name in SHAPE_OVERRIDES}}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def preset_keys() -> set[str]:
    return set(axes()) | {"models", "backends", "description", *SHAPE_OVERRIDES}


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by name (suite/presets/<name>.toml) or by path; returns its [sweep] table,
    every value checked (a bad one names the file and the key)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise ValueError(
            f"preset {name_or_path!r} not found; expected one of {preset_names()} or a .toml path."
        )
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {_toml_error(path, exc)}; fix that line.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read as a TOML preset ({exc}); pass a preset name or a .toml file.") from None
    sweep = data.get("sweep", data)
    if not isinstance(sweep, dict):
        raise ValueError(f"{path}: [sweep] must be a table of axes; see suite/presets/paper.toml.")
    unknown = set(sweep) - preset_keys()
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; expected some of {sorted(preset_keys())}.")
    for key, value in sweep.items():
        check_value(key, value, f"{path}: {key}")
    return sweep


def _toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> str:
    """tomllib's message with the key whose value it failed in: the last `key =` line at the
    error, or before it when the parser only noticed at the start of the next line."""
    message = str(exc)
    match = re.search(r"line (\d+), column (\d+)", message)
    if not match:
        return message
    line_no, column = int(match.group(1)), int(match.group(2))
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return message
    last = line_no - 1 if column == 1 else line_no
    for i in range(min(last, len(lines)), 0, -1):
        key = re.match(r"\s*([A-Za-z0-9_\-.\"]+)\s*=", lines[i - 1])
        if key:
            return f"{message}, in the value of {key.group(1)!r} (line {i})"
    return message


def check_value(key: str, value: Any, where: str) -> None:
    """Raise one ValueError naming `where` when a preset or command-line value is not what
    the key takes."""
    kinds = {name: kind for name, (kind, _) in axes().items()}
    if key in kinds:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if kinds[key] is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"{where} = {value!r}: {v!r} is not a whole number; expected e.g. {key} = [1, 8].")
            if kinds[key] is str and not isinstance(v, str):
                raise ValueError(f"{where} = {value!r}: {v!r} is not a string; expected e.g. {key} = [\"token\"].")
            if key in POSITIVE and v <= 0:
                raise ValueError(f"{where} = {value!r}: {v} is not positive; {key} takes numbers above 0.")
            if key in ALLOWED and v not in ALLOWED[key]:
                raise ValueError(f"{where} = {value!r}: {v!r} is not a value {key} takes; expected one of "
                                 f"{list(ALLOWED[key])}.")
    elif key == "models":
        for m in value if isinstance(value, list) else [value]:
            if m not in MODELS:
                raise ValueError(f"{where} = {value!r}: model {m!r} is unknown; expected one of {sorted(MODELS)}.")
    elif key in SHAPE_OVERRIDES and value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where} = {value!r}: expected a positive whole number.")
    elif key == "backends" and value is not None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where} = {value!r}: expected a list of backend names.")


def make_spec(preset: str | None = None, **overrides: Any) -> SweepSpec:
    """Preset axes (or the defaults) with every non-None override applied on top."""
    values: dict[str, Any] = {
        name: SWEEP_DEFAULTS.get(name, [default]) for name, (_, default) in axes().items()
    }
    values["models"] = list(DEFAULT_MODELS)
    if preset:
        values.update({k: v for k, v in load_preset(preset).items() if k != "description"})
    unknown = set(overrides) - preset_keys()
    if unknown:
        raise ValueError(f"unknown sweep axes {sorted(unknown)}; expected some of {sorted(preset_keys() - {'description'})}.")
    for key, value in overrides.items():
        if value is not None:
            check_value(key, value, key)
            values[key] = value
    missing = [name for name, v in values.items() if v is MISSING or v == [MISSING]]
    if missing:
        raise ValueError(f"the sweep names no {', '.join(missing)}; give them in the preset or on the command line.")
    listed = {name: values[name] if isinstance(values[name], list) else [values[name]] for name in axes()}
    check_formats(listed)
    models = values["models"] if isinstance(values["models"], list) else [values["models"]]
    return SweepSpec(axes=listed, models=models, backends=values.get("backends"),
                     **{name: values.get(name) for name in SHAPE_OVERRIDES})


def check_formats(listed: dict[str, list]) -> None:
    """Raise one ValueError when the quantization axes combine into a format no backend
    has: an int format (K and V token- or channel-wise) takes the INT_BITS widths and the
    GROUP_SIZES; a full-precision one (modes 'none' both) the FLOAT_BITS widths."""
    k_modes, v_modes = listed.get("k_mode", []), listed.get("v_mode", [])
    bits, groups = listed.get("bits", []), listed.get("group_size", [])
    for k_mode, v_mode in itertools.product(k_modes, v_modes):
        if (k_mode == NO_MODE) != (v_mode == NO_MODE):
            raise ValueError(f"k_mode {k_mode!r} with v_mode {v_mode!r}: 'none' (a full-precision format) "
                             "goes with 'none' only; sweep int and full-precision formats in separate runs.")
        if k_mode == NO_MODE:
            wrong = [b for b in bits if b not in FLOAT_BITS]
            if wrong:
                raise ValueError(f"bits {wrong} with k_mode 'none': a full-precision format is 16, 8 or 4 bits "
                                 "wide; give --bits 16, 8 or 4, or token/channel modes for the int formats.")
        else:
            wrong = [b for b in bits if b not in INT_BITS]
            if wrong:
                raise ValueError(f"bits {wrong} with k_mode {k_mode!r}: the int formats are {INT_BITS[0]} or "
                                 f"{INT_BITS[1]} bits wide; give --bits 2,4, or --k-mode none --v-mode none for "
                                 "a full-precision width.")
            if 0 in groups:
                raise ValueError(f"group_size 0 with k_mode {k_mode!r}: the int formats take group sizes "
                                 f"{list(GROUP_SIZES)}; give one of them.")


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
    kinds = axes()
    names = list(kinds)
    cases = []
    for (model, hq, hkv, d), *point in itertools.product(shapes, *(spec.axes[n] for n in names)):
        values = {n: kinds[n][0](v) for n, v in zip(names, point)}
        cases.append(Case(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, model=model, **values))
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


def parse_int_list(text: str | None, option: str = "value") -> list[int] | None:
    """'1,8,32' or '1k,32k' -> ints (k = 1024); a bad entry, or a list with none, is one
    ValueError naming `option`."""
    if text is None:
        return None
    out = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        mult, digits = (1024, part[:-1]) if part[-1] in "kK" else (1, part)
        try:
            out.append(int(digits) * mult)
        except ValueError:
            raise ValueError(
                f"{option} {text!r}: {part!r} is not a whole number; expected a comma list such as 1,8,32 or 1k,32k."
            ) from None
    if not out:
        raise ValueError(f"{option} {text!r} names no value; expected a comma list such as 1,8,32, or leave {option} out.")
    return out


def parse_str_list(text: str | None, option: str = "value") -> list[str] | None:
    """'a, b' -> ['a', 'b']; a list with no name is one ValueError naming `option`."""
    if text is None:
        return None
    out = [p.strip() for p in str(text).split(",") if p.strip()]
    if not out:
        raise ValueError(f"{option} {text!r} names nothing; expected a comma list of one or more names, or leave {option} out.")
    return out


def unpaired(cases: Sequence[Case], backends: Sequence[Any]) -> list[str]:
    """'NAME (why)' for each backend that pairs with none of `cases` (its `case_for` says
    None to each)."""
    out = []
    widths = sorted({c.bits for c in cases})
    for backend in backends:
        if any(backend.case_for(c) is not None for c in cases):
            continue
        if backend.quantized and all(c.k_mode == NO_MODE for c in cases):
            why = "an int format; every case has k_mode 'none'"
        elif backend.bits:
            why = f"it runs {backend.bits}-bit cases only; the sweep's bits are {widths}"
        else:
            why = "its case_for takes none of the cases"
        out.append(f"{backend.name} ({why})")
    return out


REPRO_DB = "results/repro.sqlite"


def reproducer(case: Case, backend: str, gpu_index: int | None = None) -> str:
    """The command that re-runs exactly this (case, backend): the shape by its model when it
    is one (else the three head numbers), every axis of the case spelt out with the value
    the backend ran (so `case_for` maps it onto itself), one device, a store of its own."""
    import shlex

    words = ["foscar-bench", "sweep", "--backends", backend]
    shape = (case.num_q_heads, case.num_kv_heads, case.head_dim)
    if MODELS.get(case.model) == shape:
        words += ["--model", case.model]
    else:
        words += ["--num-q-heads", str(shape[0]), "--num-kv-heads", str(shape[1]), "--head-dim", str(shape[2])]
    for name in axes():
        words += [f"--{name.replace('_', '-')}", str(getattr(case, name))]
    words += ["--cpu"] if gpu_index is None or gpu_index < 0 else ["--gpus", str(gpu_index)]
    return shlex.join(words + ["--db", REPRO_DB])
