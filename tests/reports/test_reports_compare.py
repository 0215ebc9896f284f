"""compare and the noise rule: same / faster / slower / ambiguous from each side's own
noise and SM clocks. Two runs of unchanged code call nothing; an injected 5% slowdown is
caught; the CI gate keeps its exit codes."""
from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reports import noise
from reports.compare import compare
from reports.noise import Sample, classify, judge, parse_fraction
from reports.source import open_store
from reports_fixture import PLANTED_NOISE, PLANTED_SLOW
from suite.cli import app
from core.store import ResultStore
from suite.timing import summarize

BUNDLED = Path(__file__).resolve().parents[2] / "reports" / "data" / "bundled.sqlite"
BASELINES = ("flashinfer-bf16", "flashinfer-bf16-tc", "flashinfer-fp8", "flashinfer-nvfp4-tc", "trtllm-xqa-fp8")


def _row(cmp, planted):
    backend, batch, kv_len, _ = planted
    ch = cmp.changes
    return ch[(ch["backend"] == backend) & (ch["batch"] == batch) & (ch["kv_len"] == kv_len)].iloc[0]


def test_planted_slowdown_is_caught_and_noise_is_ignored(fixture_store):
    db, base, head = fixture_store
    cmp = compare(open_store(db), base, head, min_change=0.02, fail_threshold=0.05)
    slow = _row(cmp, PLANTED_SLOW)
    assert slow["verdict"] == noise.SLOWER and slow["gate"]
    assert slow["change"] == pytest.approx(0.10, abs=0.01)
    quiet = _row(cmp, PLANTED_NOISE)
    assert quiet["verdict"] == noise.SAME and not quiet["gate"]
    assert len(cmp.failures) == 1
    assert (cmp.changes["verdict"] == noise.SLOWER).sum() == 1


def test_compare_cli_exit_codes(fixture_store):
    db, base, head = fixture_store
    runner = CliRunner()
    failed = runner.invoke(app, ["compare", base, head, "--db", str(db), "--fail-on-regression", "5%"])
    assert failed.exit_code == 1, failed.output
    assert "foscar-int2" in failed.output and "fails gate" in failed.output
    lenient = runner.invoke(app, ["compare", "a1b2c3d4", "f00dfeed", "--db", str(db), "--fail-on-regression", "15%"])
    assert lenient.exit_code == 0, lenient.output
    no_gate = runner.invoke(app, ["compare", base, head, "--db", str(db)])
    assert no_gate.exit_code == 0
    same = runner.invoke(app, ["compare", head, head, "--db", str(db), "--fail-on-regression", "1%"])
    assert same.exit_code == 0 and "0 regression" in same.output
    unknown = runner.invoke(app, ["compare", "nope", head, "--db", str(db)])
    assert unknown.exit_code == 2 and "neither a run id" in unknown.output


def test_rule_same_faster_slower_ambiguous():
    base = Sample(100.0, spread=0.004)  # median known to +-0.2%
    assert classify(base, Sample(110.0, spread=0.004), 0.05) == noise.SLOWER
    assert classify(base, Sample(90.0, spread=0.004), 0.05) == noise.FASTER
    assert classify(base, Sample(103.0, spread=0.004), 0.05) == noise.SAME
    # beyond the threshold, but HEAD's median is known only to +-10%: cannot tell
    j = judge(base, Sample(106.0, spread=0.2), 0.05)
    assert j.verdict == noise.AMBIGUOUS and "within the noise" in j.reason
    # within the threshold, but the interval of the change reaches past it
    assert classify(base, Sample(104.9, spread=0.004), 0.05) == noise.AMBIGUOUS
    # a bigger-is-better metric swaps the called verdicts
    assert classify(base, Sample(110.0, spread=0.004), 0.05, smaller_is_better=False) == noise.FASTER
    # no noise information at all: the medians alone decide
    assert classify(Sample(100.0), Sample(110.0), 0.05) == noise.SLOWER


def test_rule_checks_sm_clocks_before_calling_a_change():
    base = Sample(100.0, spread=0.004, sm_clock_mhz=1980)
    j = judge(base, Sample(110.0, spread=0.004, sm_clock_mhz=1755), 0.05)
    assert j.verdict == noise.AMBIGUOUS and "1980 vs 1755 MHz" in j.reason
    assert classify(base, Sample(110.0, spread=0.004, sm_clock_mhz=1965), 0.05) == noise.SLOWER
    # clocks never turn "same" into anything else
    assert classify(base, Sample(100.5, spread=0.004, sm_clock_mhz=1500), 0.05) == noise.SAME


