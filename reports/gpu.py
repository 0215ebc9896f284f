"""A GPU's roofs and rates (HBM peaks, read ceiling, ALU issue rate, FLOP ceilings) from env, else records."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pandas as pd

from reports import paper

# Thread-instructions per SM per clock of the ALU pipe (LOP3/SHF/PRMT), measured on our
# H200 (reports/data/paper.csv, source h200-alu); a property of the Hopper SM, not of one
# board. The whole-GPU figure is used when the environment lacks SM count or clock.
ALU_PER_SM_PER_CLOCK = paper.lookup("h200-alu", "alu", "alu_per_sm_per_clock", "")[0]
H200_ALU_RATE = paper.lookup("h200-alu", "alu", "alu_per_s", "")[0]
ALU_SOURCE = "reports/data/paper.csv, source h200-alu"
# Dense FLOP per SM per clock on sm_90 (Hopper): 128 FP32 lanes x 2 (FMA), and the
# tensor cores' dense BF16 rate (989 TFLOP/s = 4096 x 132 SMs x 1.83 GHz on H100 SXM).
HOPPER_FLOP_PER_SM_CLOCK = {"FP32 CUDA cores": 256, "BF16 tensor cores (dense)": 4096}

# Boards whose SM count is fixed at 132, used only when a run did not record it.
SXM_132_SM = ("H200", "H100 80GB HBM3", "H100 SXM")

_BUS = ("bus_peak_tbps", "peak_bus_tbps", "peak_tbps_bus")
_DATASHEET = ("datasheet_peak_tbps", "peak_datasheet_tbps", "datasheet_tbps")
_CEILING = ("read_ceiling_tbps", "measured_read_ceiling_tbps", "stream_read_tbps", "read_tbps")
_SMS = ("sm_count", "multi_processor_count", "num_sms")
_CLOCK = ("max_sm_clock_mhz", "sm_clock_max_mhz", "sm_clock_mhz")
_CAP = ("capability", "compute_capability")


@dataclass
class GpuFacts:
    """Roofs and rates of one GPU model; a value is None when nothing says it."""

    name: str
    peak_bus_tbps: float | None = None
    peak_datasheet_tbps: float | None = None
    read_ceiling_tbps: float | None = None
    read_ceiling_spread: float | None = None  # relative width, when the run recorded it
    read_ceiling_run: str | None = None  # the run whose environment gave the ceiling and its spread
    # every run's own measured ceiling: run id -> (TB/s, relative spread or None)
    run_ceilings: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    sm_count: int | None = None
    sm_clock_mhz: float | None = None
    capability: str | None = None
    alu_rate: float | None = None  # thread-instructions per second
    alu_rate_source: str = ""
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def hopper(self) -> bool:
        if self.capability:
            return str(self.capability).startswith("9.")
        return any(tag in self.name for tag in ("H100", "H200", "H800", "H20", "GH200"))

    def compute_ceilings(self) -> dict[str, float]:
        """Dense FLOP/s ceilings, derived for Hopper from SMs x clock; empty otherwise."""
        if not (self.hopper and self.sm_count and self.sm_clock_mhz):
            return {}
        clock_hz = self.sm_clock_mhz * 1e6
        return {k: v * self.sm_count * clock_hz for k, v in HOPPER_FLOP_PER_SM_CLOCK.items()}

    def hbm_roofs(self) -> dict[str, float]:
        """Label -> TB/s for every HBM roof that is known."""
        roofs = {
            "datasheet peak": self.peak_datasheet_tbps,
            "bus-derived peak": self.peak_bus_tbps,
            "measured read ceiling": self.read_ceiling_tbps,
        }
        return {k: v for k, v in roofs.items() if v}


def _blocks(env: Any) -> Iterable[dict]:
    """Every dict inside the environment, depth first (GPU blocks sit in env['gpus'])."""
    if isinstance(env, dict):
        yield env
        for value in env.values():
            yield from _blocks(value)
    elif isinstance(env, list):
        for value in env:
            yield from _blocks(value)


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def find(envs: Iterable[dict], names: tuple[str, ...], gpu_name: str) -> Any:
    """A key's value, preferring the block of the GPU named `gpu_name`, then any block."""
    blocks = [b for env in envs for b in _blocks(env)]
    mine = [b for b in blocks if b.get("name") == gpu_name]
    for group in (mine, blocks):
        for block in group:
            for key in names:
                if block.get(key) not in (None, ""):
                    return block[key]
    return None


def _ratio_median(records: pd.DataFrame, frac_col: str) -> float | None:
    """A roof implied by the records: eff_bandwidth / fraction-of-roof (they were divided by it)."""
    ok = records[(records["eff_bandwidth_tbps"] > 0) & (records[frac_col] > 0)]
    if ok.empty:
        return None
    return float((ok["eff_bandwidth_tbps"] / ok[frac_col]).median())


