"""The report's speedup-bound section: rendered from a small store and a small floor file, with the
geo-means beside our targets; the runs it pairs; one sentence instead of a table when no floor
is given; and the bundled report with the bundled floor."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from reports import bound as rb
from reports.source import from_frames
from suite import readfloor as rf
from suite.cli import app

# A made-up floor (a fixture, not a measurement): 5 us of latency plus 4.6 TB/s, measured from
# 4 MB to 8 GB, so the fixture's smallest INT2 case (2.4 MB) lies below it and its largest
# INT4 case (18 GB) above it.
FLOOR_SIZES = (4_000_000, 64_000_000, 1_000_000_000, 8_000_000_000)
FLOOR = {"kind": "read-floor", "gpu_name": "NVIDIA H200",
         "sizes": [{"bytes": n, "median_us": 5.0 + n / 4.6e12 * 1e6} for n in FLOOR_SIZES]}


@pytest.fixture(scope="module")
def floor_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("floor") / "floor.json"
    path.write_text(json.dumps(FLOOR))
    return path


def _report(args, out):
    result = CliRunner().invoke(app, ["report", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return (out / "index.html").read_text()


def _section(text: str) -> str:
    start = text.index(f'id="{rb.ANCHOR}"')
    return text[start:text.index("<h2", start)]


def test_section_shows_cases_geomeans_and_targets(fixture_store, floor_file, tmp_path):
    db, _, head = fixture_store
    section = _section(_report(["--db", str(db), "--run", head, "--floor-from", str(floor_file)], tmp_path))
    summary = pd.read_csv(tmp_path / "speedup_bound.csv")
    cases = pd.read_csv(tmp_path / "speedup_bound_cases.csv")
    assert set(zip(summary["ours"], summary["over"])) == {
        (o, b) for o in rf.OURS for b in rf.BASELINES}
    assert (summary["n_cases"] == 9).all() and len(cases) == 4 * 9
    # the geo-mean is that of baseline / floor over the pair's cases, the floor at our bytes
    row = summary[(summary["ours"] == "foscar-int4") & (summary["over"] == "flashinfer-bf16-tc")].iloc[0]
    mine = cases[(cases["ours"] == "foscar-int4") & (cases["over"] == "flashinfer-bf16-tc")]
    for _, c in mine.iterrows():
        assert c["floor_us"] == pytest.approx(rf.floor_lookup(FLOOR, c["bytes"])[0])
    expect = math.exp((mine["over_us"] / mine["floor_us"]).map(math.log).mean())
    assert row["geomean_bound"] == pytest.approx(expect)
    assert row["target"] == pytest.approx(3.5)
    reach = "in reach" if row["geomean_bound"] >= 3.5 else "out of reach on this GPU"
    assert f"{row['geomean_bound']:.2f}x" in section and f"3.5x: {reach}" in section
    assert section.count("<td>geo-mean</td>") == 4 and "9 cases" in section
    # every target the pairs have sits beside its geo-mean
    assert "1.8x: " in section and "6x: " in section and "3x: " in section
    # both runs are named, the meaning is said, and extrapolated floors are marked
    assert f"ours: run {head}" in section and f"baselines: run {head}" in section
    assert "out of reach there, whatever the kernel does" in section
    assert set(cases["floor_how"]) >= {"below", "above"} and "scaled down from the smallest" in section
    assert "floor.json, measured on NVIDIA H200" in section
    assert rb.NO_FLOOR not in section


def test_without_a_floor_the_section_says_how_to_get_one(rendered_report):
    """The fixture report is rendered without a floor, as `report --db F` without --floor-from."""
    section = _section(rendered_report.read_text())
    assert "No read floor was given" in section and "--floor-from F" in section
    assert "<table" not in section and not (rendered_report.parent / "speedup_bound.csv").exists()


def test_an_unreadable_floor_is_one_line_and_exit_2(fixture_store, tmp_path):
    db, _, _ = fixture_store
    bad = tmp_path / "floor.json"
    bad.write_text(json.dumps({"sizes": [{"bytes": 1 << 20}]}))
    result = CliRunner().invoke(app, ["report", "--db", str(db), "--floor-from", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "holds no measured size" in result.output
    assert not (tmp_path / "o" / "index.html").exists()


def _rec(run, backend, batch, kv, status="passed", us=100.0):
    return {"run_id": run, "case_key": f"b{batch}-kv{kv}-{backend}", "backend": backend, "status": status,
            "gpu_name": "NVIDIA H200", "batch": batch, "kv_len": kv, "num_q_heads": 32, "num_kv_heads": 8,
            "head_dim": 128, "median_us": us, "bytes": 1e6 * batch * kv / 4096 if backend.startswith("foscar") else None,
            "started_at": {"old-grid": "2026-01-01", "paper": "2026-01-02", "new-grid": "2026-01-03"}[run]}


def test_ours_from_the_latest_grid_baselines_from_the_run_that_covers_it():
    grid = [(b, kv) for b in (1, 8) for kv in (4096, 32768)]
    rows = [_rec("old-grid", n, b, kv) for b, kv in grid for n in ("foscar-int4", "flashinfer-bf16-tc", "trtllm-xqa-fp8")]
    rows += [_rec("paper", n, 8, 32768) for n in ("foscar-int4", "flashinfer-bf16-tc", "trtllm-xqa-fp8")]
    rows += [_rec("new-grid", "foscar-int4", b, kv) for b, kv in grid]
    results = from_frames(pd.DataFrame(rows))
    assert rb.pick_runs(results, rf.OURS, rf.BASELINES) == ("new-grid", "old-grid")
    # a grid of ours that holds its own baselines pairs with itself
    rows += [_rec("new-grid", "flashinfer-bf16-tc", b, kv) for b, kv in grid]
    rows += [_rec("new-grid", "trtllm-xqa-fp8", b, kv) for b, kv in grid]
    assert rb.pick_runs(from_frames(pd.DataFrame(rows)), rf.OURS, rf.BASELINES) == ("new-grid", "new-grid")
    # no baseline anywhere: ours alone, and the section says there is nothing to bound
    only = from_frames(pd.DataFrame([r for r in rows if r["backend"] == "foscar-int4"]))
    assert rb.pick_runs(only, rf.OURS, rf.BASELINES) == ("new-grid", None)


def test_bundled_report_bounds_int4_over_flashinfer_at_3_78x(rendered_bundled):
    # The latest grid (v41's, e0c73ba) against the bundled floor, read on the same H200 in the same
    # call (docs/data/floor_h200_grid_e0c73ba.json; docs/MEASUREMENT.md).
    section = _section(rendered_bundled.read_text())
    summary = pd.read_csv(rendered_bundled.parent / "speedup_bound.csv")
    row = summary[(summary["ours"] == "foscar-int4") & (summary["over"] == "flashinfer-bf16-tc")].iloc[0]
    assert row["n_cases"] == 16 and round(row["geomean_bound"], 2) == 3.78 and row["target"] == 3.5
    assert "ours: run grid-h200-e0c73ba" in section and "baselines: run grid-h200-e0c73ba" in section
    assert "3.78x" in section and "3.5x: in reach" in section
    assert "docs/data/floor_h200_grid_e0c73ba.json (bundled)" in section
