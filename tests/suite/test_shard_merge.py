"""Sweeps across machines, on the CPU with stand-in backends: `sweep --shard I/N` splits the
expanded grid deterministically, and `results merge` joins the shards' stores into one
with nothing lost, nothing doubled, and nothing changed by merging again."""
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import harness_doubles
import pytest
from typer.testing import CliRunner

from baselines.base import select_backends
from core.store import MergeError, ResultStore, merge_stores
from suite.cases import expand, make_spec
from suite.cli import app
from suite.sweep import parse_shard, plan_items, shard_items

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = ["test-stub", "test-wrong", "test-unsupported"]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _doubles():
    with harness_doubles.registered():
        yield


def _keys(items) -> list[str]:
    return [it.key for it in items]


def _grid(backends=STAND_INS + ["torch-ref"], batch=(1, 2, 8), kv=(128, 256), bits=(4, 2)):
    spec = make_spec(None, batch=list(batch), kv_len=list(kv), bits=list(bits), num_q_heads=4,
                     num_kv_heads=2, head_dim=64)
    return plan_items(expand(spec), select_backends(backends))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_shards_are_exactly_the_grid(n):
    items = _grid()
    shards = [shard_items(items, i, n) for i in range(n)]
    every = [k for s in shards for k in _keys(s)]
    assert sorted(every) == sorted(_keys(items))  # all of it, none twice
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_shards_ignore_the_order_of_backends_and_axes():
    a = _grid()
    b = _grid(backends=["torch-ref"] + STAND_INS[::-1], batch=(8, 1, 2), kv=(256, 128), bits=(2, 4))
    for i in range(3):
        assert sorted(_keys(shard_items(a, i, 3))) == sorted(_keys(shard_items(b, i, 3)))


def test_shards_are_the_same_on_another_host():
    """Another process with another string-hash seed computes the same split."""
    keys = _keys(_grid())
    code = ("import json, sys; from suite.sweep import shard_keys; keys = json.load(sys.stdin);"
            "print(json.dumps([sorted(shard_keys(keys, i, 4)) for i in range(4)]))")
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, input=json.dumps(keys[::-1]),
                         capture_output=True, text=True, check=True)
    here = [sorted(_keys(shard_items(_grid(), i, 4))) for i in range(4)]
    assert json.loads(out.stdout) == here


@pytest.mark.parametrize("text", ["3", "a/b", "4/4", "-1/3", "1/0"])
def test_bad_shard_is_one_sentence(text):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)


# --- merge --------------------------------------------------------------------------------
def _rec(case, backend, **kw):
    return {"case_key": case, "backend": backend, "status": "passed", "median_us": 1.0,
            "created_at": "2026-12-02T00:00:00+00:00", **kw}


def _store(path, run_id, records, sha="abc123", shard=None, host="h"):
    from unittest import mock

    from core import store as store_mod

    with mock.patch.object(store_mod, "git_state", return_value=(sha, False)), ResultStore(path) as s:
        config = {"spec": {"batch": [1]}, "backends": ["test-stub"], **({"shard": shard} if shard else {})}
        s.start_run(argv=["foscar-bench", "sweep"], config=config, env={"host": host}, run_id=run_id)
        for r in records:
            s.add_record(run_id, r)
    return path


def _dump(path) -> list:
    con = sqlite3.connect(path)
    rows = [tuple(r[1:]) for r in con.execute("SELECT * FROM records ORDER BY id")]
    runs = con.execute("SELECT * FROM runs ORDER BY run_id").fetchall()
    con.close()
    return [rows, runs]


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_merge_keeps_everything_once_and_is_idempotent(tmp_path):
    a = _store(tmp_path / "a.sqlite", "R", [_rec("c1", "test-stub"), _rec("c2", "test-stub")], shard="0/2", host="a")
    b = _store(tmp_path / "b.sqlite", "R", [_rec("c3", "test-stub"), _rec("c1", "test-stub")], shard="1/2", host="b")
    c = _store(tmp_path / "c.sqlite", "other", [_rec("c1", "test-stub", median_us=2.0)])
    before = [_sha(p) for p in (a, b, c)]
    out = tmp_path / "out.sqlite"
    counts = merge_stores(out, [a, b, c])
    # c1 of run R is in both shards, identical: kept once; run `other`'s c1 differs: kept
    assert (counts.records_added, counts.records_present) == (4, 1)
    assert (counts.runs_added, counts.runs_combined) == (2, 1)
    assert [_sha(p) for p in (a, b, c)] == before  # inputs are only read
    with ResultStore(out) as s:
        recs = s.records()
        assert sorted(zip(recs.run_id, recs.case_key)) == [("R", "c1"), ("R", "c2"), ("R", "c3"), ("other", "c1")]
        info = s.run_info("R")
    assert info["config"]["shards"] == ["0/2", "1/2"] and "shard" not in info["config"]
    assert sorted(p["host"] for p in info["env"]["merged_parts"]) == ["a", "b"]
    once = _dump(out)
    again = merge_stores(out, [a, b, c])
    assert (again.records_added, again.runs_added, again.runs_combined) == (0, 0, 0)
    assert _dump(out) == once
    other_order = tmp_path / "out2.sqlite"
    merge_stores(other_order, [c, b, a])
    rows = lambda p: sorted(map(str, _dump(p)[0]))  # noqa: E731 - ids differ with order, content not
    assert rows(other_order) == rows(out)
    assert merge_stores(out, [out]).records_added == 0  # a store merged into itself


