"""The result record: one (case, backend) measurement, typed. It is composed of the case,
the GPU, the traffic, the check and the timing (and the ALU figures `foscar-bench alu`
adds later); the store's columns are derived from it (`COLUMNS`).

Adding a field is one line here, with a default of None: the part it belongs to decides
its place (a new timing figure in `TimingFields`, a new fact about the check in
`CheckFields`, something about the whole record, such as a reproducer command, in
`Record` itself), its type decides its column type, and the store adds the column to
older files when it next writes one (readers see None there). A new status goes into
`STATUSES`. A new sweep axis is a field of core.case.Case and needs nothing here.
"""
from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from types import NoneType, UnionType
from typing import Any

from core import bytes_model
from core.case import Case
from core.gpu import GpuInfo

# The status of a record (flashinfer-bench's enum, plus `crashed`, `skipped` and
# `inaccurate`: a third-party baseline whose check failed, timed anyway and flagged; our
# kernels keep the hard gate, `incorrect`, and are not timed).
STATUSES = ("passed", "inaccurate", "incorrect", "crashed", "timeout", "unsupported", "skipped", "compile_error")
# The statuses that carry a time.
TIMED_STATUSES = ("passed", "inaccurate")


@dataclass
class GpuFields:
    """The device a record was measured on, and the roofs its bandwidth is set against (TB/s)."""

    gpu_index: int | None = None
    gpu_name: str | None = None
    gpu_uuid: str | None = None
    bus_peak_tbps: float | None = None  # 2 x memory clock x bus width (NVML)
    datasheet_peak_tbps: float | None = None
    read_ceiling_tbps: float | None = None  # measured by suite.readceiling

    @classmethod
    def of(cls, gpu: GpuInfo, env: dict | None = None, read_ceiling_tbps: float | None = None) -> "GpuFields":
        """From the GPU description and its NVML block (suite.envinfo.gpu_info)."""
        env = env or {}
        return cls(gpu_index=gpu.index, gpu_name=gpu.name, gpu_uuid=gpu.uuid,
                   bus_peak_tbps=env.get("bus_peak_tbps"), datasheet_peak_tbps=env.get("datasheet_peak_tbps"),
                   read_ceiling_tbps=read_ceiling_tbps)


@dataclass
class TrafficFields:
    """What one step must move (core.bytes_model): the bytes bandwidth is computed from."""

    bytes: int | None = None
    flops: int | None = None
    traffic: dict | None = None  # the byte model's parts, Traffic.as_dict()


@dataclass
class CheckFields:
    """The correctness gate: relative L2 error against float64 over the backend's own cache."""

    tolerance: float | None = None  # the backend's
    rel_error: float | None = None
    quant_rel_error: float | None = None  # the reference over that cache against over the source
    checked_seqs: list | None = None
    checked_note: str | None = None


@dataclass
class TimingFields:
    """One decode step's time (suite.timing), how L2 was kept cold, the clocks around it,
    and the bandwidth that follows (`Record.derive`)."""

    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    n_samples: int | None = None
    spread: float | None = None  # relative width of the median's 95% CI, what sampling stopped on
    ci_low_us: float | None = None
    ci_high_us: float | None = None
    stop_reason: str | None = None  # converged | max_time | max_samples
    timing_method: str | None = None  # graph | events | cpu
    timing_note: str | None = None
    l2_policy: str | None = None  # size | rotate:N | flush | n/a (cpu)
    l2_verdict: str | None = None  # cold | warm | unknown (suite.timing.L2Plan), n/a on the CPU
    l2_reuse_bytes: int | None = None  # bytes read between two reads of one input
    l2_detail: str | None = None
    sm_clock_mhz_before: float | None = None
    sm_clock_mhz_after: float | None = None
    mem_clock_mhz_after: float | None = None
    temperature_c_after: float | None = None
    power_w_after: float | None = None
    # Read during every timed batch (suite.envinfo.load_clocks): the lowest and median SM clock,
    # the highest power, and the fraction of batches that saw a slowdown reason.
    sm_clock_mhz_min: float | None = None
    sm_clock_mhz_median: float | None = None
    power_w_max: float | None = None
    throttled_frac: float | None = None
    throttled: bool | None = None  # a slowdown reason before timing or in any batch
    throttle_reasons: str | None = None
    eff_bandwidth_tbps: float | None = None
    frac_peak_bus: float | None = None
    frac_peak_datasheet: float | None = None
    frac_read_ceiling: float | None = None


@dataclass
class AluFields:
    """Instruction figures from `foscar-bench alu` (Nsight Compute and SASS), set on a
    stored record afterwards (ResultStore.update_record)."""

    alu_per_elem: float | None = None
    inst_per_elem: float | None = None
    alu_issue_per_elem: float | None = None
    inst_issue_per_elem: float | None = None
    pipe_mix_json: str | None = None
    dram_bytes_read: float | None = None
    dram_model_ratio: float | None = None
    alu_static_per_elem: float | None = None
    alu_status: str | None = None
    alu_reason: str | None = None