def gpu_facts(gpu_name: str, envs: Iterable[dict] | Mapping[str, dict], records: pd.DataFrame) -> GpuFacts:
    """Facts of one GPU model from the run environments (a list, or run id -> environment)
    and that GPU's records. The read ceiling and its spread come from one run: of the runs
    that measured one, the run holding most of `records` (the newest on a tie)."""
    named = isinstance(envs, Mapping)
    by_run = {str(k): v for k, v in envs.items()} if named else dict(enumerate(envs))
    envs = list(by_run.values())
    facts = GpuFacts(name=gpu_name)
    for attr, keys, frac in (
        ("peak_bus_tbps", _BUS, "frac_peak_bus"),
        ("peak_datasheet_tbps", _DATASHEET, "frac_peak_datasheet"),
    ):
        value = _number(find(envs, keys, gpu_name))
        source = "run environment"
        if value is None:
            value, source = _ratio_median(records, frac), "implied by the records' fractions"
        if value is not None:
            setattr(facts, attr, value)
            facts.sources[attr] = source
    _set_read_ceiling(facts, by_run, records, named)
    sms = _number(find(envs, _SMS, gpu_name))
    facts.sm_count = int(sms) if sms else None
    if facts.sm_count is None and any(tag in gpu_name for tag in SXM_132_SM):
        facts.sm_count = 132
        facts.sources["sm_count"] = "not recorded; 132 assumed (H100 SXM / H200 specification)"
    facts.sm_clock_mhz = _number(find(envs, _CLOCK, gpu_name))
    if facts.sm_clock_mhz is None and records["sm_clock_mhz_before"].notna().any():
        facts.sm_clock_mhz = float(records["sm_clock_mhz_before"].median())
        facts.sources["sm_clock_mhz"] = "median SM clock sampled before timing"
    cap = find(envs, _CAP, gpu_name)
    facts.capability = str(cap) if cap else None
    _set_alu_rate(facts)
    return facts


def _run_ceiling(env: Any, gpu_name: str) -> tuple[float, float | None] | None:
    """(TB/s, relative spread) of the read ceiling one run's environment holds, both from one
    block (the spread the search recorded beside its figure, suite.readceiling), preferring
    the block of the GPU named `gpu_name`; None when it holds none."""
    blocks = list(_blocks(env))
    for group in ([b for b in blocks if b.get("name") == gpu_name], blocks):
        for block in group:
            for key in _CEILING:
                value = _number(block.get(key))
                if value is not None:
                    return value, _number(block.get("spread"))
    return None


def _set_read_ceiling(facts: GpuFacts, envs: Mapping[Any, dict], records: pd.DataFrame, named: bool) -> None:
    """The drawn read ceiling and its spread, both from one run: of the runs whose environment
    holds one, the run holding most of `records`, the newest on a tie (`envs` unnamed, a list:
    the last that holds one); else the ceiling the records' fractions imply. Every named run's
    own ceiling goes to facts.run_ceilings."""
    found = {run: got for run, env in envs.items() if (got := _run_ceiling(env, facts.name)) is not None}
    if not found:
        value = _ratio_median(records, "frac_read_ceiling")
        if value is not None:
            facts.read_ceiling_tbps = value
            facts.sources["read_ceiling_tbps"] = "implied by the records' fractions"
        return
    best = list(found)[-1]
    if named:
        facts.run_ceilings = dict(found)
        runs = records["run_id"].astype(str)
        held = runs.value_counts()
        started = records.groupby(runs)["started_at"].max()
        best = max(found, key=lambda run: (int(held.get(run, 0)), str(started.get(run) or "")))
        facts.read_ceiling_run = best
        facts.sources["read_ceiling_tbps"] = (f"run {best}, which holds {int(held.get(best, 0))} of the "
                                              f"{len(records)} records")
    else:
        facts.sources["read_ceiling_tbps"] = "run environment"
    facts.read_ceiling_tbps, facts.read_ceiling_spread = found[best]


def above_ceiling(records: pd.DataFrame, facts: GpuFacts) -> pd.DataFrame:
    """Timed records whose bandwidth beats the read ceiling their own run measured by more
    than the two noises allow (each median's 95% half-width, and half the spread that run
    recorded beside its ceiling): a ceiling a real kernel beats is not one."""
    from reports import noise

    rows = []
    for _, r in records[(records["eff_bandwidth_tbps"] > 0) & (records["median_us"] > 0)].iterrows():
        # the ceiling this record's own run measured (what its frac_read_ceiling divided by), with
        # that run's spread; the drawn ceiling's where the run's own is not known
        run = facts.run_ceilings.get(str(r.get("run_id")), (facts.read_ceiling_tbps, facts.read_ceiling_spread))
        ceiling = (r["eff_bandwidth_tbps"] / r["frac_read_ceiling"] if r.get("frac_read_ceiling", 0) > 0
                   else run[0])
        if not ceiling:
            continue
        own = noise.Sample(r["median_us"], r.get("p10_us"), r.get("p90_us"), r.get("n_samples"), r.get("spread")).noise
        slack = math.hypot(own, (run[1] or 0.0) / 2)
        over = r["eff_bandwidth_tbps"] / ceiling - 1
        if over > slack:
            rows.append({**r.to_dict(), "ceiling_tbps": ceiling, "over_ceiling": over, "slack": slack})
    return pd.DataFrame(rows)


def _set_alu_rate(facts: GpuFacts) -> None:
    if facts.hopper and facts.sm_count and facts.sm_clock_mhz:
        facts.alu_rate = ALU_PER_SM_PER_CLOCK * facts.sm_count * facts.sm_clock_mhz * 1e6
        facts.alu_rate_source = (
            f"{ALU_PER_SM_PER_CLOCK} per SM per clock ({ALU_SOURCE}) x {facts.sm_count} SMs x "
            f"{facts.sm_clock_mhz:.0f} MHz"
        )
    elif "H200" in facts.name:
        facts.alu_rate = H200_ALU_RATE
        facts.alu_rate_source = f"measured on our H200 ({ALU_SOURCE})"
