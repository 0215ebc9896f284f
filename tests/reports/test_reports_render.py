"""The report renders from a store, sets the paper's values beside ours, and says so when data is missing."""
from __future__ import annotations

import hashlib
import re
import shutil

import pandas as pd
import pytest

from reports import report, source
from reports.report import build_report
from reports.source import SourceError, from_frames, open_store, select_runs


def test_report_writes_figures_tables_and_page(rendered_report):
    out = rendered_report.parent
    text = rendered_report.read_text()
    for stem in ("roofline_bandwidth_nvidia-h200", "roofline_classic_nvidia-h200",
                 "scaling_kv_len_nvidia-h200", "scaling_batch_nvidia-h200", "accuracy"):
        assert (out / f"{stem}.png").stat().st_size > 10_000
        assert (out / f"{stem}.svg").read_text().lstrip().startswith("<?xml")
        assert f'src="{stem}.png"' in text
    for csv in ("bandwidth", "speedups", "accuracy", "status"):
        assert len(pd.read_csv(out / f"{csv}.csv")) > 0
    # every image the page names exists, and every figure has a caption naming GPU and run
    for src in re.findall(r'<img src="([^"]+)"', text):
        assert (out / src).exists()
    assert text.count("<figcaption>") == 5
    assert text.count("GPU: NVIDIA H200. run run-f00dfe (git f00dfeed)") >= 5


def test_bandwidth_table_sets_paper_beside_ours(rendered_report):
    table = pd.read_csv(rendered_report.parent / "bandwidth.csv")
    row = table[table["backend"] == "foscar-int4"].iloc[0]
    assert row["paper_h100"] == pytest.approx(0.913) and row["paper_b200"] == pytest.approx(0.686)
    assert row["target_frac_bus"] == pytest.approx(0.93)
    assert 0.85 < row["frac_peak_bus"] < 0.95
    xqa = table[table["backend"] == "trtllm-xqa-fp8"].iloc[0]
    assert xqa["h200_reference_frac_bus"] == pytest.approx(0.90)
    assert table["kernel"].str.contains("TensorRT-LLM NVFP4").any()  # paper row with no backend of ours


def test_speedups_are_geometric_means_over_cases_both_passed(rendered_report):
    out = rendered_report.parent
    table = pd.read_csv(out / "speedups.csv")
    cases = pd.read_csv(out / "speedups_per_case.csv")
    row = table[(table["kernel"] == "foscar-int2") & (table["over"] == "flashinfer-bf16-tc")].iloc[0]
    mine = cases[(cases["backend"] == "foscar-int2") & (cases["over"] == "flashinfer-bf16-tc")]
    expect = float((mine["over_us"] / mine["ours_us"]).apply("log").mean())
    assert row["geomean_speedup"] == pytest.approx(pd.Series([expect]).apply("exp")[0])
    assert row["n_cases"] == 9 and row["paper_h100"] == pytest.approx(3.36)
    # bitdecoding-int2 failed one case (incorrect): it is left out of that pair only
    assert table[(table["kernel"] == "foscar-int2") & (table["over"] == "bitdecoding-int2")]["n_cases"].iloc[0] == 8
    assert "torch-ref" not in set(table["over"])


def test_report_of_records_without_data_says_so(tmp_path):
    only_unsupported = pd.DataFrame([{
        "run_id": "r1", "case_key": "c", "backend": "trtllm-nvfp4", "status": "unsupported",
        "reason": "needs Blackwell", "gpu_name": "NVIDIA H200", "batch": 128, "kv_len": 32768,
        "started_at": "2025-01-01T00:00:00+00:00", "git_sha": "abc",
    }])
    index = build_report(from_frames(only_unsupported), tmp_path)
    text = index.read_text()
    assert "nothing to plot" in text and "no accuracy plot" in text
    assert "<img" not in text
    empty = build_report(from_frames(only_unsupported.iloc[0:0]), tmp_path / "empty")
    assert "hold no records" in empty.read_text()


def test_missing_store_and_missing_bundled_are_one_sentence(tmp_path, monkeypatch):
    with pytest.raises(SourceError, match="does not exist"):
        open_store(tmp_path / "nope.sqlite")
    assert not (tmp_path / "nope.sqlite").exists()
    monkeypatch.setattr(source, "BUNDLED_DB", tmp_path / "bundled.sqlite")
    with pytest.raises(SourceError, match="no bundled results ship"):
        source.open_bundled()