def test_noise_estimated_from_band_and_count_when_no_spread_is_recorded():
    # p10..p90 of +-1.28% is sigma 1%; the median of 100 samples is then known to
    # 1.96 x 1.2533 x 1% / 10 = 0.25%
    s = Sample(100.0, 98.72, 101.28, n=100)
    assert s.noise == pytest.approx(0.00246, rel=0.01)
    assert Sample(100.0, 98.0, 102.0).noise == pytest.approx(0.02)  # no count: half the band
    assert Sample(100.0, spread=0.01).noise == pytest.approx(0.005)


def test_status_loss_fails_the_gate(fixture_store, tmp_path):
    from reports_fixture import _record

    db = tmp_path / "s.sqlite"
    with ResultStore(db) as store:
        a = store.start_run(argv=[], config={}, env={}, run_id="A")
        b = store.start_run(argv=[], config={}, env={}, run_id="B")
        rng = random.Random(0)
        store.add_record(a, _record("foscar-int4", 8, 4096, 1.0, rng))
        crashed = {**_record("foscar-int4", 8, 4096, 1.0, rng), "status": "crashed", "reason": "illegal address"}
        store.add_record(b, crashed)
    cmp = compare(open_store(db), "A", "B", fail_threshold=0.05)
    assert cmp.changes["verdict"].tolist() == ["now crashed"]
    assert len(cmp.failures) == 1


# --- real H200 records: two runs whose baselines did not change ------------------------
@pytest.fixture
def bundled_copy(tmp_path) -> Path:
    """The bundled store (two H200 runs, 10 minutes apart, baselines' code unchanged)."""
    copy = tmp_path / "bundled.sqlite"
    shutil.copyfile(BUNDLED, copy)
    return copy


def test_unchanged_baselines_on_the_h200_call_nothing(bundled_copy):
    cmp = compare(open_store(bundled_copy), "20261130-085004-a6621d", "20261130-090005-b4a33e",
                  min_change=0.02, fail_threshold=0.05)
    ch = cmp.changes
    timed = ch[ch["backend"].isin(BASELINES) & ch["change"].notna()]
    assert len(timed) == 5
    assert set(timed["verdict"]) == {noise.SAME}, timed[["backend", "change", "noise", "verdict"]]
    # HEAD re-ran the baselines (ours under other names, no torch-ref): the series BASE passed
    # and HEAD lacks fail the gate, no baseline does
    assert set(cmp.failures["verdict"]) == {"gone"} and not cmp.failures["backend"].isin(BASELINES).any()


def _inject(db: Path, run_from: str, run_to: str, factor: float, backend: str) -> None:
    """Copy run `run_from` as `run_to` with `backend`'s times multiplied by factor."""
    con = sqlite3.connect(db)
    con.execute("INSERT INTO runs SELECT ?, started_at || 'x', git_sha, git_dirty, argv, config_json, "
                "config_hash, env_json FROM runs WHERE run_id = ?", (run_to, run_from))
    cols = [r[1] for r in con.execute("PRAGMA table_info(records)") if r[1] not in ("id", "run_id")]
    con.execute(f"INSERT INTO records (run_id, {', '.join(cols)}) SELECT ?, {', '.join(cols)} "
                "FROM records WHERE run_id = ?", (run_to, run_from))
    con.execute("UPDATE records SET median_us = median_us * ?, p10_us = p10_us * ?, p90_us = p90_us * ? "
                "WHERE run_id = ? AND backend = ?", (factor, factor, factor, run_to, backend))
    con.commit()
    con.close()


def test_injected_5_percent_slowdown_on_h200_records_is_caught(bundled_copy):
    base = "20261130-085004-a6621d"
    _inject(bundled_copy, base, "slow", 1.05, "foscar-int4")
    cmp = compare(open_store(bundled_copy), base, "slow", min_change=0.02, fail_threshold=0.03)
    ch = cmp.changes.set_index("backend")
    assert ch.loc["foscar-int4", "verdict"] == noise.SLOWER and ch.loc["foscar-int4", "gate"]
    others = ch.drop(index="foscar-int4")
    assert set(others[others["change"].notna()]["verdict"]) == {noise.SAME}
    res = CliRunner().invoke(app, ["compare", base, "slow", "--db", str(bundled_copy),
                                   "--fail-on-regression", "3%"])
    assert res.exit_code == 1 and "fails gate" in res.output


