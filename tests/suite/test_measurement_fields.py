"""What every record now says about its measurement, on the CPU with stand-ins: a third
party's failed check is `inaccurate` and timed while ours stays `incorrect` and untimed; the
timing's spread and the L2 verdict are recorded; the reproducer re-runs that one case; a
slow kernel build happens before the case's timer and is recorded apart."""
import shlex

import harness_doubles
import pytest
from typer.testing import CliRunner

from core.case import Case
from core.store import ResultStore
from suite.cli import app
from suite.sweep import Item, SweepOptions, run_sweep

CASE = Case(batch=2, kv_len=128, num_q_heads=4, num_kv_heads=2, head_dim=64)
runner = CliRunner()


def _sweep(tmp_path, backends, **opts):
    store = ResultStore(tmp_path / "m.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    items = [Item(i, b.case_for(CASE), b) for i, b in enumerate(backends)]
    options = SweepOptions(devices=["cpu"], read_ceiling=False, log_dir=str(tmp_path / "logs"), **opts)
    run_sweep(store=store, run_id=run, items=items, options=options, progress=False)
    return store, store.records(run).set_index("backend")


def test_inaccurate_baselines_are_timed_and_ours_are_not(tmp_path):
    d = harness_doubles
    _, df = _sweep(tmp_path, [d.StubBackend(), d.WrongBackend(), d.WrongBaselineBackend()])
    assert df.loc["test-stub", "status"] == "passed"
    ours = df.loc["test-wrong"]
    assert ours["status"] == "incorrect" and ours["median_us"] != ours["median_us"]  # untimed (NaN)
    third = df.loc["test-wrong-baseline"]
    assert third["status"] == "inaccurate" and third["median_us"] > 0 and third["eff_bandwidth_tbps"] > 0
    assert "exceeds" in third["reason"] and third["rel_error"] > 0.05
    for name in ("test-stub", "test-wrong-baseline"):
        r = df.loc[name]
        assert 0 <= r["spread"] < 1 and r["ci_low_us"] <= r["median_us"] <= r["ci_high_us"]
        assert r["stop_reason"] in ("converged", "max_time", "max_samples") and r["l2_verdict"] == "n/a (cpu)"
    assert all(df["reproducer"].str.startswith("foscar-bench sweep --backends "))


def test_the_reproducer_re_runs_that_one_case(tmp_path):
    with harness_doubles.registered():
        _, df = _sweep(tmp_path, [harness_doubles.StubBackend()])
        original = df.loc["test-stub"]
        words = shlex.split(original["reproducer"])
        assert words[:2] == ["foscar-bench", "sweep"] and "--cpu" in words
        db = tmp_path / "again.sqlite"
        args = words[1:words.index("--db")] + ["--db", str(db), "--no-progress"]
        listed = runner.invoke(app, args + ["--dry-run"])
        assert listed.exit_code == 0 and "1 items (1 cases)" in listed.output, listed.output
        again = runner.invoke(app, args)
        assert again.exit_code == 0, again.output
    with ResultStore(db, readonly=True) as s:
        rerun = s.records()
    assert len(rerun) == 1 and rerun.iloc[0]["case_key"] == original["case_key"]
    assert rerun.iloc[0]["backend"] == "test-stub" and rerun.iloc[0]["reproducer"] == original["reproducer"]


def test_a_slow_build_is_not_a_hang(tmp_path):
    slow = harness_doubles.SlowBuildBackend()
    slow.build_s = 2.0
    _, df = _sweep(tmp_path, [slow], case_timeout_s=1.5, build_timeout_s=60.0)
    r = df.loc["test-slow-build"]
    assert r["status"] == "passed", r["reason"]
    assert r["build_s"] >= 2.0 and r["wall_s"] < 1.5  # the build is recorded apart from the case


def test_a_build_past_its_own_timeout_is_recorded_as_such(tmp_path):
    slow = harness_doubles.SlowBuildBackend()
    slow.build_s = 30.0
    _, df = _sweep(tmp_path, [slow], case_timeout_s=60.0, build_timeout_s=1.0)
    r = df.loc["test-slow-build"]
    assert r["status"] == "timeout" and "building" in r["reason"]


def test_compare_treats_inaccurate_as_timed(tmp_path):
    from reports import noise
    from reports.compare import compare
    from reports.source import open_store

    db = tmp_path / "c.sqlite"
    base = {"case_key": "c", "backend": "bitdecoding-int2", "batch": 1, "kv_len": 1024, "num_q_heads": 32,
            "num_kv_heads": 8, "head_dim": 128, "bits": 2, "k_mode": "channel", "v_mode": "token",
            "group_size": 128, "page_size": 128, "gpu_name": "G", "median_us": 100.0, "p10_us": 99.0,
            "p90_us": 101.0, "n_samples": 200}
    with ResultStore(db) as s:
        for run, status, med in (("A", "inaccurate", 100.0), ("B", "inaccurate", 120.0), ("C", "passed", 100.0)):
            s.start_run(argv=[], config={}, env={}, run_id=run)
            s.add_record(run, {**base, "status": status, "median_us": med, "p10_us": med * 0.99, "p90_us": med * 1.01})
    results = open_store(db)
    assert compare(results, "A", "B", fail_threshold=0.05).changes["verdict"].tolist() == [noise.SLOWER]
    lost = compare(results, "C", "A", fail_threshold=0.05)
    assert lost.changes["verdict"].tolist() == ["now inaccurate"] and len(lost.failures) == 1


def _reading(mhz, reasons=(), power=400.0):
    return {"sm_clock_mhz": mhz, "power_w": power, "throttle_mask": 4 if reasons else 0, "throttle_reasons": list(reasons)}


def test_a_slowdown_in_the_middle_of_the_timed_batches_is_recorded():
    """The clocks are read in every timed batch: a power cap that came and went is flagged with
    how much of the run it touched and how low the clock went, though the last reading is clean."""
    from suite.envinfo import load_clocks

    batches = [_reading(1980), _reading(1890, ["SwPowerCap"], 690.0), _reading(1755, ["SwPowerCap"]), _reading(1980)]
    load = load_clocks(_reading(1980), batches)
    assert load["throttle_reasons"] == ["SwPowerCap"] and load["throttled_frac"] == 0.5
    assert load["sm_clock_mhz_min"] == 1755 and load["sm_clock_mhz_median"] == 1935 and load["power_w_max"] == 690.0
    clean = load_clocks(_reading(1980), [_reading(1980), _reading(1965)])
    assert clean["throttle_reasons"] == [] and clean["throttled_frac"] == 0.0
    blind = load_clocks({}, [{"sm_clock_mhz": None, "throttle_mask": None}])  # no NVML readings
    assert blind["sm_clock_mhz_min"] is None and blind["throttled_frac"] is None


def test_the_sweeps_note_says_how_much_of_a_run_was_throttled():
    from types import SimpleNamespace

    from suite.summary import throttle_note

    r = SimpleNamespace(throttle_reasons="SwPowerCap", throttled_frac=0.4, sm_clock_mhz_min=1755.0,
                        sm_clock_mhz_before=1980.0)
    assert throttle_note(r) == "SwPowerCap in 40% of the timed batches, SM clock 1755-1980 MHz"
    old = SimpleNamespace(throttle_reasons="SwPowerCap")  # a record made before the batches were read
    assert throttle_note(old) == "SwPowerCap"


def test_a_clock_dip_with_no_reason_is_noted_apart_from_a_slowdown():
    """A paper-stage record of the eleventh session: every batch unflagged, one at 1830 MHz where
    the median was 1980. The sweep's table marks it '~' with the range; within 3 % it says
    nothing, and a throttled record keeps its own note."""
    import pandas as pd
    from rich.console import Console
    from types import SimpleNamespace

    from suite.summary import clock_dip_note, summary_table

    dip = dict(throttled=0, sm_clock_mhz_min=1830.0, sm_clock_mhz_median=1980.0)
    assert clock_dip_note(SimpleNamespace(**dip)) == "SM clock 1830-1980 MHz under load, no slowdown reason reported"
    assert clock_dip_note(SimpleNamespace(throttled=0, sm_clock_mhz_min=1965.0, sm_clock_mhz_median=1980.0)) is None
    assert clock_dip_note(SimpleNamespace(**{**dip, "throttled": 1})) is None
    assert clock_dip_note(SimpleNamespace(throttled=0)) is None  # a record made before the clocks were read
    row = dict(id=1, run_id="r", case_key="c", backend="foscar-int4", batch=128, kv_len=32768, num_q_heads=32, num_kv_heads=8, head_dim=128,
               bits=4, k_mode="channel", v_mode="token", group_size=128, status="passed", reason=None,
               median_us=1061.1, eff_bandwidth_tbps=4.30, frac_peak_bus=0.894, rel_error=1.7e-3, started_at="t", **dip)
    console = Console(width=160, record=True)
    console.print(summary_table(pd.DataFrame([row])))
    text = console.export_text()
    assert "passed~" in text and "~ foscar-int4" in text and "1830-1980 MHz under load" in text
