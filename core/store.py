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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from core.record import COLUMN_TYPES, COLUMNS, JSON_COLUMNS, Record, row, to_sql

SCHEMA_VERSION = 1
DEFAULT_DB = Path("results/foscar.sqlite")
# The extra_json key (true) of a record written for an item no worker ever took: every
# worker of the sweep failed to start (suite.sweep). Its status is `crashed`, so it shows,
# but it is no result: finished_keys leaves it out, and --resume runs the item again.
NOT_ATTEMPTED = "not_attempted"

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


class SQLiteFile:
    """A store held open on `self.conn`: close it, or use it as a context manager."""

    conn: sqlite3.Connection

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ResultStore(SQLiteFile):
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
        """'case_key|backend' of every record of the run but those marked NOT_ATTEMPTED:
        what --resume skips."""
        rows = self.conn.execute(
            "SELECT case_key, backend, extra_json FROM records WHERE run_id=?", (run_id,)
        ).fetchall()
        return {f"{c}|{b}" for c, b, extra in rows if not not_attempted(extra)}

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


def not_attempted(extra_json: Any) -> bool:
    """True when a record's extra_json marks it NOT_ATTEMPTED (its item never ran)."""
    try:
        extra = json.loads(extra_json) if isinstance(extra_json, str) and extra_json else {}
    except ValueError:
        return False
    return isinstance(extra, dict) and extra.get(NOT_ATTEMPTED) is True


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


# --- joining stores (one per machine of a sharded sweep) -------------------------------------
class MergeError(ValueError):
    """Two stores disagree about one run in a way a merge cannot settle; the message says how."""


@dataclass
class MergeCounts:
    records_added: int = 0
    records_present: int = 0
    runs_added: int = 0
    runs_combined: int = 0
    e2e_runs_added: int = 0
    e2e_records_added: int = 0
    inputs: list[str] = field(default_factory=list)


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def record_identity(row: dict) -> str:
    """A record's identity across stores: every field but the store-local id, NULLs left
    out (so a column added by a newer schema does not make an old record new)."""
    return _canon({k: v for k, v in row.items() if k != "id" and v is not None})


