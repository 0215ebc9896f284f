"""The report's e2e section: tables and figures from a store's e2e tables, the paper's claim beside
them with the caveat, and an honest sentence when the store holds none (the bundled one, today)."""
from __future__ import annotations

import hashlib

import pandas as pd
import pytest
from typer.testing import CliRunner

from reports import e2e, source
from suite.cli import app
from core.e2e_store import E2EStore

FORMATS = {"flashinfer-bf16-tc": (16, 2.0), "trtllm-xqa-fp8": (8, 1.0), "foscar-int4": (4, 0.53),
           "foscar-int2": (2, 0.28)}


def fill(db) -> None:
    """Plausible, made-up H200 e2e records (a fixture, not measurements): one run, every mode."""
    with E2EStore(db) as store:
        run = store.start_run(argv=["fixture"], config={}, env={})
        base = {"model": "llama3-8b", "model_label": "llama3-8b", "num_layers": 32, "model_layers": 32,
                "gpu_name": "NVIDIA H200", "budget_bytes": 120e9}
        for name, (bits, bytes_per_elem) in FORMATS.items():
            store.add(run, {**base, "mode": "check", "status": "passed", "backend": name, "bits": bits, "batch": 3,
                            "kv_len": 383, "logits_rel_error": 3e-3, "logits_tolerance": 1e-2, "top1_agreement": 1.0})
            for kv in (4096, 32768, 131072):
                kv_ms = lambda batch: 32 * batch * kv * 2048 * bytes_per_elem / 4.4e12 * 1e3  # noqa: E731
                for batch in (1, 8, 32, 128):
                    if batch * kv * 131072 * bytes_per_elem / 2 > 120e9:
                        store.add(run, {**base, "mode": "grid", "status": "does_not_fit", "backend": name,
                                        "bits": bits, "batch": batch, "kv_len": kv, "reason": "needs more"})
                        continue
                    attn, rest = kv_ms(batch) + 0.3, 3.6 + 0.01 * batch
                    store.add(run, {**base, "mode": "grid", "status": "passed", "backend": name, "bits": bits,
                                    "batch": batch, "kv_len": kv, "step_median_us": (attn + rest) * 1e3,
                                    "step_p10_us": (attn + rest) * 990, "step_p90_us": (attn + rest) * 1020,
                                    "step_mean_us": (attn + rest) * 1e3, "noattn_step_median_us": rest * 1e3,
                                    "attn_us": attn * 1e3, "rest_us": rest * 1e3, "attn_share": attn / (attn + rest),
                                    "tokens_per_s": batch / (attn + rest) * 1e3,
                                    "flush_step_median_us": (attn + rest) * 1.05e3 if bits < 8 else None})
                cap = int(120e9 // (kv * 131072 * bytes_per_elem / 2))
                attn, rest = kv_ms(cap) + 0.3, 3.6 + 0.01 * cap
                store.add(run, {**base, "mode": "capacity", "status": "passed", "backend": name, "bits": bits,
                                "batch": cap, "capacity_batch": cap, "kv_len": kv, "step_median_us": (attn + rest) * 1e3,
                                "step_p10_us": (attn + rest) * 990, "step_p90_us": (attn + rest) * 1020,
                                "step_mean_us": (attn + rest) * 1e3, "noattn_step_median_us": rest * 1e3,
                                "attn_us": attn * 1e3, "rest_us": rest * 1e3, "attn_share": attn / (attn + rest),
                                "tokens_per_s": cap / (attn + rest) * 1e3})


@pytest.fixture(scope="module")
def e2e_report(tmp_path_factory):
    """The report of a store holding e2e runs alone (the sweep sections say they are empty)."""
    db = tmp_path_factory.mktemp("e2e") / "results.sqlite"
    fill(db)
    out = tmp_path_factory.mktemp("report-e2e")
    result = CliRunner().invoke(app, ["report", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out / "index.html"


def test_section_has_tables_figures_and_the_caveat(e2e_report):
    out, text = e2e_report.parent, e2e_report.read_text()
    for stem in ("e2e_throughput", "e2e_split"):
        assert (out / f"{stem}.png").stat().st_size > 10_000 and f'src="{stem}.png"' in text
    rates = pd.read_csv(out / "e2e_throughput.csv")
    assert set(rates["KV"]) == {"4K", "32K", "128K"}
    bf16_128k = rates[(rates["KV"] == "128K") & rates["format"].str.startswith("BF16")].iloc[0]
    assert bf16_128k["batch 32"] == "does not fit" and float(bf16_128k["batch 1"]) > 0
    cap = pd.read_csv(out / "e2e_capacity.csv")
    int2 = cap[(cap["KV"] == "32K") & cap["format"].str.startswith("INT2")].iloc[0]
    assert int2["vs BF16"].endswith("%)") and float(int2["vs BF16"].split("x")[0]) > 1
    assert cap[cap["format"].str.startswith("BF16")]["vs BF16"].isna().all()
    split = pd.read_csv(out / "e2e_split.csv")
    assert {"attention (ms)", "rest (ms)", "attention share"} <= set(split.columns)
    assert len(pd.read_csv(out / "e2e_check.csv")) == 4
    assert "+341%" in text and "decode-only and synthetic" in text
    assert text.count("<figcaption>") == 2 and "hold no records" in text


def test_newest_record_per_point_wins():
    rows = pd.DataFrame([
        {"id": 1, "run_id": "a", "started_at": "2026-01-01", "gpu_name": "G", "model_label": "m", "mode": "grid",
         "backend": "foscar-int4", "batch": 8, "kv_len": 4096, "tokens_per_s": 1.0},
        {"id": 2, "run_id": "b", "started_at": "2026-02-01", "gpu_name": "G", "model_label": "m", "mode": "grid",
         "backend": "foscar-int4", "batch": 8, "kv_len": 4096, "tokens_per_s": 2.0},
        {"id": 3, "run_id": "b", "started_at": "2026-02-01", "gpu_name": "G", "model_label": "m", "mode": "capacity",
         "backend": "foscar-int4", "batch": 90, "kv_len": 4096, "tokens_per_s": 5.0},
    ])
    got = e2e.latest(rows)
    assert sorted(got["tokens_per_s"]) == [2.0, 5.0]


class _Page:
    def __init__(self, out):
        self.out, self.body = out, []


def test_bundled_store_says_when_it_has_no_e2e_results(tmp_path):
    bundled = source.BUNDLED_DB
    before = hashlib.sha256(bundled.read_bytes()).hexdigest()
    results = source.open_bundled()
    if not e2e.load(results).empty:
        pytest.skip("the bundled store holds e2e results now")
    page = _Page(tmp_path)
    e2e.section(page, results)
    assert any("No e2e results in this store" in part for part in page.body)
    assert hashlib.sha256(bundled.read_bytes()).hexdigest() == before


def test_the_section_survives_an_unreadable_store(tmp_path, monkeypatch):
    monkeypatch.setattr(e2e, "load", lambda results: (_ for _ in ()).throw(RuntimeError("bad table")))
    page = _Page(tmp_path)
    e2e.section(page, source.Results(pd.DataFrame(), pd.DataFrame(), db="x"))
    assert any("could not be read (RuntimeError: bad table)" in part for part in page.body)


def test_several_stores_read_each_ones_e2e_tables(fixture_store, tmp_path):
    # two sweep stores, the second also holding e2e runs: the section reads its e2e tables (they
    # were looked for in one file named "first, second" and the section said there were none)
    import shutil

    db, _, head = fixture_store
    with_e2e = tmp_path / "with_e2e.sqlite"
    shutil.copyfile(db, with_e2e)
    fill(with_e2e)
    both = source.open_stores([db, with_e2e])
    alone = e2e.load(source.open_store(with_e2e))
    assert len(alone) > 0 and len(e2e.load(both)) == len(alone)
    assert both.dbs == [str(db), str(with_e2e)] and source.select_runs(both, [head]).dbs == both.dbs
    assert len(e2e.load(source.open_stores([with_e2e, with_e2e]))) == len(alone)  # a run in two counts once
    result = CliRunner().invoke(app, ["report", "--db", str(db), "--db", str(with_e2e), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "o" / "index.html").read_text()
    assert e2e.EMPTY not in page and 'src="e2e_throughput.png"' in page


def test_the_check_table_shows_the_no_op_steps_error_and_ratios_take_no_records():
    import json

    rec = {"mode": "check", "gpu_name": "H200", "model_label": "llama3-8b", "backend": "trtllm-xqa-fp8",
           "batch": 1, "kv_len": 4096, "logits_rel_error": 0.012, "logits_tolerance": 0.0155,
           "top1_agreement": 1.0, "status": "passed", "reason": None,
           "extra_json": json.dumps({"noattn_logits_rel_error": 0.062})}
    table = e2e.check_table(pd.DataFrame([rec]))
    assert table.loc[0, "attention a no-op: rel. L2"] == "6.20e-02" and table.loc[0, "bound"] == "0.0155"
    assert e2e.ratios(pd.DataFrame()) == []  # a run with no capacity points: no summary line, no error
