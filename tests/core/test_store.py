"""The results store: schema version, round trip, extra fields, updates, resume keys; the typed
record its columns come from; older files read without a write."""
import json
import sqlite3

import pytest

from core.record import STATUSES
from core.store import RECORD_COLUMNS, SCHEMA_VERSION, ResultStore, StoreError, config_hash


def _rec(**kw):
    base = dict(case_key="b1-kv1024", backend="test-stub", status="passed", batch=1, kv_len=1024,
                median_us=12.5, bytes=1000, gpu_name="NVIDIA H200")
    base.update(kw)
    return base


def test_round_trip(tmp_path):
    db = tmp_path / "r.sqlite"
    store = ResultStore(db)
    run = store.start_run(argv=["foscar-bench", "sweep"], config={"a": 1}, env={"gpus": []})
    store.add_record(run, _rec(throttled=False, checked_seqs=[0, 1], note="hello"))
    store.close()

    store = ResultStore(db)  # reopen: everything was committed
    assert store.schema_version == SCHEMA_VERSION
    df = store.records(run)
    assert len(df) == 1
    row = df.iloc[0]
    assert row.median_us == 12.5 and row.status == "passed" and row.throttled == 0
    assert json.loads(row.checked_seqs) == [0, 1]  # a record column, kept as JSON
    assert json.loads(row.extra_json) == {"note": "hello"}  # not a record field
    assert {"started_at", "git_sha", "git_dirty"} <= set(df.columns)
    info = store.run_info(run)
    assert info["config"] == {"a": 1} and info["argv"] == ["foscar-bench", "sweep"]
    assert info["config_hash"] == config_hash({"a": 1})
    runs = store.runs()
    assert runs.iloc[0].n_records == 1 and runs.iloc[0].n_passed == 1


def test_meta_table_holds_the_version(tmp_path):
    db = tmp_path / "v.sqlite"
    ResultStore(db).close()
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    con.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer"):
        ResultStore(db)
    with pytest.raises(StoreError, match="newer"):
        ResultStore(db, readonly=True)