def test_bundled_renders_without_touching_the_shipped_file(fixture_store, tmp_path, monkeypatch):
    db, _, _ = fixture_store
    shipped = tmp_path / "bundled.sqlite"
    shutil.copyfile(db, shipped)
    before = hashlib.sha256(shipped.read_bytes()).hexdigest()
    monkeypatch.setattr(source, "BUNDLED_DB", shipped)
    results = select_runs(source.open_bundled(), ["all"])
    assert results.records["run_id"].nunique() == 2
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundled.sqlite"]


def test_runs_are_chosen_by_id_sha_or_latest(fixture_store):
    db, base, head = fixture_store
    results = open_store(db)
    assert set(select_runs(results, None).records["run_id"]) == {head}
    assert set(select_runs(results, ["a1b2c3d4"]).records["run_id"]) == {base}
    with pytest.raises(SourceError, match="neither a run id nor a git sha"):
        select_runs(results, ["deadbeef"])


def test_slug():
    assert report.slug("NVIDIA H200 (141 GB)") == "nvidia-h200-141-gb"


def _ours_and_bf16(rows):
    """Records of our INT2 in the (k_mode, v_mode, batch, run, sha) given, and FlashInfer BF16 at each batch."""
    out = []
    for k_mode, v_mode, batch, run, sha in rows:
        out.append({"run_id": run, "case_key": f"b{batch}-k{k_mode[0]}-v{v_mode[0]}", "backend": "foscar-int2",
                    "family": "foscar", "status": "passed", "gpu_name": "NVIDIA H200", "batch": batch,
                    "kv_len": 32768, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "bits": 2,
                    "k_mode": k_mode, "v_mode": v_mode, "group_size": 128,
                    "median_us": 100.0 if k_mode == "channel" else 50.0,
                    "started_at": f"2026-01-0{run[-1]}", "git_sha": sha})
    for batch in sorted({r[2] for r in rows}):
        out.append({"run_id": "r1", "case_key": f"b{batch}-bf16", "backend": "flashinfer-bf16-tc",
                    "family": "flashinfer", "status": "passed", "gpu_name": "NVIDIA H200", "batch": batch,
                    "kv_len": 32768, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "bits": 16,
                    "k_mode": "none", "v_mode": "none", "group_size": 0, "median_us": 300.0,
                    "started_at": "2026-01-01", "git_sha": "aaaa1111"})
    return from_frames(pd.DataFrame(out)).records


def test_each_format_of_ours_is_a_row_of_its_own_cases():
    # K channel at two batches (run r1), K token at one of them only, at a later commit (r2):
    # the token-K point is its own row, not a third case of one geo-mean
    from reports import tables

    recs = _ours_and_bf16([("channel", "token", 8, "r1", "aaaa1111"), ("channel", "token", 128, "r1", "aaaa1111"),
                           ("token", "token", 128, "r2", "bbbb2222")])
    table = tables.speedup_table(recs)
    assert sorted(table.frame["n_cases"]) == [1, 2]
    rows = table.frame.set_index("format")
    assert list(rows.index) == ["K channel, V token, g128", "K token, V token, g128"]
    assert rows["n_cases"].tolist() == [2, 1]
    assert rows["geomean_speedup"].tolist() == pytest.approx([3.0, 6.0])
    assert rows["ours_commits"].tolist() == ["aaaa1111", "bbbb2222"]
    assert table.display["format"].tolist() == list(rows.index)
    # section 1: our rows come from two commits, and each says which
    band = tables.bandwidth_table(recs).display
    ours = band[band["kernel"] == "FOSCAR INT2 (ours)"]
    assert ours.set_index("format")["commit"].to_dict() == {
        "K channel, V token, g128": "aaaa1111", "K token, V token, g128": "bbbb2222"}
    one = tables.bandwidth_table(recs[recs["run_id"] == "r1"]).display
    assert "commit" not in one and "run" not in one  # one run: no column


