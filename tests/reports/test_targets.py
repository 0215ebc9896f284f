"""The targets scorecard (reports/targets.py): each goal of reports/data/paper.csv met, missed or not
measured on small synthetic records, a failed-gate record never meeting a goal, a partial grid's
geo-mean saying its case count, the batch-1 bandwidth row, the report's first section, and the
bundled store's scorecard agreeing with section 2."""
from __future__ import annotations

import pandas as pd
import pytest

from reports import paper, tables, targets
from reports.source import SourceError, from_frames, open_bundled

import targets_records as tr

INT4_B128 = "FOSCAR INT4: fraction of bus peak, batch 128, KV 32K"
INT2_B128 = "FOSCAR INT2: fraction of bus peak, batch 128, KV 32K"
INT4_B1 = "FOSCAR INT4: fraction of bus peak, batch 1, KV 128K"
INT2_B1 = "FOSCAR INT2: fraction of bus peak, batch 1, KV 128K"
INT4_ALU = "FOSCAR INT4: ALU instructions per KV element"
INT2_ALU = "FOSCAR INT2: ALU instructions per KV element"
ACCURACY = "FOSCAR (all widths): relative L2 error against float64"


def speedup(width: int, over: str) -> str:
    label = {"flashinfer-bf16-tc": "FlashInfer BF16, tensor-core", "trtllm-xqa-fp8": "TensorRT-LLM XQA FP8"}[over]
    return f"FOSCAR INT{width}: geo-mean speedup over {label}"


def card(records: list[dict], **kw) -> dict[str, targets.TargetRow]:
    rows = targets.scorecard(tr.frame(records), **kw)
    return {r.target: r for r in rows}


def test_one_row_per_target_in_the_order_of_its_kind():
    rows = targets.scorecard(tr.frame(tr.grid()))
    assert len(rows) == len(paper.targets()) == 11
    kinds = ["frac_peak_bus"] * 4 + ["alu_per_elem"] * 2 + ["speedup_geomean"] * 4 + ["rel_error"]
    assert [r.metric for r in rows] == kinds


def test_met_and_missed_on_a_full_grid():
    rows = card(tr.grid())
    status = {t: r.status for t, r in rows.items()}
    assert status[INT4_B128] == status[INT4_B1] == status[INT4_ALU] == targets.MET
    assert status[INT2_B128] == status[INT2_B1] == status[INT2_ALU] == targets.MISSED
    for width in (4, 2):
        for over in ("flashinfer-bf16-tc", "trtllm-xqa-fp8"):
            row = rows[speedup(width, over)]
            assert row.status == targets.MET and row.cases == 16 and "over the 16 cases" in row.measured_text
    assert rows[speedup(4, "flashinfer-bf16-tc")].measured == pytest.approx(4.0)
    assert rows[speedup(2, "trtllm-xqa-fp8")].measured == pytest.approx(200 / 60)
    assert rows[ACCURACY].status == targets.MET and rows[ACCURACY].measured == pytest.approx(1.7e-3)
    # each row says where its figure came from, and the goal with its comparison
    b128 = rows[INT2_B128]
    assert b128.goal == 0.85 and b128.comparison == ">=" and b128.goal_text == ">= 85.0%"
    assert b128.measured == pytest.approx(0.80) and "80.0% of 4.81 TB/s" in b128.measured_text
    assert b128.case == "batch 128, KV 32768" and b128.runs == "grid-1" and b128.commits == "aaaa1111"
    assert b128.reason.startswith("5.0 points below the goal") and b128.gpu == tr.GPU
    assert rows[INT2_ALU].goal_text == "<= 0.65" and rows[INT2_ALU].measured == pytest.approx(0.70)


def test_the_batch_1_row_is_its_own_target():
    # the batch-1 goals are 80 % for both widths, the batch-128 ones 93 % and 85 %
    assert paper.lookup("targets", "bandwidth", "frac_peak_bus", "foscar-int4", batch=1, kv_len=131072) == (0.8, ">=")
    assert paper.lookup("targets", "bandwidth", "frac_peak_bus", "foscar-int4", batch=128, kv_len=32768)[0] == 0.93
    # a caller that names no case where two figures differ is refused, not given the first row
    with pytest.raises(ValueError, match="name the case"):
        paper.lookup("targets", "bandwidth", "frac_peak_bus", "foscar-int2")
    rows = card(tr.grid(change={("foscar-int4", 1, 131072): {"frac": 0.79}}))
    assert rows[INT4_B1].goal == 0.8 and rows[INT4_B1].case == "batch 1, KV 131072"
    assert rows[INT4_B1].status == targets.MISSED and rows[INT4_B1].measured == pytest.approx(0.79)
    assert rows[INT4_B128].status == targets.MET  # the batch-128 record is another row's