# --- synthetic: many series, real sampling, run-to-run drift ------------------------------
def _synthetic_store(path: Path, slowdown: float, seed: int) -> None:
    """BASE and HEAD runs of 120 series: samples drawn with 1-3% jitter, each run shifted by
    up to 0.5% (drift between runs), summarised as a sweep would; HEAD x slowdown."""
    rng = random.Random(seed)
    with ResultStore(path) as store:
        for run, factor in (("BASE", 1.0), ("HEAD", slowdown)):
            store.start_run(argv=[], config={}, env={}, run_id=run)
            drift = 1 + rng.uniform(-0.005, 0.005)
            for i in range(120):
                true_us = 10.0 * 1.05 ** i
                sigma = 0.01 + 0.02 * (i % 3) / 2
                samples = [true_us * factor * drift * rng.lognormvariate(0, sigma) for _ in range(300)]
                t = summarize(samples, "graph", "size")
                store.add_record(run, {
                    "case_key": f"case{i}", "backend": "foscar-int4", "batch": 1 + i, "kv_len": 4096,
                    "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "bits": 4, "k_mode": "channel",
                    "v_mode": "token", "group_size": 128, "page_size": 64, "gpu_name": "G", "status": "passed",
                    "median_us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us, "n_samples": t.n_samples,
                    "sm_clock_mhz_after": 1980.0,
                })


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_code_twice_gives_no_false_regressions(tmp_path, seed):
    db = tmp_path / "same.sqlite"
    _synthetic_store(db, 1.0, seed)
    cmp = compare(open_store(db), "BASE", "HEAD", min_change=0.02, fail_threshold=0.05)
    assert not cmp.changes["verdict"].isin(noise.CALLED).any()
    assert len(cmp.failures) == 0


def test_synthetic_5_percent_slowdown_is_called_in_every_series(tmp_path):
    db = tmp_path / "slow.sqlite"
    _synthetic_store(db, 1.05, 3)
    cmp = compare(open_store(db), "BASE", "HEAD", min_change=0.02, fail_threshold=0.03)
    assert set(cmp.changes["verdict"]) == {noise.SLOWER}
    assert len(cmp.failures) == 120


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("5", 0.05), ("12.5%", 0.125), (None, None)])
def test_parse_fraction(text, value):
    assert parse_fraction(text) == (pytest.approx(value) if value is not None else None)


def test_parse_fraction_rejects_words():
    with pytest.raises(ValueError, match="not a number"):
        parse_fraction("five")


@pytest.mark.parametrize("text", ["1", "1.0", " 1 "])
def test_parse_fraction_refuses_a_bare_one(text):
    with pytest.raises(ValueError, match=r"is ambiguous \(1 % or 100 %\?\); write 1% or 0.01"):
        parse_fraction(text)
    assert parse_fraction("1%") == pytest.approx(0.01) and parse_fraction("0.01") == pytest.approx(0.01)


def test_series_missing_from_head_fail_the_gate(tmp_path):
    # An interrupted HEAD sweep: a case that passed in BASE is absent from HEAD. Gone series
    # whose BASE did not pass (nothing lost) leave the gate alone, as does HEAD's new series.
    from reports_fixture import _record

    db = tmp_path / "g.sqlite"
    rng = random.Random(0)
    with ResultStore(db) as store:
        a = store.start_run(argv=[], config={}, env={}, run_id="A")
        b = store.start_run(argv=[], config={}, env={}, run_id="B")
        store.add_record(a, _record("foscar-int4", 8, 4096, 1.0, rng))
        store.add_record(a, _record("foscar-int4", 32, 4096, 1.0, rng))
        store.add_record(a, {**_record("foscar-int2", 8, 4096, 1.0, rng), "status": "unsupported"})
        store.add_record(b, _record("foscar-int4", 8, 4096, 1.0, rng))
        store.add_record(b, _record("foscar-int4", 128, 4096, 1.0, rng))
    cmp = compare(open_store(db), "A", "B", fail_threshold=0.05)
    verdicts = dict(zip(zip(cmp.changes["backend"], cmp.changes["batch"]), zip(cmp.changes["verdict"], cmp.changes["gate"])))
    assert verdicts[("foscar-int4", 32)] == ("gone", True)
    assert verdicts[("foscar-int2", 8)] == ("gone", False) and verdicts[("foscar-int4", 128)] == ("new", False)
    assert len(cmp.failures) == 1
    res = CliRunner().invoke(app, ["compare", "A", "B", "--db", str(db), "--fail-on-regression", "5%"])
    assert res.exit_code == 1 and "gone (fails gate)" in res.output, res.output
    assert len(compare(open_store(db), "A", "B").failures) == 0  # no gate asked: nothing fails