@dataclass
class Record:
    """One (case, backend) measurement. `status` is one of STATUSES; `reason` says why a
    record did not pass. Fields the record does not declare go to `extra` (the store's
    extra_json)."""

    case: Case
    backend: str
    family: str = ""
    status: str = "crashed"
    reason: str | None = None
    gpu: GpuFields = field(default_factory=GpuFields)
    traffic: TrafficFields = field(default_factory=TrafficFields)
    check: CheckFields = field(default_factory=CheckFields)
    timing: TimingFields = field(default_factory=TimingFields)
    alu: AluFields = field(default_factory=AluFields)
    notes: str | None = None
    traceback: str | None = None
    reproducer: str | None = None  # the command that re-runs this one case
    build_s: float | None = None  # building or loading the backend's kernels, before the case's timer
    wall_s: float | None = None
    created_at: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def case_key(self) -> str:
        return self.case.key

    def derive(self) -> None:
        """The bandwidth figures from bytes, the median and the GPU's roofs."""
        t, g = self.timing, self.gpu
        t.eff_bandwidth_tbps = eff = bytes_model.eff_bandwidth_tbps(self.traffic.bytes or 0, t.median_us)
        t.frac_peak_bus = bytes_model.fraction(eff, g.bus_peak_tbps)
        t.frac_peak_datasheet = bytes_model.fraction(eff, g.datasheet_peak_tbps)
        t.frac_read_ceiling = bytes_model.fraction(eff, g.read_ceiling_tbps)

    def flat(self) -> dict[str, Any]:
        """Column name -> value, as the store keeps it (without run_id and extra_json)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "case":
                out.update(case_key=value.key, shape_key=value.shape_key, **value.as_dict())
            elif f.name == "extra":
                continue
            elif is_dataclass(value):
                out.update({p.name: getattr(value, p.name) for p in fields(value)})
            else:
                out[f.name] = value
        return out


# --- the store's columns, derived from the record -------------------------------------------
_SQL = {int: "INTEGER", float: "REAL", str: "TEXT", bool: "INTEGER", dict: "TEXT", list: "TEXT"}
NOT_NULL = ("case_key", "backend", "status")


def _base(hint: Any) -> type:
    """int for `int | None`, and so on."""
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [a for a in typing.get_args(hint) if a is not NoneType]
    return typing.get_origin(hint) or hint


def _types(cls: type) -> dict[str, type]:
    return {name: _base(hint) for name, hint in typing.get_type_hints(cls).items()}


def _column_types() -> dict[str, type]:
    out: dict[str, type] = {}
    for name, kind in _types(Record).items():
        if kind is Case:
            out.update(case_key=str, shape_key=str, **_types(Case))
        elif is_dataclass(kind):
            out.update(_types(kind))
        elif name != "extra":
            out[name] = kind
    return out


COLUMN_TYPES: dict[str, type] = _column_types()
# Column -> SQLite type, in record order; `extra_json` holds what the record does not declare.
COLUMNS: dict[str, str] = {
    **{name: _SQL[kind] + (" NOT NULL" if name in NOT_NULL else "") for name, kind in COLUMN_TYPES.items()},
    "extra_json": "TEXT",
}
# Columns holding JSON (lists and dicts); readers decode them.
JSON_COLUMNS = tuple(name for name, kind in COLUMN_TYPES.items() if kind in (dict, list))


def to_sql(value: Any) -> Any:
    """A value as SQLite keeps it: lists and dicts as JSON, booleans as 0/1, numpy/torch scalars as numbers."""
    value = _plain(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    if isinstance(value, bool):
        return int(value)
    return value


def row(record: Record | dict[str, Any]) -> dict[str, Any]:
    """Column -> SQLite value for a Record, or for a mapping of column names (fixtures,
    older tools): keys that are not columns go to extra_json either way."""
    if isinstance(record, Record):
        flat, extra = record.flat(), dict(record.extra)
    else:
        flat = {k: v for k, v in record.items() if k in COLUMN_TYPES}
        extra = {k: v for k, v in record.items() if k not in COLUMN_TYPES and k not in ("extra_json", "run_id")}
        if isinstance(record.get("extra_json"), dict):
            extra = {**record["extra_json"], **extra}
    status = flat.get("status")
    if status not in STATUSES:
        raise ValueError(f"record status {status!r} is not one of {STATUSES}.")
    for key in ("case_key", "backend"):
        if not flat.get(key):
            raise ValueError(f"a record needs {key!r}.")
    out = {k: to_sql(v) for k, v in flat.items() if v is not None}
    if extra:
        out["extra_json"] = json.dumps({k: _plain(v) for k, v in extra.items()}, default=str)
    return out


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and callable(value.item) else value