def _read_only(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise MergeError(f"{path} does not exist; give the stores written by each shard.")
    return connect_readonly(path, immutable=False)


def _parts(value: Any) -> list:
    """The parts a merged run's env was made of (an unmerged env is its own one part)."""
    if isinstance(value, dict) and value.get("merged_parts"):
        return list(value["merged_parts"])
    return [value]


def _shards(config: dict) -> list[str]:
    return sorted(set(config.get("shards") or ([config["shard"]] if config.get("shard") else [])))


def _combine_runs(mine: dict, theirs: dict) -> dict | None:
    """One row for a run both stores hold (shards of one sweep under one run id), or None
    when `mine` already says everything `theirs` does."""
    rid = mine["run_id"]
    if _run_view(mine) == _run_view(theirs):
        return None
    if mine.get("git_sha") != theirs.get("git_sha"):
        raise MergeError(
            f"run {rid} ran at commit {mine.get('git_sha')} in one store and {theirs.get('git_sha')} in "
            "another; shards of one run must run one commit (re-run the odd shard, or give it its own --run-id)."
        )
    cfg_a, cfg_b = json.loads(mine.get("config_json") or "{}"), json.loads(theirs.get("config_json") or "{}")
    strip = lambda c: {k: v for k, v in c.items() if k not in ("shard", "shards", "devices")}  # noqa: E731
    if _canon(strip(cfg_a)) != _canon(strip(cfg_b)):
        raise MergeError(f"run {rid} has different sweep settings in two stores; only shards of one sweep share a run id.")
    env_a, env_b = json.loads(mine.get("env_json") or "{}"), json.loads(theirs.get("env_json") or "{}")
    parts = {_canon(p): p for p in _parts(env_a) + _parts(env_b)}
    shards = sorted(set(_shards(cfg_a)) | set(_shards(cfg_b)))
    devices = sorted({str(d) for c in (cfg_a, cfg_b) for d in (c.get("devices") or [])})
    config = strip(cfg_a)
    if shards:
        config["shards"] = shards
    if devices:
        config["devices"] = devices
    env = parts[next(iter(parts))] if len(parts) == 1 else {"merged_parts": [parts[k] for k in sorted(parts)]}
    argvs = sorted((mine.get("argv") or "[]", theirs.get("argv") or "[]"))
    row = {
        "run_id": rid,
        "started_at": min(mine["started_at"], theirs["started_at"]),
        "git_sha": mine.get("git_sha"),
        "git_dirty": max((v for v in (mine.get("git_dirty"), theirs.get("git_dirty")) if v is not None), default=None),
        "argv": argvs[0],
        "config_json": _canon(config),
        "config_hash": config_hash(config),
        "env_json": _canon(env),
    }
    return None if _run_view(row) == _run_view(mine) else row


def _run_view(row: dict) -> str:
    """A run row as comparable content: JSON columns parsed, the derived hash left out."""
    view = {}
    for k in RUN_COLUMNS:
        v = row.get(k)
        if k in ("argv", "config_json", "env_json") and isinstance(v, str):
            v = json.loads(v or "null")
        if k != "config_hash":
            view[k] = v
    return _canon(view)


def merge_stores(out_path: str | os.PathLike, in_paths: Iterable[str | os.PathLike]) -> MergeCounts:
    """Join stores into `out_path` (created if absent): every run and record of every input,
    each record once. A record is a duplicate only if every field but the id matches
    (record_identity), so nothing measured is lost; merging again changes nothing. Runs
    with one id in several stores (shards of one sweep) become one run whose config lists
    the shards and whose env keeps each machine's part."""
    counts = MergeCounts()
    out_path = Path(out_path)
    with ResultStore(out_path) as out:
        out_cols = list(RECORD_COLUMNS)
        have = {
            record_identity(dict(zip(["id", *out_cols], r)))
            for r in out.conn.execute(f"SELECT id, {', '.join(out_cols)} FROM records")
        }
        for path in map(Path, in_paths):
            if path.resolve() == out_path.resolve():
                continue
            counts.inputs.append(str(path))
            src = _read_only(path)
            try:
                tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                has_sweep, has_e2e = {"runs", "records"} <= tables, "e2e_runs" in tables
                if not (has_sweep or has_e2e):
                    raise MergeError(f"{path} holds neither sweep results (tables runs and records) nor e2e "
                                     f"runs (e2e_runs); give stores that `foscar-bench sweep` or "
                                     f"`foscar-bench e2e` wrote.")
                if has_e2e:
                    _merge_e2e(out, path, counts)
                if not has_sweep:
                    continue
                _merge_runs(out, src, counts)
                src_cols = [r[1] for r in src.execute("PRAGMA table_info(records)") if r[1] in RECORD_COLUMNS]
                for r in src.execute(f"SELECT {', '.join(src_cols)} FROM records ORDER BY id"):
                    row = dict(zip(src_cols, tuple(r)))
                    ident = record_identity(row)
                    if ident in have:
                        counts.records_present += 1
                        continue
                    names = ", ".join(row)
                    out.conn.execute(f"INSERT INTO records ({names}) VALUES ({', '.join('?' for _ in row)})",
                                     tuple(row.values()))
                    have.add(ident)
                    counts.records_added += 1
            finally:
                src.close()
            out.conn.commit()
    return counts


def _merge_e2e(out: ResultStore, path: Path, counts: MergeCounts) -> None:
    """The e2e benchmark's tables (core.e2e_store) travel with the sweep's: each e2e run once."""
    from core.e2e_store import E2EStore  # it builds on this module

    out.conn.commit()
    with E2EStore(out.path) as e2e:
        runs, records = e2e.merge_from(path)
    counts.e2e_runs_added += runs
    counts.e2e_records_added += records


def _merge_runs(out: ResultStore, src: sqlite3.Connection, counts: MergeCounts) -> None:
    cols = [r[1] for r in src.execute("PRAGMA table_info(runs)") if r[1] in RUN_COLUMNS]
    for r in src.execute(f"SELECT {', '.join(cols)} FROM runs ORDER BY started_at"):
        theirs = dict(zip(cols, tuple(r)))
        cur = out.conn.execute("SELECT * FROM runs WHERE run_id=?", (theirs["run_id"],))
        found = cur.fetchone()
        if found is None:
            names = ", ".join(theirs)
            out.conn.execute(f"INSERT INTO runs ({names}) VALUES ({', '.join('?' for _ in theirs)})",
                             tuple(theirs.values()))
            counts.runs_added += 1
            continue
        mine = dict(zip([d[0] for d in cur.description], found))
        row = _combine_runs(mine, theirs)
        if row is not None:
            sets = ", ".join(f"{k}=?" for k in row if k != "run_id")
            out.conn.execute(f"UPDATE runs SET {sets} WHERE run_id=?",
                             (*[v for k, v in row.items() if k != "run_id"], row["run_id"]))
            counts.runs_combined += 1