def test_merge_refuses_one_run_at_two_commits(tmp_path):
    a = _store(tmp_path / "a.sqlite", "R", [_rec("c1", "test-stub")], sha="aaaa")
    b = _store(tmp_path / "b.sqlite", "R", [_rec("c2", "test-stub")], sha="bbbb", host="b")
    with pytest.raises(MergeError, match="commit"):
        merge_stores(tmp_path / "out.sqlite", [a, b])
    res = runner.invoke(app, ["results", "merge", str(tmp_path / "o2.sqlite"), str(a), str(b)])
    assert res.exit_code == 2 and "one commit" in res.output
    missing = runner.invoke(app, ["results", "merge", str(tmp_path / "o3.sqlite"), str(tmp_path / "nope.sqlite")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_sharded_sweep_then_merge_is_the_full_grid(tmp_path):
    """Two shards swept as two hosts would (separate stores, one run id), then merged."""
    small = ["--batch", "1,2", "--kv-len", "128", "--num-q-heads", "4", "--num-kv-heads", "2", "--head-dim", "64",
             "--backends", ",".join(STAND_INS)]
    stores = []
    for i in range(2):
        db = tmp_path / f"shard-{i}.sqlite"
        res = runner.invoke(app, ["sweep", "--cpu", "--no-progress", "--shard", f"{i}/2",
                                  "--run-id", "grid-1", "--db", str(db), *small])
        assert res.exit_code == 0, res.output
        stores.append(db)
    full = runner.invoke(app, ["sweep", "--dry-run", "--db", str(tmp_path / "none.sqlite"), *small])
    n_items = int(full.output.split(" items")[0].split()[-1])
    out = tmp_path / "all.sqlite"
    res = runner.invoke(app, ["results", "merge", str(out), *map(str, stores)])
    assert res.exit_code == 0 and f"{n_items} record(s) added" in res.output, res.output
    rows = [json.loads(line) for line in runner.invoke(app, ["results", "--db", str(out), "--json"]).output.splitlines()]
    assert len(rows) == n_items == len({(r["case_key"], r["backend"]) for r in rows})
    assert {r["run_id"] for r in rows} == {"grid-1"}
    again = runner.invoke(app, ["results", "merge", str(out), *map(str, stores)])
    assert "0 record(s) added" in again.output
    # the same run id with other settings is refused, not mixed in
    clash = runner.invoke(app, ["sweep", "--cpu", "--no-progress", "--shard", "0/3",
                                "--run-id", "grid-1", "--db", str(stores[0]), *small])
    assert clash.exit_code == 2 and "shard" in clash.output


def test_merge_carries_e2e_runs_and_names_a_store_with_neither(tmp_path):
    """An e2e-only store (what `foscar-bench e2e --db` writes) merges into a sweep store; its
    runs arrive once. A file holding neither kind of table is refused in one sentence."""
    from core.e2e_store import E2EStore, read_tables

    e2e = tmp_path / "e2e.sqlite"
    with E2EStore(e2e) as store:
        run = store.start_run(argv=["e2e"], config={}, env={})
        store.add(run, {"mode": "grid", "status": "passed", "backend": "foscar-int2", "batch": 1,
                        "kv_len": 4096, "tokens_per_s": 5.0})
    sweep = _store(tmp_path / "a.sqlite", "R", [_rec("c1", "test-stub")])
    out = tmp_path / "out.sqlite"
    res = runner.invoke(app, ["results", "merge", str(out), str(sweep), str(e2e)])
    assert res.exit_code == 0, res.output
    assert "1 e2e run(s) with 1 record(s) added" in res.output
    again = merge_stores(out, [sweep, e2e])
    assert (again.records_added, again.e2e_runs_added) == (0, 0)
    assert list(read_tables(out).records.tokens_per_s) == [5.0]
    with ResultStore(out) as s:
        assert list(s.records().case_key) == ["c1"]
    plain = tmp_path / "plain.sqlite"
    con = sqlite3.connect(plain)
    con.execute("CREATE TABLE t (x)")
    con.close()
    res = runner.invoke(app, ["results", "merge", str(tmp_path / "o.sqlite"), str(plain)])
    assert res.exit_code == 2 and "neither sweep results" in res.output