# --- BASE and HEAD on different physical GPUs (gpu_uuid) -----------------------------------
UUID_A = "GPU-f20d61eb-6190-c591-ff1d-57861e916803"
UUID_B = "GPU-e1f4468f-0000-1111-2222-333344445555"


def _two_gpu_store(path: Path, factor: float, base_uuid, head_uuid) -> None:
    """Runs BASE and HEAD of one INT4 series (batch 8 / KV 4K, median known to +-0.1%), HEAD
    x factor; each record names the GPU it ran on (None: an old record without gpu_uuid)."""
    with ResultStore(path) as store:
        for run, med, uuid in (("BASE", 26.6, base_uuid), ("HEAD", 26.6 * factor, head_uuid)):
            store.start_run(argv=[], config={}, env={}, run_id=run)
            store.add_record(run, {
                "case_key": "b8-kv4096", "backend": "foscar-int4", "batch": 8, "kv_len": 4096,
                "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "bits": 4, "k_mode": "channel",
                "v_mode": "token", "group_size": 128, "page_size": 64, "gpu_name": "NVIDIA H200",
                "gpu_uuid": uuid, "status": "passed", "median_us": med, "p10_us": med * 0.99,
                "p90_us": med * 1.01, "n_samples": 2000, "spread": 0.002, "sm_clock_mhz_after": 1980.0,
            })


@pytest.mark.parametrize("factor, base_uuid, head_uuid, verdict, why", [
    # one GPU: called on the 2% threshold, as before
    (1.025, UUID_A, UUID_A, noise.SLOWER, ""),
    (0.975, UUID_A, UUID_A, noise.FASTER, ""),
    # two GPUs: 2.5% is what H200s of one pool differ by; not called
    (1.025, UUID_A, UUID_B, noise.AMBIGUOUS, "different GPUs: GPU-f20d61eb vs GPU-e1f4468f"),
    (0.975, UUID_A, UUID_B, noise.AMBIGUOUS, "different GPUs: GPU-f20d61eb vs GPU-e1f4468f"),
    # two GPUs, beyond the cross-GPU threshold: called, the GPUs noted
    (1.07, UUID_A, UUID_B, noise.SLOWER, "different GPUs: GPU-f20d61eb vs GPU-e1f4468f"),
    (0.93, UUID_A, UUID_B, noise.FASTER, "different GPUs: GPU-f20d61eb vs GPU-e1f4468f"),
    # two GPUs, within the threshold: still the same
    (1.002, UUID_A, UUID_B, noise.SAME, ""),
    # either side without a uuid (old records, CPU): as before
    (1.025, None, UUID_B, noise.SLOWER, ""),
    (1.025, UUID_A, None, noise.SLOWER, ""),
    (1.025, None, None, noise.SLOWER, ""),
])
def test_compare_across_gpus(tmp_path, factor, base_uuid, head_uuid, verdict, why):
    db = tmp_path / "gpus.sqlite"
    _two_gpu_store(db, factor, base_uuid, head_uuid)
    cmp = compare(open_store(db), "BASE", "HEAD", min_change=0.02, fail_threshold=0.02)
    row = cmp.changes.iloc[0]
    assert len(cmp.changes) == 1
    assert (row["verdict"], row["why"]) == (verdict, why)
    assert row["change"] == pytest.approx(factor - 1)
    # the gate follows the same rule: a 2.5% slowdown between two GPUs fails no gate
    assert bool(row["gate"]) == (verdict == noise.SLOWER)
    assert cmp.cross_gpu.tolist() == [bool(base_uuid and head_uuid and base_uuid != head_uuid)]


