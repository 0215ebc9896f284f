"""Reading the results store for reports (records, runs, envs, run/commit names): the one place touching core.store."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from core.store import DEFAULT_DB, ResultStore, StoreError

BUNDLED_DB = Path(__file__).parent / "data" / "bundled.sqlite"
NUMERIC = (
    "bits", "batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim", "group_size",
    "page_size", "median_us", "p10_us", "p90_us", "n_samples", "spread", "bytes", "flops",
    "eff_bandwidth_tbps", "frac_peak_bus", "frac_peak_datasheet", "frac_read_ceiling",
    "rel_error", "quant_rel_error", "sm_clock_mhz_before", "sm_clock_mhz_after", "sm_clock_mhz_min",
    "sm_clock_mhz_median", "power_w_max", "throttled_frac",
    "alu_per_elem", "inst_per_elem", "alu_static_per_elem", "dram_bytes_read",
)


class SourceError(Exception):
    """A store, run or commit the user named cannot be read; the message says why."""


@dataclass
class Results:
    """Records (one row per record, run columns joined) and the runs they came from."""

    records: pd.DataFrame
    runs: pd.DataFrame
    db: str = ""  # what pages print: a path, several joined by ', ', or the bundled one's label
    notes: list[str] = field(default_factory=list)
    dbs: list[str] = field(default_factory=list)  # each store read, as `db` names one (empty: `db`)

    def env(self, run_id: str) -> dict:
        row = self.runs[self.runs["run_id"] == run_id]
        return row["env"].iloc[0] if len(row) else {}


def default_db() -> Path:
    return Path(DEFAULT_DB)


def _parse_json(text) -> dict:
    if not isinstance(text, str) or not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def normalise_records(df: pd.DataFrame) -> pd.DataFrame:
    """Numeric columns as floats, missing columns present (NaN), so reports never KeyError."""
    df = df.copy()
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df else float("nan")
    for col in ("run_id", "case_key", "backend", "family", "k_mode", "v_mode", "model",
                "gpu_name", "status", "reason", "l2_policy", "started_at", "git_sha",
                "created_at", "throttled", "git_dirty"):
        if col not in df:
            df[col] = None
    df["gpu_name"] = df["gpu_name"].fillna("unknown GPU")
    df["family"] = df["family"].fillna("")
    return df


def normalise_runs(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for col in ("run_id", "started_at", "git_sha", "git_dirty", "argv", "env_json", "config_json"):
        if col not in df:
            df[col] = None
    df["env"] = [_parse_json(t) for t in df["env_json"]]
    df["config"] = [_parse_json(t) for t in df["config_json"]]
    return df


def from_frames(records: pd.DataFrame, runs: pd.DataFrame | None = None, db: str = "") -> Results:
    """Results from plain DataFrames (tests, notebooks); runs are inferred when absent."""
    records = normalise_records(records)
    if runs is None:
        runs = records.groupby("run_id", as_index=False).agg(
            started_at=("started_at", "min"), git_sha=("git_sha", "first")
        )
    return Results(records=records, runs=normalise_runs(runs), db=db)


def open_store(db: str | Path) -> Results:
    """Every run and record of a store file, opened read-only: the file is never created,
    migrated or written (a read-only file system works). Any problem is a SourceError."""
    path = Path(db)
    if not path.exists():
        raise SourceError(f"results store {path} does not exist; run `foscar-bench sweep` first, or pass --db.")
    return _read(path, immutable=False)


def _read(path: Path, immutable: bool) -> Results:
    try:
        with ResultStore(path, readonly=True, immutable=immutable) as store:
            return from_frames(store.records(), store.runs(), db=str(path))
    except StoreError as exc:
        raise SourceError(str(exc)) from None


def open_stores(dbs: list[str | Path]) -> Results:
    """Several stores read as one (each read-only); a run found in two counts once."""
    parts = [open_store(db) for db in dbs]
    if len(parts) == 1:
        return parts[0]
    records = pd.concat([p.records for p in parts], ignore_index=True)
    runs = pd.concat([p.runs for p in parts], ignore_index=True).drop_duplicates("run_id")
    records = records.drop_duplicates(["run_id", "case_key", "backend", "created_at"])
    return Results(records=records, runs=runs, db=", ".join(p.db for p in parts), dbs=[p.db for p in parts])


def open_bundled() -> Results:
    """The bundled H200 results. The shipped file is read as immutable, so SQLite neither
    changes it nor leaves a -wal or -shm file beside it."""
    if not BUNDLED_DB.exists():
        raise SourceError(
            f"no bundled results ship with this checkout ({BUNDLED_DB} is absent); "
            "render your own store with `foscar-bench report --db PATH`."
        )
    results = _read(BUNDLED_DB, immutable=True)
    results.db = f"{BUNDLED_DB} (bundled)"
    return results


def oldest_first(records: pd.DataFrame) -> pd.DataFrame:
    """Records by their run's start, then their own creation: the newest last."""
    return records.sort_values(["started_at", "created_at"], na_position="first", kind="stable")


def latest_per_case(records: pd.DataFrame) -> pd.DataFrame:
    """One record per (GPU, case, backend): the newest, so reruns and resumes count once."""
    if records.empty:
        return records
    return oldest_first(records).drop_duplicates(["gpu_name", "case_key", "backend"], keep="last")


def select_runs(results: Results, names: list[str] | None) -> Results:
    """Keep the named runs (ids or git-sha prefixes; 'all' keeps everything; none: latest)."""
    runs = results.runs
    if runs.empty:
        raise SourceError(f"results store {results.db} holds no runs yet.")
    if names and "all" in names:
        keep = list(runs["run_id"])
    elif names:
        keep = []
        for name in names:
            keep += resolve(results, name)
    else:
        keep = [runs.sort_values("started_at")["run_id"].iloc[-1]]
    recs = results.records[results.records["run_id"].isin(keep)]
    return Results(recs, runs[runs["run_id"].isin(keep)], results.db, list(results.notes), list(results.dbs))


def resolve(results: Results, name: str) -> list[str]:
    """Run ids a name means: an exact run id, else every run whose git sha starts with it."""
    runs = results.runs
    if name in set(runs["run_id"]):
        return [name]
    if len(name) >= 4:
        hits = runs[runs["git_sha"].fillna("").str.startswith(name.lower())]
        if hits["git_sha"].nunique() > 1:
            raise SourceError(
                f"git sha prefix {name!r} matches {hits['git_sha'].nunique()} commits; give more digits."
            )
        if len(hits):
            return list(hits.sort_values("started_at")["run_id"])
    raise SourceError(
        f"{name!r} is neither a run id nor a git sha (4+ hex digits) of a run in "
        f"{results.db}; `foscar-bench results` lists runs."
    )