def test_status_enum_enforced(tmp_path):
    store = ResultStore(tmp_path / "s.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    with pytest.raises(ValueError, match="status"):
        store.add_record(run, _rec(status="fine"))
    with pytest.raises(ValueError, match="backend"):
        store.add_record(run, _rec(backend=""))


def test_update_record_for_alu_figures(tmp_path):
    store = ResultStore(tmp_path / "u.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    store.add_record(run, _rec())
    n = store.update_record(run, "b1-kv1024", "test-stub", alu_per_elem=0.62,
                            pipe_mix_json={"alu": 0.7}, sass_path="x.sass")
    assert n == 1
    row = store.records(run).iloc[0]
    assert row.alu_per_elem == pytest.approx(0.62)
    assert json.loads(row.pipe_mix_json) == {"alu": 0.7}
    assert json.loads(row.extra_json)["sass_path"] == "x.sass"
    assert store.update_record(run, "nope", "test-stub", alu_per_elem=1.0) == 0


def test_resume_keys_and_existing_run(tmp_path):
    store = ResultStore(tmp_path / "k.sqlite")
    run = store.start_run(argv=[], config={}, env={}, run_id="myrun")
    assert run == "myrun"
    store.add_record(run, _rec(case_key="c1", backend="a"))
    store.add_record(run, _rec(case_key="c2", backend="b", status="crashed"))
    assert store.finished_keys(run) == {"c1|a", "c2|b"}
    # starting the same run id again (resume) keeps it and its records
    assert store.start_run(argv=[], config={}, env={}, run_id="myrun") == "myrun"
    assert len(store.records("myrun")) == 2
    assert store.latest_run() == "myrun"
    store.update_run_env("myrun", {"workers": {"0": {"gpu_name": "X"}}})
    assert store.run_info("myrun")["env"]["workers"]["0"]["gpu_name"] == "X"


def test_resume_keys_leave_out_items_never_attempted(tmp_path):
    from core.store import NOT_ATTEMPTED

    store = ResultStore(tmp_path / "n.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    store.add_record(run, _rec(case_key="c1", backend="a", status="crashed"))  # ran and crashed: finished
    store.add_record(run, _rec(case_key="c2", backend="a", status="crashed", **{NOT_ATTEMPTED: True}))
    store.add_record(run, _rec(case_key="c3", backend="a", status="crashed", **{NOT_ATTEMPTED: True}))
    store.add_record(run, _rec(case_key="c3", backend="a"))  # c3 ran on a later resume
    assert store.finished_keys(run) == {"c1|a", "c3|a"}


def test_records_of_all_runs(tmp_path):
    store = ResultStore(tmp_path / "a.sqlite")
    r1 = store.start_run(argv=[], config={}, env={})
    r2 = store.start_run(argv=[], config={}, env={})
    store.add_record(r1, _rec())
    store.add_record(r2, _rec())
    assert len(store.records()) == 2 and set(store.records().run_id) == {r1, r2}


def test_git_state_from_environment_for_a_tree_without_git(monkeypatch):
    from core.store import git_state

    monkeypatch.setenv("FOSCAR_GIT_SHA", "abc1234")
    monkeypatch.setenv("FOSCAR_GIT_DIRTY", "1")
    assert git_state() == ("abc1234", True)
    monkeypatch.setenv("FOSCAR_GIT_DIRTY", "0")
    assert git_state() == ("abc1234", False)


# --- the typed record and its columns --------------------------------------------------------
def test_columns_come_from_the_record():
    from dataclasses import fields, is_dataclass

    from core.case import Case
    from core.record import COLUMNS, Record

    rec = Record(case=Case(batch=2, kv_len=256), backend="x", status="passed")
    assert set(rec.flat()) | {"extra_json"} == set(COLUMNS)
    for part in fields(rec):  # every field of every part is a column: one line adds one
        value = getattr(rec, part.name)
        if is_dataclass(value):
            assert {f.name for f in fields(value)} <= set(COLUMNS), part.name
    assert "case_key" in COLUMNS and "run_id" in RECORD_COLUMNS


def test_a_typed_record_round_trips(tmp_path):
    from core.case import Case
    from core.record import CheckFields, GpuFields, Record, TimingFields, TrafficFields

    rec = Record(case=Case(batch=2, kv_len=256, bits=2), backend="foscar-int2", family="foscar", status="passed",
                 gpu=GpuFields(gpu_index=0, gpu_name="NVIDIA H200", bus_peak_tbps=4.8),
                 traffic=TrafficFields(bytes=4_800_000, flops=10, traffic={"q": 1}),
                 check=CheckFields(tolerance=4e-3, rel_error=1e-3, checked_seqs=[0, 1]),
                 timing=TimingFields(median_us=2.0, p10_us=1.9, p90_us=2.1, throttled=False),
                 extra={"note": "planted"})
    rec.derive()
    assert rec.timing.eff_bandwidth_tbps == pytest.approx(2.4) and rec.timing.frac_peak_bus == pytest.approx(0.5)
    store = ResultStore(tmp_path / "t.sqlite")
    run = store.start_run(argv=[], config={}, env={})
    store.add_record(run, rec)
    row = store.records(run).iloc[0]
    assert row.case_key == rec.case.key and row.shape_key == rec.case.shape_key and row.seed == 0
    assert row.bits == 2 and row.tolerance == 4e-3 and row.frac_peak_bus == pytest.approx(0.5)
    assert json.loads(row.traffic) == {"q": 1} and row.throttled == 0
    assert json.loads(row.extra_json) == {"note": "planted"}


# Version 1's record columns as the first stores (and reports/data/bundled.sqlite) have
# them: a later reader must read such a file without changing it.
V1_COLUMNS = (
    "run_id TEXT NOT NULL, case_key TEXT NOT NULL, backend TEXT NOT NULL, family TEXT, bits INTEGER, "
    "batch INTEGER, kv_len INTEGER, num_q_heads INTEGER, num_kv_heads INTEGER, head_dim INTEGER, "
    "k_mode TEXT, v_mode TEXT, group_size INTEGER, page_size INTEGER, model TEXT, gpu_index INTEGER, "
    "gpu_name TEXT, gpu_uuid TEXT, status TEXT NOT NULL, reason TEXT, median_us REAL, p10_us REAL, "
    "p90_us REAL, n_samples INTEGER, l2_policy TEXT, bytes INTEGER, flops INTEGER, "
    "eff_bandwidth_tbps REAL, frac_peak_bus REAL, frac_peak_datasheet REAL, frac_read_ceiling REAL, "
    "rel_error REAL, quant_rel_error REAL, sm_clock_mhz_before REAL, sm_clock_mhz_after REAL, "
    "throttled INTEGER, throttle_reasons TEXT, alu_per_elem REAL, inst_per_elem REAL, pipe_mix_json TEXT, "
    "dram_bytes_read REAL, dram_model_ratio REAL, alu_static_per_elem REAL, created_at TEXT, extra_json TEXT"
)


def _v1_store(path):
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, started_at TEXT NOT NULL, git_sha TEXT, "
                "git_dirty INTEGER, argv TEXT, config_json TEXT, config_hash TEXT, env_json TEXT)")
    con.execute(f"CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, {V1_COLUMNS})")
    con.execute("INSERT INTO runs (run_id, started_at) VALUES ('old', '2026-01-01T00:00:00+00:00')")
    extra = {"seed": 0, "tolerance": 0.004, "timing_method": "graph", "traffic": {"q": 8}, "checked_seqs": [0],
             "shape_key": "b1-kv1024-h32x8-d128", "wall_s": 1.5, "bus_peak_tbps": 4.81, "note": "kept"}
    con.execute("INSERT INTO records (run_id, case_key, backend, status, batch, kv_len, median_us, extra_json) "
                "VALUES ('old', 'b1-kv1024', 'foscar-int4', 'passed', 1, 1024, 9.5, ?)", (json.dumps(extra),))
    con.commit()
    con.close()


def test_an_older_file_is_migrated_on_read_without_a_write(tmp_path):
    import hashlib

    db = tmp_path / "v1.sqlite"
    _v1_store(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with ResultStore(db, readonly=True) as store:
        row = store.records().iloc[0]
    assert row.median_us == 9.5 and row.tolerance == 0.004 and row.timing_method == "graph"
    assert row.seed == 0 and row.shape_key == "b1-kv1024-h32x8-d128" and row.wall_s == 1.5
    assert json.loads(row.traffic) == {"q": 8} and row.bus_peak_tbps == 4.81
    assert row.alu_status is None  # a column the file lacks is there, empty
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    # a writer adds the record's newer columns and keeps the old rows
    with ResultStore(db) as store:
        store.add_record("old", {"case_key": "c2", "backend": "b", "status": "crashed", "alu_status": "ok"})
        assert len(store.records("old")) == 2


def test_the_bundled_store_reads_unchanged(tmp_path):
    import hashlib
    import shutil
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "reports" / "data" / "bundled.sqlite"
    copy = tmp_path / "bundled.sqlite"
    shutil.copyfile(shipped, copy)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    for immutable in (True, False):
        with ResultStore(copy, readonly=True, immutable=immutable) as store:
            df = store.records()
            assert len(df) > 10 and set(df.status) <= set(STATUSES)  # e.g. BitDecoding INT2 is `inaccurate`
            assert store.runs()["n_records"].sum() == len(df)
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before


def test_reading_a_file_that_is_not_a_store_is_one_error(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    for readonly in (True, False):
        with pytest.raises(StoreError, match="is not a results store"):
            ResultStore(text, readonly=readonly)
    with pytest.raises(StoreError, match="does not exist"):
        ResultStore(tmp_path / "missing.sqlite", readonly=True)
    assert not (tmp_path / "missing.sqlite").exists()
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (a)").connection.commit()
    with pytest.raises(StoreError, match="not a results store"):
        ResultStore(other, readonly=True)