def test_bundled_speedups_are_per_format_and_agree_with_the_bound(rendered_bundled):
    # The paper point (b128/32K) was measured in three K/V formats (the two token-wise-K ones in
    # paper-tokenk-h200-e0c73ba); each format is a row of its own. The K-channel rows are the 16
    # grid cases of section 2b (was one row of 18 cases: 3.15x, 2.85x and 1.92x).
    out = rendered_bundled.parent
    table = pd.read_csv(out / "speedups.csv")
    bound = pd.read_csv(out / "speedup_bound.csv")
    int2 = table[(table["kernel"] == "foscar-int2") & (table["over"] == "flashinfer-bf16-tc")]
    assert int2["n_cases"].tolist() == [16, 1, 1]  # K channel / V token, K token / V channel, K token / V token
    kc = table[table["format"] == "K channel, V token, g128"].set_index(["kernel", "over"])
    for ours, over, expect in (("foscar-int2", "flashinfer-bf16-tc", 3.17), ("foscar-int4", "flashinfer-bf16-tc", 2.84),
                               ("foscar-int2", "trtllm-xqa-fp8", 1.96)):
        row = kc.loc[(ours, over)]
        assert row["n_cases"] == 16 and round(row["geomean_speedup"], 2) == expect
        b = bound[(bound["ours"] == ours) & (bound["over"] == over) & (bound["format"] == "K channel, V token, g128")]
        # 2b reads the grid run alone; here the paper run's later b128/32K records win (INT4 1051.0 us
        # there against the grid's 1083.9, its SM clock dipping): one case of 16, 0.2 % of the geo-mean
        assert row["geomean_speedup"] == pytest.approx(b["geomean_speedup"].iloc[0], rel=3e-3)
    tk = table[table["format"] == "K token, V token, g128"]
    assert (tk["n_cases"] == 1).all() and set(tk["ours_commits"]) == {"e0c73ba"}
    assert (table[table["over"] == "flashinfer-bf16-fa3"]["n_cases"] == 1).all()
    text = rendered_bundled.read_text()
    section1 = text.split('id="bandwidth"')[1].split("<h2")[0]
    assert "<th>commit</th>" in section1 and "e0c73ba" in section1 and "8659cba" in section1  # ours, a baseline's


def test_a_shape_of_ours_in_two_page_sizes_counts_once():
    # Records that differ only in what the shape leaves out (here the page size) are one case:
    # counted twice, they would weigh that shape double in every geo-mean.
    from reports import tables

    shape = {"gpu_name": "NVIDIA H200", "batch": 8, "kv_len": 4096, "num_q_heads": 32, "num_kv_heads": 8,
             "head_dim": 128}
    fmt = {"k_mode": "channel", "v_mode": "token", "group_size": 128}

    def rec(backend, us, page, run="r1"):
        return {**shape, **fmt, "backend": backend, "family": "foscar" if backend.startswith("foscar") else "flashinfer",
                "status": "passed", "median_us": us, "page_size": page, "run_id": run, "git_sha": "abc",
                "git_dirty": 0}

    records = pd.DataFrame([rec("foscar-int4", 10.0, 16), rec("foscar-int4", 20.0, 128, "r2"),
                            rec("flashinfer-bf16-tc", 60.0, 16)])
    pairs = tables.case_speedups(records)
    assert len(pairs) == 1
    assert pairs["ours_us"].iloc[0] == pytest.approx(15.0) and pairs["speedup"].iloc[0] == pytest.approx(4.0)
    assert pairs["run_id"].iloc[0] == "r2"
    assert tables.speedup_table(records).frame["n_cases"].tolist() == [1]


def test_the_paper_bandwidth_table_keeps_the_papers_heads():
    # Another model at batch 128 / KV 32K is not a row of the paper's table; a note says so.
    from reports import tables

    def rec(heads, us):
        q, kv = heads
        return {"gpu_name": "NVIDIA H200", "batch": 128, "kv_len": 32768, "num_q_heads": q, "num_kv_heads": kv,
                "head_dim": 128, "backend": "foscar-int4", "family": "foscar", "status": "passed", "median_us": us,
                "frac_peak_bus": 0.9, "k_mode": "channel", "v_mode": "token", "group_size": 128, "run_id": "r1",
                "git_sha": "abc", "git_dirty": 0, "bits": 4, "eff_bandwidth_tbps": 4.3,
                "frac_peak_datasheet": 0.9, "frac_read_ceiling": 0.92}

    records = pd.DataFrame([rec((32, 8), 1000.0), rec((64, 8), 2000.0)])
    assert len(tables.headline(records)) == 1
    table = tables.bandwidth_table(records)
    assert "1 record(s) at batch 128, KV 32K with other heads" in " ".join(table.notes)
