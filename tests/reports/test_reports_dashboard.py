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


def _rec(sha, day, batch, median, status="passed", k_mode="channel"):
    return {"run_id": f"r-{sha}", "case_key": f"b{batch}-k{k_mode[0]}", "backend": "foscar-int4", "status": status,
            "gpu_name": "G", "batch": batch, "kv_len": 4096, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128,
            "bits": 4, "k_mode": k_mode, "v_mode": "token", "group_size": 128, "page_size": 64,
            "median_us": median if status == "passed" else None, "p10_us": median * 0.995, "p90_us": median * 1.005,
            "n_samples": 200, "bytes": 1e6, "eff_bandwidth_tbps": 1e6 / (median * 1e-6) / 1e12,
            "started_at": f"2025-01-0{day}T00:00:00+00:00", "git_sha": sha}


def test_steps_pair_each_series_with_its_own_previous_measurement():
    # batch 8 is measured at the first and third commits only: its 20% slowdown and batch 1's lost
    # passing case are judged across the middle commit, not read as gone then new
    recs = pd.DataFrame([_rec("aaaa1111", 1, 8, 10.0), _rec("aaaa1111", 1, 1, 5.0),
                         _rec("bbbb2222", 2, 128, 50.0),
                         _rec("cccc3333", 3, 8, 12.0), _rec("cccc3333", 3, 1, 5.0, status="incorrect")])
    results = from_frames(recs)
    st = steps(per_point(results.records, results.runs), 0.02)
    got = sorted(zip(st["batch"], st["from"], st["to"], st["verdict"]))
    assert got == [(1, "aaaa1111", "cccc3333", "now incorrect"), (8, "aaaa1111", "cccc3333", noise.SLOWER),
                   # batch 128, measured at the middle commit alone: new there, gone at the next
                   (128, "aaaa1111", "bbbb2222", "new"), (128, "bbbb2222", "cccc3333", "gone")]


def test_triangles_mark_only_the_format_that_changed():
    # two K formats of one backend at one shape, only channel-K 10% slower: one triangle per panel,
    # on the channel-K line
    from reports.dashboard import series_figure

    recs = pd.DataFrame([_rec("aaaa1111", 1, 8, 10.0), _rec("aaaa1111", 1, 8, 8.0, k_mode="token"),
                         _rec("bbbb2222", 2, 8, 11.0), _rec("bbbb2222", 2, 8, 8.0, k_mode="token")])
    results = from_frames(recs)
    pp = per_point(results.records, results.runs)
    st = steps(pp, 0.02)
    fig = series_figure(pp, st, ["aaaa1111", "bbbb2222"], "t")
    marks = [(i, c.get_offsets().tolist()) for i, ax in enumerate(fig.axes[:3]) for c in ax.collections
             if c.get_sizes().tolist() == [70]]
    assert [i for i, _ in marks] == [0, 1, 2]
    time_panel = dict(marks)[0]
    assert time_panel == [[1.0, 11.0]]