def test_compare_across_gpus_threshold_is_a_parameter(tmp_path):
    db = tmp_path / "gpus.sqlite"
    _two_gpu_store(db, 1.07, UUID_A, UUID_B)
    assert compare(open_store(db), "BASE", "HEAD", gpu_threshold=0.10).changes["verdict"].tolist() == [noise.AMBIGUOUS]
    # a cross-GPU threshold at or below the plain one leaves the plain rule
    _two_gpu_store(tmp_path / "small.sqlite", 1.025, UUID_A, UUID_B)
    small = compare(open_store(tmp_path / "small.sqlite"), "BASE", "HEAD", min_change=0.02, gpu_threshold=0.01)
    assert small.changes["verdict"].tolist() == [noise.SLOWER]
    # a plain threshold above the cross-GPU one governs both
    assert compare(open_store(db), "BASE", "HEAD", min_change=0.08).changes["verdict"].tolist() == [noise.SAME]


def test_compare_cli_states_the_cross_gpu_rule(tmp_path):
    db = tmp_path / "gpus.sqlite"
    _two_gpu_store(db, 1.025, UUID_A, UUID_B)
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "BASE", "HEAD", "--db", str(db), "--fail-on-regression", "2%"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "1 series compared" in out and "1 ambiguous" in out
    assert "1 of them compared records from different GPUs (GPU-f20d61eb vs GPU-e1f4468f)" in out
    assert "called only beyond 5.0%" in out
    lower = runner.invoke(app, ["compare", "BASE", "HEAD", "--db", str(db), "--fail-on-regression", "2%",
                                "--cross-gpu-threshold", "2%"])
    assert lower.exit_code == 1 and "fails gate" in lower.output
    same = tmp_path / "same.sqlite"
    _two_gpu_store(same, 1.025, UUID_A, UUID_A)
    one = runner.invoke(app, ["compare", "BASE", "HEAD", "--db", str(same)])
    assert one.exit_code == 0 and "different GPUs" not in one.output and "1 slower" in one.output


def test_rule_across_gpus():
    base = Sample(100.0, spread=0.004, sm_clock_mhz=1980, gpu_uuid=UUID_A)
    other = dict(spread=0.004, gpu_uuid=UUID_B)
    j = judge(base, Sample(103.0, sm_clock_mhz=1980, **other), 0.02)
    assert j.verdict == noise.AMBIGUOUS and j.reason == "different GPUs: GPU-f20d61eb vs GPU-e1f4468f"
    assert classify(base, Sample(107.0, sm_clock_mhz=1980, **other), 0.02) == noise.SLOWER
    # both doubts are named
    j = judge(base, Sample(103.0, sm_clock_mhz=1755, **other), 0.02)
    assert j.verdict == noise.AMBIGUOUS and "different GPUs" in j.reason and "1980 vs 1755 MHz" in j.reason
    # beyond the cross-GPU threshold the clocks still decide
    assert judge(base, Sample(110.0, sm_clock_mhz=1755, **other), 0.02).reason == "SM clocks differ: 1980 vs 1755 MHz"
    # uuids alike in their first group are shown whole; empty / NaN uuids are unknown
    assert noise.short_uuids("GPU-fixture-0", "GPU-fixture-1") == ("GPU-fixture-0", "GPU-fixture-1")
    for unknown in (None, "", float("nan")):
        assert classify(Sample(100.0, spread=0.004, gpu_uuid=unknown), Sample(103.0, **other), 0.02) == noise.SLOWER


def test_dashboard_pairs_apply_the_cross_gpu_rule(tmp_path):
    # the dashboard judges commit to commit with series.pair, the same verdicts as compare
    from reports import series

    db = tmp_path / "gpus.sqlite"
    _two_gpu_store(db, 1.025, UUID_A, UUID_B)
    recs = open_store(db).records
    pairs = series.pair(recs[recs["run_id"] == "BASE"], recs[recs["run_id"] == "HEAD"], 0.02)
    assert pairs["verdict"].tolist() == [noise.AMBIGUOUS]
    assert pairs["why"].tolist() == ["different GPUs: GPU-f20d61eb vs GPU-e1f4468f"]


def test_a_samples_clock_is_the_median_read_under_load_where_the_record_has_it():
    from reports import series

    row = {"median_us": 100.0, "sm_clock_mhz_before": 1980.0, "sm_clock_mhz_after": 1980.0, "sm_clock_mhz_median": 1800.0}
    assert series.sample(row).sm_clock_mhz == 1800.0
    older = {"median_us": 100.0, "sm_clock_mhz_before": 1980.0, "sm_clock_mhz_after": 1890.0, "sm_clock_mhz_median": float("nan")}
    assert series.sample(older).sm_clock_mhz == 1890.0
