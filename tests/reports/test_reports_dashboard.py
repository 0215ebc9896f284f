"""The dashboard renders series over two commits, calls only the planted change, and exports valid JSON."""
from __future__ import annotations

import json
import re

import pandas as pd

from reports import noise
from reports.dashboard import build_dashboard, steps
from reports.series import per_point
from reports.source import from_frames, open_store


def test_dashboard_pages_series_and_changes(rendered_dashboard):
    out = rendered_dashboard.parent
    text = rendered_dashboard.read_text()
    imgs = re.findall(r'<img src="([^"]+)"', text)
    assert len(imgs) == 9  # 3 batches x 3 KV lengths on one GPU
    assert all((out / i).stat().st_size > 10_000 for i in imgs)
    changes = text.split('id="changes"')[1].split("<h2")[0]
    assert changes.count('class="regression"') == 1
    assert "FOSCAR INT2 (ours)" in changes and "batch 128, KV 32K" in changes
    assert "a1b2c3d4" in text and "f00dfeed" in text


def test_steps_call_only_the_planted_change(fixture_store):
    db, _, _ = fixture_store
    results = open_store(db)
    st = steps(per_point(results.records, results.runs), 0.02)
    called = st[st["verdict"] == noise.SLOWER]
    assert list(zip(called["backend"], called["batch"], called["kv_len"])) == [("foscar-int2", 128, 32768)]
    assert not (st["verdict"] == noise.FASTER).any()


def test_exports_follow_the_formats(rendered_dashboard):
    exports = rendered_dashboard.parent / "exports"
    smaller = json.loads((exports / "latest-customSmallerIsBetter.json").read_text())
    assert smaller and all({"name", "unit", "value"} <= set(e) for e in smaller)
    assert all(isinstance(e["value"], float) and e["unit"] == "us" for e in smaller)
    assert len({e["name"] for e in smaller}) == len(smaller)
    assert all(e["range"].startswith("± ") for e in smaller)
    bigger = json.loads((exports / "f00dfeed-customBiggerIsBetter.json").read_text())
    assert {e["unit"] for e in bigger} == {"TB/s"}
    bmf = json.loads((exports / "a1b2c3d4-bencher-bmf.json").read_text())
    name, measures = next(iter(bmf.items()))
    lat = measures["latency"]
    assert lat["lower_value"] <= lat["value"] <= lat["upper_value"]
    assert len(bmf) == len(smaller)


def test_dashboard_of_one_commit_and_of_nothing_say_so(tmp_path):
    recs = pd.DataFrame([{
        "run_id": "r1", "case_key": "c", "backend": "foscar-int4", "status": "passed", "gpu_name": "G",
        "batch": 1, "kv_len": 4096, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "bits": 4,
        "k_mode": "channel", "v_mode": "token", "group_size": 128, "page_size": 64, "median_us": 10.0,
        "p10_us": 9.9, "p90_us": 10.1, "bytes": 1e6, "eff_bandwidth_tbps": 0.1,
        "started_at": "2025-01-01T00:00:00+00:00", "git_sha": "abcdef12",
    }])
    one = build_dashboard(from_frames(recs), tmp_path / "one").read_text()
    assert "need two or more" in one and "<img" in one
    none = build_dashboard(from_frames(recs.iloc[0:0]), tmp_path / "none").read_text()
    assert "no records" in none
