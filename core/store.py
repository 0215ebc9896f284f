"""The results store: one SQLite file (stdlib sqlite3) of runs and records, with a
versioned schema whose record columns come from core.record. Sweeps write it, one
committed row per record; reports and `results` open it read-only and never change it."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from core.record import COLUMN_TYPES, COLUMNS, JSON_COLUMNS, Record, row, to_sql

SCHEMA_VERSION = 1
DEFAULT_DB = Path("results/foscar.sqlite")

# Record columns with their SQLite types: the result record's (core.record), and the run.
RECORD_COLUMNS: dict[str, str] = {"run_id": "TEXT NOT NULL", **COLUMNS}

RUN_COLUMNS: dict[str, str] = {
    "run_id": "TEXT PRIMARY KEY",
    "started_at": "TEXT NOT NULL",
    "git_sha": "TEXT",
    "git_dirty": "INTEGER",
    "argv": "TEXT",
    "config_json": "TEXT",
    "config_hash": "TEXT",
    "env_json": "TEXT",
}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def config_hash(config: dict) -> str:
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def git_state(cwd: str | os.PathLike | None = None) -> tuple[str | None, bool | None]:
    """(sha, dirty) of the source tree this code runs from; (None, None) outside git.

    A copy of the tree without its .git (as on a lent GPU machine) can name its commit in
    FOSCAR_GIT_SHA (and FOSCAR_GIT_DIRTY=1 when it carries uncommitted changes).
    """
    if os.environ.get("FOSCAR_GIT_SHA"):
        return os.environ["FOSCAR_GIT_SHA"], os.environ.get("FOSCAR_GIT_DIRTY", "0") == "1"
    where = cwd or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        if sha.returncode:
            return None, None
        dirty = subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=where, capture_output=True, text=True, timeout=10,
        )
        return sha.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


class StoreError(Exception):
    """A store file cannot be opened or read; the message names it and says what to do."""


class ResultStore:
    """Runs and their records in one SQLite file. Safe to reopen; every write commits.

    `readonly=True` opens an existing file for reading only: nothing is created, migrated or
    written, and a read-only file system works. `immutable=True` (with readonly) also tells
    SQLite the file cannot change while it is open, for files that ship with the code.
    """

    def __init__(self, path: str | os.PathLike = DEFAULT_DB, *, readonly: bool = False, immutable: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        try:
            if readonly:
                self.conn = connect_readonly(self.path, immutable)
                self._check_version()
            else:
                if str(self.path) != ":memory:":
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(str(self.path), timeout=60)
                self.conn.execute("PRAGMA journal_mode=WAL")
                self._init_schema()
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path} is not a results store ({exc}); pass --db the .sqlite file a sweep wrote."
            ) from None
        except OSError as exc:
            raise StoreError(f"{self.path} cannot be opened ({exc.strerror or exc}); pass --db a writable path.") from None

    # --- schema -------------------------------------------------------------------------
    def _check_version(self) -> None:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"meta", "runs", "records"} <= tables:
            raise StoreError(
                f"{self.path} is an SQLite file but not a results store (no runs and records); "
                "pass --db the .sqlite file a sweep wrote."
            )
        row_ = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row_ is not None and int(row_[0]) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {row_[0]}, newer than this code's "
                f"{SCHEMA_VERSION}; update foscar-bench to read it."
            )

    def _init_schema(self) -> None:
        c = self.conn
        c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row_ = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row_ is not None and int(row_[0]) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {row_[0]}, newer than this code's "
                f"{SCHEMA_VERSION}; update foscar-bench to write it."
            )
        cols = ", ".join(f"{k} {v}" for k, v in RUN_COLUMNS.items())
        c.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
        cols = ", ".join(f"{k} {v}" for k, v in RECORD_COLUMNS.items())
        c.execute(f"CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})")
        c.execute("CREATE INDEX IF NOT EXISTS records_run ON records (run_id, case_key, backend)")
        # Columns the record gained later appear in older files too (on writing only).
        have = {r[1] for r in c.execute("PRAGMA table_info(records)")}
        for name, typ in RECORD_COLUMNS.items():
            if name not in have:
                c.execute(f"ALTER TABLE records ADD COLUMN {name} {typ.replace(' NOT NULL', '')}")
        if row_ is None or row_[0] != str(SCHEMA_VERSION):
            c.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        c.commit()

    @property
    def schema_version(self) -> int:
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0])

    # --- runs ---------------------------------------------------------------------------
    def start_run(
        self, *, argv: Iterable[str], config: dict, env: dict, run_id: str | None = None
    ) -> str:
        """Record a new run (or return `run_id` unchanged if it already exists: resume)."""
        if run_id and self.has_run(run_id):
            return run_id
        run_id = run_id or datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        sha, dirty = git_state()
        self.conn.execute(
            "INSERT INTO runs (run_id, started_at, git_sha, git_dirty, argv, config_json, "
            "config_hash, env_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id, utc_now(), sha, None if dirty is None else int(dirty),
                json.dumps(list(argv)), json.dumps(config, sort_keys=True, default=str),
                config_hash(config), json.dumps(env, default=str),
            ),
        )
        self.conn.commit()
        return run_id

    def has_run(self, run_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is not None

    def run_info(self, run_id: str) -> dict[str, Any]:
        cur = self.conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,))
        row = cur.fetchone()
        if row is None:
            raise KeyError(f"run {run_id!r} is not in {self.path}.")
        info = dict(zip([d[0] for d in cur.description], row))
        info["config"] = json.loads(info.pop("config_json") or "{}")
        info["env"] = json.loads(info.pop("env_json") or "{}")
        info["argv"] = json.loads(info["argv"] or "[]")
        return info

    def update_run_env(self, run_id: str, patch: dict) -> None:
        """Merge keys into a run's environment (workers report their GPU blocks and read
        ceilings after the run has started)."""
        row = self.conn.execute("SELECT env_json FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"run {run_id!r} is not in {self.path}.")
        env = json.loads(row[0] or "{}")
        for k, v in patch.items():
            if isinstance(v, dict) and isinstance(env.get(k), dict):
                env[k] = {**env[k], **v}
            else:
                env[k] = v
        self.conn.execute("UPDATE runs SET env_json=? WHERE run_id=?", (json.dumps(env, default=str), run_id))
        self.conn.commit()

    def latest_run(self) -> str | None:
        row = self.conn.execute("SELECT run_id FROM runs ORDER BY started_at DESC, rowid DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def runs(self) -> pd.DataFrame:
        df = pd.read_sql_query("SELECT * FROM runs ORDER BY started_at, rowid", self.conn)
        counts = pd.read_sql_query(
            "SELECT run_id, COUNT(*) AS n_records, SUM(status='passed') AS n_passed "
            "FROM records GROUP BY run_id",
            self.conn,
        )
        return df.merge(counts, on="run_id", how="left").fillna({"n_records": 0, "n_passed": 0})

    # --- records ------------------------------------------------------------------------
    def add_record(self, run_id: str, record: Record | dict) -> None:
        """Insert one record and commit at once, so a crash loses nothing written. A
        mapping of column names is taken too (fixtures, tools); other keys go to extra_json."""
        values = row(record)
        values["run_id"] = run_id
        values.setdefault("created_at", utc_now())
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        self.conn.execute(f"INSERT INTO records ({names}) VALUES ({marks})", tuple(values.values()))
        self.conn.commit()

    def update_record(self, run_id: str, case_key: str, backend: str, **fields: Any) -> int:
        """Set columns of the latest matching record (e.g. ALU figures); unknown keys are
        merged into extra_json. Returns the number of rows changed (0 or 1)."""
        found = self.conn.execute(
            "SELECT id, extra_json FROM records WHERE run_id=? AND case_key=? AND backend=? "
            "ORDER BY id DESC LIMIT 1",
            (run_id, case_key, backend),
        ).fetchone()
        if found is None:
            return 0
        rec_id, extra_text = found
        sets, extra = {}, json.loads(extra_text) if extra_text else {}
        for k, v in fields.items():
            if k in COLUMN_TYPES and k not in ("case_key", "backend"):
                sets[k] = to_sql(v)
            else:
                extra[k] = to_sql(v) if not isinstance(v, (dict, list)) else v
        if extra:
            sets["extra_json"] = json.dumps(extra, default=str)
        if not sets:
            return 0
        assignments = ", ".join(f"{k}=?" for k in sets)
        self.conn.execute(f"UPDATE records SET {assignments} WHERE id=?", (*sets.values(), rec_id))
        self.conn.commit()
        return 1

    def finished_keys(self, run_id: str) -> set[str]:
        """'case_key|backend' of every record of the run: what --resume skips."""
        rows = self.conn.execute(
            "SELECT case_key, backend FROM records WHERE run_id=?", (run_id,)
        ).fetchall()
        return {f"{c}|{b}" for c, b in rows}

    def records(self, run_id: str | None = None) -> pd.DataFrame:
        """One row per record, with the run's started_at, git_sha and git_dirty."""
        query = (
            "SELECT r.*, runs.started_at, runs.git_sha, runs.git_dirty FROM records r "
            "LEFT JOIN runs ON r.run_id = runs.run_id"
        )
        params: tuple = ()
        if run_id is not None:
            query += " WHERE r.run_id = ?"
            params = (run_id,)
        return migrate(pd.read_sql_query(query + " ORDER BY r.id", self.conn, params=params))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def migrate(df: pd.DataFrame) -> pd.DataFrame:
    """Records of any older file in today's columns, on read: a column the file lacks is
    there (empty), and a value an older writer kept in extra_json fills its column now."""
    for name in RECORD_COLUMNS:
        if name not in df:
            df[name] = None
    moved: dict[str, dict[Any, Any]] = {}
    for i, text in df["extra_json"].items():
        try:
            extra = json.loads(text) if isinstance(text, str) and text else {}
        except ValueError:
            continue
        for key, value in extra.items() if isinstance(extra, dict) else ():
            if key in COLUMN_TYPES and _missing(df.at[i, key]):
                moved.setdefault(key, {})[i] = json.dumps(value) if key in JSON_COLUMNS else value
    for key, values in moved.items():
        df[key] = df[key].astype(object)
        for i, value in values.items():
            df.at[i, key] = value
    return df


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def connect_readonly(path: Path, immutable: bool) -> sqlite3.Connection:
    """A read-only connection that leaves the folder as it found it.

    With no -wal file beside it, no writer has the file open and every commit is in the
    file itself: it is read as immutable, so SQLite creates no -wal or -shm file either.
    With one (a sweep is writing, or one was killed), it is read through the WAL. On a
    read-only file system, where SQLite cannot open a WAL file for reading, it falls back
    to immutable too.
    """
    if not path.is_file():
        raise StoreError(f"results store {path} does not exist; run `foscar-bench sweep --db {path}` first, or pass --db.")
    uri = path.resolve().as_uri()
    quiet = immutable or not path.with_name(path.name + "-wal").exists()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro" + ("&immutable=1" if quiet else ""), uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        if quiet:
            raise
    conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return conn


def record_key(case_key: str, backend: str) -> str:
    return f"{case_key}|{backend}"
