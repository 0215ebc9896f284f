"""scripts/timeline_tail.py: the CTAs' ends by rank, their rate per quarter and the tail's cost,
on a launch made up so that every figure is known."""
from __future__ import annotations

import gzip
import json

import pytest

COLUMNS = ["cta", "k", "item", "entry_us", "item_us", "first_copy_us", "first_s_us", "last_trip_us", "folded_us",
           "stored_us", "written_us", "counted_us", "merge_fenced_us", "merge_weighted_us", "merged_us",
           "quarter1_us", "half_us", "quarter3_us"]


@pytest.fixture(scope="module")
def tail(script):
    return script("timeline_tail")


def _launch(quarters: bool, second_item: bool = False) -> dict:
    # 2 SMs x 2 CTAs, 100 chunks each from t = 10 us: rank 0 at 1 chunk a us (ends at 110),
    # rank 1 at 0.5 a us while rank 0 runs, then 1 a us alone (50 chunks by 110, ends at 160).
    rows = []
    for cta in range(4):
        if cta < 2:
            q = [35, 60, 85]
            end = 110
        else:
            q = [60, 110, 135]
            end = 160
        row = [cta, 0, cta, 0.1, 1.0, 1.2, 10.0, end, end + 0.2, end + 1, end + 1.1] + [None] * 4
        row += q if quarters else [None] * 3
        rows.append(row)
    if second_item:  # CTA 0 runs a second item, after its first
        rows.append([0, 1, 4, None, 111.0, None, 112.0, 130.0, 130.2, 131, 131.1] + [None] * 7)
    return {"timelines": [{"config": "4ct", "variant": "tl", "num_splits": 1, "chunks_per_split": 100,
                           "cold": {"columns": COLUMNS, "ctas": rows}}]}


def test_ranks_quarters_and_the_tails_cost(tail, tmp_path):
    r = tail.analyse(_launch(quarters=True)["timelines"][0], sms=2, step=1.0)
    assert r["end_by_rank"][0]["p10_median_p90_max"][-1] == 110 and r["end_by_rank"][1]["n"] == 2
    assert r["quarters"] == {0: [1.0, 1.0, 1.0, 1.0], 1: [2.0, 2.0, 1.0, 1.0]}  # rank 1 speeds up alone
    t = r["tail"]
    # while all four run: 2 x 1 + 2 x 0.5 chunks a us; 400 chunks at 3 a us from t = 10: 143.3 us
    assert t["main_rate_chunks_per_us"] == pytest.approx(3.0, abs=0.3)
    assert t["last_end_us"] == 160 and t["ideal_end_us"] == pytest.approx(143.3, abs=8)
    assert t["tail_cost_pct"] > 5
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_launch(quarters=True)).encode()))
    assert tail.main([str(path), "--sms", "2"]) == 0


def test_without_quarters_or_with_a_second_item(tail):
    r = tail.analyse(_launch(quarters=False)["timelines"][0], sms=2, step=1.0)
    assert r["quarters"] is None and r["tail"]["last_end_us"] == 160
    r = tail.analyse(_launch(quarters=True, second_item=True)["timelines"][0], sms=2, step=1.0)
    assert r["end_by_rank"][0]["p10_median_p90_max"][-1] == 130  # CTA 0's second item ends last
    assert r["tail"]["last_end_us"] == 160  # the tail counts the first items
