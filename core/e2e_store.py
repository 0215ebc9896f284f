"""The e2e benchmark's own tables in a results store (SQLite): `e2e_runs` and `e2e_records`.

They sit beside the sweep's `runs` and `records` in the same file but apart from them, so an e2e
run never becomes a sweep's "latest run" and the sweep's schema can change without them.
Reading opens the file read-only and never creates anything.
"""
from __future__ import annotations

import json
import os
import sqlite3
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from core.store import SQLiteFile, connect_readonly, git_state, record_identity

RUNS = "e2e_runs"
RECORDS = "e2e_records"

RUN_COLUMNS: dict[str, str] = {
    "run_id": "TEXT PRIMARY KEY",
    "started_at": "TEXT NOT NULL",
    "git_sha": "TEXT",
    "git_dirty": "INTEGER",
    "argv": "TEXT",
    "config_json": "TEXT",
    "env_json": "TEXT",
}

# Flat columns; any other key of a record goes to extra_json.
RECORD_COLUMNS: dict[str, str] = {
    "run_id": "TEXT NOT NULL",
    "created_at": "TEXT",
    "mode": "TEXT NOT NULL",  # grid | capacity | check
    "status": "TEXT NOT NULL",  # passed | incorrect | unsupported | does_not_fit | oom | error
    "reason": "TEXT",
    "model": "TEXT",
    "model_label": "TEXT",
    "num_layers": "INTEGER",
    "model_layers": "INTEGER",
    "backend": "TEXT NOT NULL",
    "family": "TEXT",
    "bits": "INTEGER",
    "kv_format": "TEXT",
    "batch": "INTEGER",
    "kv_len": "INTEGER",
    "num_q_heads": "INTEGER",
    "num_kv_heads": "INTEGER",
    "head_dim": "INTEGER",
    "hidden": "INTEGER",
    "group_size": "INTEGER",
    "page_size": "INTEGER",
    "gpu_name": "TEXT",
    "steps": "INTEGER",
    "n_steps": "INTEGER",
    "step_median_us": "REAL",
    "step_p10_us": "REAL",
    "step_p90_us": "REAL",
    "step_mean_us": "REAL",
    "flush_step_median_us": "REAL",
    "flush_period": "INTEGER",
    "noattn_step_median_us": "REAL",
    "attn_us": "REAL",
    "rest_us": "REAL",
    "attn_share": "REAL",
    "tokens_per_s": "REAL",
    "host_plan_median_us": "REAL",
    "kv_bytes": "INTEGER",
    "weight_bytes": "INTEGER",
    "budget_bytes": "INTEGER",
    "bytes_per_seq": "INTEGER",
    "capacity_batch": "INTEGER",
    "capacity_estimate": "INTEGER",
    "logits_rel_error": "REAL",
    "logits_tolerance": "REAL",
    "top1_agreement": "REAL",
    "timing_method": "TEXT",
    "wall_s": "REAL",
    "extra_json": "TEXT",
}
STATUSES = ("passed", "incorrect", "unsupported", "does_not_fit", "oom", "error")
MODES = ("grid", "capacity", "check")


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class E2EStore(SQLiteFile):
    """Writes e2e runs and records into a store file (created if absent); every write commits."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), timeout=60)
        cols = ", ".join(f"{k} {v}" for k, v in RUN_COLUMNS.items())
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {RUNS} ({cols})")
        cols = ", ".join(f"{k} {v}" for k, v in RECORD_COLUMNS.items())
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {RECORDS} (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})")
        have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({RECORDS})")}
        for name, typ in RECORD_COLUMNS.items():  # columns added later appear in old files too
            if name not in have:
                self.conn.execute(f"ALTER TABLE {RECORDS} ADD COLUMN {name} {typ.replace(' NOT NULL', '')}")
        self.conn.commit()

    def start_run(self, *, argv: Iterable[str], config: dict, env: dict) -> str:

        run_id = "e2e-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        sha, dirty = git_state()
        self.conn.execute(
            f"INSERT INTO {RUNS} (run_id, started_at, git_sha, git_dirty, argv, config_json, env_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, _utc_now(), sha, None if dirty is None else int(dirty), json.dumps(list(argv)),
             json.dumps(config, sort_keys=True, default=str), json.dumps(env, default=str)))
        self.conn.commit()
        return run_id

    def add(self, run_id: str, record: dict[str, Any]) -> None:
        rec = {k: (v.item() if hasattr(v, "item") and callable(v.item) else v) for k, v in record.items()}
        if rec.get("status") not in STATUSES:
            raise ValueError(f"e2e record status {rec.get('status')!r} is not one of {STATUSES}.")
        if rec.get("mode") not in MODES:
            raise ValueError(f"e2e record mode {rec.get('mode')!r} is not one of {MODES}.")
        rec["run_id"] = run_id
        rec.setdefault("created_at", _utc_now())
        row = {k: (int(v) if isinstance(v, bool) else v) for k, v in rec.items() if k in RECORD_COLUMNS}
        extra = {k: v for k, v in rec.items() if k not in RECORD_COLUMNS}
        if extra:
            row["extra_json"] = json.dumps(extra, default=str)
        names = ", ".join(row)
        self.conn.execute(f"INSERT INTO {RECORDS} ({names}) VALUES ({', '.join('?' for _ in row)})",
                          tuple(row.values()))
        self.conn.commit()

    def merge_from(self, other: str | os.PathLike) -> tuple[int, int]:
        """Copy the e2e runs another store holds and this one lacks, and every record of its runs
        that this one lacks: a record is here already only if every field but the store-local id
        matches (core.store.record_identity, as the sweep's records merge), so a complete store
        merged after a partial copy of the same run adds what the copy missed. Returns (runs,
        records) added; running it twice adds nothing the second time."""
        theirs = read_tables(other)
        have = {r[0] for r in self.conn.execute(f"SELECT run_id FROM {RUNS}")}
        runs = theirs.runs[~theirs.runs["run_id"].isin(have)] if not theirs.runs.empty else theirs.runs
        for run in runs.to_dict(orient="records"):
            cols = [c for c in RUN_COLUMNS if c in run]
            self.conn.execute(f"INSERT INTO {RUNS} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                              tuple(_plain(run[c]) for c in cols))
        names = list(RECORD_COLUMNS)
        present = {record_identity(_stored(dict(zip(names, r))))
                   for r in self.conn.execute(f"SELECT {', '.join(names)} FROM {RECORDS}")}
        recs = theirs.records[theirs.records["run_id"].isin(set(theirs.runs["run_id"]))]
        n_records = 0
        for rec in recs.to_dict(orient="records"):
            row = _stored({c: rec[c] for c in RECORD_COLUMNS if c in rec})
            ident = record_identity(row)
            if ident in present:
                continue
            cols = [c for c in row if row[c] is not None]
            self.conn.execute(f"INSERT INTO {RECORDS} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                              tuple(row[c] for c in cols))
            present.add(ident)
            n_records += 1
        self.conn.commit()
        return len(runs), n_records


def _plain(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") and callable(value.item) else value


def _stored(rec: dict[str, Any]) -> dict[str, Any]:
    """A record's columns as SQLite keeps them: NaN as NULL, and a whole number that pandas
    read as a float (an INTEGER column with NULLs in it) as the integer it is."""
    out = {}
    for name, value in rec.items():
        value = _plain(value)
        if isinstance(value, float) and value.is_integer() and RECORD_COLUMNS[name].startswith("INTEGER"):
            value = int(value)
        out[name] = value
    return out


class E2ETables:
    """What a store holds of the e2e benchmark: runs and records (records joined with the run's
    started_at and git_sha, extra_json left as text)."""

    def __init__(self, runs: pd.DataFrame, records: pd.DataFrame):
        self.runs, self.records = runs, records

    @property
    def empty(self) -> bool:
        return self.records.empty


def read_tables(path: str | os.PathLike, immutable: bool = False) -> E2ETables:
    """The e2e tables of a store, read-only and leaving the folder as it found it (core.store's
    read-only connection); empty frames when the file or the tables are absent. immutable=True
    for a tracked file such as the bundled store."""

    empty = E2ETables(pd.DataFrame(columns=list(RUN_COLUMNS)), pd.DataFrame(columns=["id", *RECORD_COLUMNS]))
    path = Path(path)
    if not path.is_file():
        return empty
    try:
        conn = connect_readonly(path, immutable)
    except sqlite3.Error:
        return empty
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if RUNS not in tables or RECORDS not in tables:
            return empty
        runs = pd.read_sql_query(f"SELECT * FROM {RUNS} ORDER BY started_at", conn)
        records = pd.read_sql_query(
            f"SELECT r.*, u.started_at, u.git_sha FROM {RECORDS} r LEFT JOIN {RUNS} u ON r.run_id = u.run_id "
            "ORDER BY r.id", conn)
    except sqlite3.DatabaseError:
        return empty
    finally:
        conn.close()
    return E2ETables(runs, records)