def test_not_measured_says_why():
    records = tr.grid(skip={("foscar-int4", 1, 131072)},
                      change={("foscar-int2", 1, 131072): {"status": "crashed"},
                              ("foscar-int2", 128, 32768): {"alu": None}})
    rows = card(records)
    assert rows[INT4_B1].status == targets.NOT_MEASURED and rows[INT4_B1].measured is None
    assert rows[INT4_B1].reason.startswith("no passed record at batch 1, KV 131072")
    assert rows[INT2_B1].status == targets.NOT_MEASURED and "the newest ended crashed" in rows[INT2_B1].reason
    assert rows[INT2_ALU].status == targets.NOT_MEASURED
    assert "`foscar-bench alu -b foscar-int2 --run grid-1`" in rows[INT2_ALU].reason
    # the speedups of the cases that are missing are over 15 cases: not measured, with the count
    row = rows[speedup(4, "trtllm-xqa-fp8")]
    assert row.status == targets.NOT_MEASURED and row.cases == 15
    assert "only 15 of the 16 grid cases passed for both" in row.reason
    assert "b1 KV 131072 (no record of foscar-int4)" in row.reason


def test_a_partial_grid_geomean_says_how_many_cases_it_covers():
    # FlashInfer ran no batch-1 case: the geo-means over it cover 12 cases, XQA's all 16
    records = tr.grid(skip={("flashinfer-bf16-tc", 1, kv) for kv in tr.KV_LENS})
    rows = card(records)
    for width in (4, 2):
        row = rows[speedup(width, "flashinfer-bf16-tc")]
        assert row.status == targets.NOT_MEASURED and row.cases == 12
        assert "over 12 of the 16 cases" in row.measured_text
        assert row.reason.startswith("only 12 of the 16 grid cases passed for both")
        assert "b1 KV 4096 (no timed record of flashinfer-bf16-tc)" in row.reason
        assert row.measured == pytest.approx(400 / tr.OURS_US[f"foscar-int{width}"])  # still shown
        assert rows[speedup(width, "trtllm-xqa-fp8")].status == targets.MET


def test_a_shape_in_two_page_sizes_counts_once_in_the_grid():
    # a second page size of INT4 at one grid shape: section 2 counts the shape once (its median
    # time), so the grid stays 16 cases
    twin = tr.record("foscar-int4", 8, 4096)
    twin["case_key"] = twin["case_key"].replace("-p64-", "-p128-")
    rows = card(tr.grid() + [twin])
    row = rows[speedup(4, "trtllm-xqa-fp8")]
    assert row.cases == 16 and row.status != targets.NOT_MEASURED
    assert rows[speedup(2, "trtllm-xqa-fp8")].status == targets.MET


def test_a_record_that_failed_the_gate_never_meets_a_goal():
    # INT4's paper-point record failed the gate: its bandwidth, its ALU count (stored on it, and
    # under the limit), its geo-means (over the other 15 cases, above the goal) and accuracy all miss
    records = tr.grid(change={("foscar-int4", 128, 32768): {"status": "incorrect", "alu": 0.5}})
    rows = card(records)
    assert rows[INT4_B128].status == targets.MISSED and "failed the accuracy gate (incorrect" in rows[INT4_B128].reason
    assert rows[INT4_ALU].status == targets.MISSED and rows[INT4_ALU].measured == pytest.approx(0.5)
    for over in ("flashinfer-bf16-tc", "trtllm-xqa-fp8"):
        row = rows[speedup(4, over)]
        assert row.status == targets.MISSED and row.cases == 15 and row.measured > row.goal
        assert "1 of foscar-int4's grid records failed the accuracy gate: b128 KV 32768" in row.reason
    assert rows[speedup(2, "flashinfer-bf16-tc")].status == targets.MET
    acc = rows[ACCURACY]
    assert acc.status == targets.MISSED and acc.reason.startswith("1 record(s) failed the accuracy gate")
    # and a passed record over the accuracy goal misses it too
    over = card(tr.grid(change={("foscar-int2", 8, 4096): {"rel_error": 5e-3}}))[ACCURACY]
    assert over.status == targets.MISSED and over.measured == pytest.approx(5e-3)


