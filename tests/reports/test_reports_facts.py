"""GPU facts for rooflines (from env, else records) and the reference data file."""
from __future__ import annotations

import pandas as pd
import pytest

from reports import paper
from reports.gpu import H200_ALU_RATE, gpu_facts
from reports.source import normalise_records
from reports_fixture import BUS_TBPS, ENV, _record
import random


def _records(n=3):
    rng = random.Random(0)
    return normalise_records(pd.DataFrame([_record("foscar-int4", 128, 32768, 1.0, rng) for _ in range(n)]))


def test_facts_from_environment():
    f = gpu_facts("NVIDIA H200", [ENV], _records())
    assert f.peak_bus_tbps == pytest.approx(4.815, abs=1e-3)
    assert f.peak_datasheet_tbps == 4.8 and f.read_ceiling_tbps == 4.44
    assert f.alu_rate == pytest.approx(63.3 * 132 * 1980e6)
    assert f.alu_rate == pytest.approx(H200_ALU_RATE, rel=0.01)
    assert f.compute_ceilings()["BF16 tensor cores (dense)"] == pytest.approx(4096 * 132 * 1.98e9)


def test_facts_fall_back_to_records_and_named_h200_rate():
    f = gpu_facts("NVIDIA H200", [{}], _records())
    assert f.peak_bus_tbps == pytest.approx(BUS_TBPS, rel=1e-9)  # eff / frac_peak_bus
    assert f.read_ceiling_tbps == pytest.approx(4.44, rel=1e-6)
    assert "records" in f.sources["peak_bus_tbps"]
    assert "assumed" in f.sources["sm_count"] and "sampled" in f.sources["sm_clock_mhz"]
    assert f.alu_rate == pytest.approx(H200_ALU_RATE, rel=0.01)
    no_clock = gpu_facts("NVIDIA H200", [{}], _records().assign(sm_clock_mhz_before=None))
    assert no_clock.alu_rate == H200_ALU_RATE and "reports/data/paper.csv" in no_clock.alu_rate_source
    unknown = gpu_facts("Some GPU", [{}], _records().assign(frac_peak_bus=None, sm_clock_mhz_before=None))
    assert unknown.peak_bus_tbps is None and unknown.alu_rate is None and unknown.compute_ceilings() == {}


def test_paper_file_names_its_sources_and_holds_section_6():
    df = paper.load()
    assert set(df["source_id"]) == {"paper", "h200-ref", "h200-grid", "targets", "h200-alu"}
    assert not df["source"].str.contains(r"\.md").any()  # every source is in the file itself
    assert df[df["source_id"] == "paper"]["source"].str.contains("arXiv 2611.09722").all()
    assert paper.lookup("paper", "bandwidth", "frac_peak_hbm", "bitdecoding-int2", "B200") == (0.145, "")
    assert paper.lookup("paper", "speedup", "speedup_geomean", "foscar-int4", "B200", "trtllm-xqa-fp8")[0] == 1.28
    assert paper.lookup("paper", "speedup", "speedup_geomean", "foscar-int2", "H100", "trtllm-nvfp4")[1] == "n/a"
    grid = df[df["source_id"] == "h200-grid"]
    assert len(grid) == 16 * 2 * 2


def _env(ceiling, spread=None):
    gpu = {**ENV["gpus"][0], "read_ceiling_tbps": ceiling}
    if spread is not None:
        gpu["spread"] = spread
    return {**ENV, "gpus": [gpu]}


def test_read_ceiling_and_spread_come_from_one_run():
    # an old single-kernel ceiling (no spread) listed first, a searched one with its spread, and the
    # newest searched one in the run holding most records: the roof and its spread are that run's
    recs = pd.concat([_records(1).assign(run_id="old", started_at="2026-01-01"),
                      _records(1).assign(run_id="mid", started_at="2026-01-02"),
                      _records(3).assign(run_id="new", started_at="2026-01-03")], ignore_index=True)
    envs = {"old": _env(4.08), "mid": _env(4.61, 0.0006), "new": _env(4.71, 0.0004)}
    unnamed = gpu_facts("NVIDIA H200", list(envs.values()), recs)  # a list, oldest first: the last
    assert (unnamed.read_ceiling_tbps, unnamed.read_ceiling_spread) == (4.71, 0.0004)  # was (4.08, 0.0006)
    f = gpu_facts("NVIDIA H200", envs, recs)
    assert (f.read_ceiling_tbps, f.read_ceiling_spread) == (4.71, 0.0004) and f.read_ceiling_run == "new"
    assert "run new" in f.sources["read_ceiling_tbps"]
    assert f.run_ceilings == {"old": (4.08, None), "mid": (4.61, 0.0006), "new": (4.71, 0.0004)}
    # one record in each of two runs: the newer run's ceiling, whatever order the runs come in
    tie = recs[recs["run_id"] != "new"]
    f = gpu_facts("NVIDIA H200", {"mid": envs["mid"], "old": envs["old"]}, tie)
    assert (f.read_ceiling_tbps, f.read_ceiling_spread) == (4.61, 0.0006) and f.read_ceiling_run == "mid"
