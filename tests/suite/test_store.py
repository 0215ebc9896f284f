"""The results store: schema version, round trip, extra fields, updates, resume keys."""
import json
import sqlite3

import pytest

from core.store import SCHEMA_VERSION, ResultStore, config_hash


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
    assert json.loads(row.extra_json) == {"checked_seqs": [0, 1], "note": "hello"}
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
    with pytest.raises(RuntimeError, match="newer"):
        ResultStore(db)


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