def test_the_newest_record_counts_and_another_format_is_named():
    # an older run measured INT4 at 96 %; the newest record (run grid-2) at 91 % decides; a K
    # token-wise record at the same case is named beside it, not counted
    old = tr.frame(tr.grid("grid-1", change={("foscar-int4", 128, 32768): {"frac": 0.96}}),
                   started="2026-01-01T10:00:00+00:00", sha="aaaa1111")
    new = tr.frame(tr.grid("grid-2", change={("foscar-int4", 128, 32768): {"frac": 0.91}})
                   + [tr.record("foscar-int4", 128, 32768, run="grid-2", k_mode="token", frac=0.94)],
                   started="2026-01-02T10:00:00+00:00", sha="bbbb2222")
    rows = {r.target: r for r in targets.scorecard(pd.concat([old, new]))}
    row = rows[INT4_B128]
    assert row.status == targets.MISSED and row.measured == pytest.approx(0.91) and row.runs == "grid-2"
    assert row.commits == "bbbb2222" and "K token, V token, g128 reached 94.0%" in row.reason
    assert "which would meet it" in row.reason
    # --run picks the older run alone
    rows = {r.target: r for r in targets.scorecard(pd.concat([old, new]), runs=["grid-1"])}
    assert rows[INT4_B128].status == targets.MET and rows[INT4_B128].commits == "aaaa1111"
    with pytest.raises(SourceError, match="'nope'"):
        targets.scorecard(pd.concat([old, new]), runs=["nope"])


def test_the_gpu_judged():
    h100 = tr.grid(gpu="NVIDIA H100 80GB HBM3")
    rows = targets.scorecard(tr.frame(h100))
    assert {r.status for r in rows} == {targets.NOT_MEASURED}
    assert all("no record on an H200 in the selected runs (they hold NVIDIA H100 80GB HBM3" in r.reason for r in rows)
    judged = targets.scorecard(tr.frame(h100), gpu="h100")
    assert {r.gpu for r in judged} == {"NVIDIA H100 80GB HBM3"} and judged[0].status == targets.MET
    with pytest.raises(ValueError, match="'B200' is not a GPU of the selected runs"):
        targets.scorecard(tr.frame(h100), gpu="B200")
    both = tr.frame(h100 + tr.grid(gpu="NVIDIA H100 NVL"))
    with pytest.raises(ValueError, match="'H100' matches 2 GPUs"):
        targets.scorecard(both, gpu="H100")


def test_the_report_opens_with_the_scorecard(rendered_report):
    text = rendered_report.read_text()
    assert text.index(f'id="{targets.ANCHOR}"') < text.index('id="bandwidth"') < text.index('id="speedups"')
    section = text.split(f'id="{targets.ANCHOR}"')[1].split("<h2")[0]
    assert "never meets a target" in section and 'href="targets.csv"' in section
    card_csv = pd.read_csv(rendered_report.parent / "targets.csv")
    assert len(card_csv) == len(paper.targets())
    # the fixture's grid is batch 1, 8, 128 x KV 4K, 32K, 128K: 9 of the 16 cases
    geo = card_csv[card_csv["metric"] == "speedup_geomean"]
    assert (geo["status"] == targets.NOT_MEASURED).all() and (geo["cases"] == 9).all()


def test_the_bundled_scorecard_is_section_2s_geomeans(rendered_bundled):
    out = rendered_bundled.parent
    card_csv = pd.read_csv(out / "targets.csv")
    assert len(card_csv) == len(paper.targets())
    assert set(card_csv["status"]) <= {targets.MET, targets.MISSED, targets.NOT_MEASURED}
    section2 = pd.read_csv(out / "speedups.csv")
    section2 = section2[section2["format"] == tables.fmt_label(targets.FORMAT)].set_index(["kernel", "over"])
    for _, row in card_csv[card_csv["metric"] == "speedup_geomean"].iterrows():
        same = section2.loc[(row["backend"], row["over"])]
        assert row["cases"] == same["n_cases"] == 16
        assert row["measured"] == pytest.approx(same["geomean_speedup"], rel=1e-12)
    # and the bandwidth rows are section 1's figures
    section1 = pd.read_csv(out / "bandwidth.csv")
    kc = section1[section1["format"] == tables.fmt_label(targets.FORMAT)].set_index("backend")
    paper_point = card_csv[(card_csv["metric"] == "frac_peak_bus") & card_csv["case"].str.startswith("batch 128")]
    assert len(paper_point) == 2
    for _, row in paper_point.iterrows():
        assert row["measured"] == pytest.approx(kc.loc[row["backend"], "frac_peak_bus"], rel=1e-12)


def test_the_bundled_store_gives_a_row_per_target():
    rows = targets.scorecard(open_bundled())
    assert [r.target for r in rows] == [r.target for r in targets.scorecard(open_bundled(), runs=["all"])]
    assert len(rows) == len(paper.targets())
    assert all(r.status in (targets.MET, targets.MISSED, targets.NOT_MEASURED) and r.reason for r in rows)
    assert all(r.runs for r in rows if r.status != targets.NOT_MEASURED)


def test_from_frames_and_results_agree():
    records = tr.grid()
    a = targets.frame(targets.scorecard(tr.frame(records)))
    b = targets.frame(targets.scorecard(from_frames(tr.frame(records))))
    pd.testing.assert_frame_equal(a, b)
