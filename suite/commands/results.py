"""`foscar-bench results`: read records back from the store, as a table, JSON lines, CSV
or Parquet."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional

import typer

# The fields every exported record carries, first and in this order.
CORE_FIELDS = (
    "run_id", "backend", "family", "batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim",
    "bits", "k_mode", "v_mode", "group_size", "page_size", "model", "gpu_name", "gpu_uuid", "status",
    "reason", "median_us", "p10_us", "p90_us", "n_samples", "spread", "bytes", "eff_bandwidth_tbps",
    "frac_peak_bus", "frac_peak_datasheet", "frac_read_ceiling", "rel_error", "quant_rel_error",
    "l2_policy", "l2_verdict", "throttled", "build_s", "reproducer", "case_key", "started_at", "git_sha", "git_dirty",
)


def _clean(value):
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def record_dicts(df) -> list[dict]:
    """Records as plain dicts: core fields first, then the rest, JSON columns and
    extra_json unpacked."""
    from core.record import JSON_COLUMNS

    rows = []
    for rec in df.to_dict(orient="records"):
        extra = rec.pop("extra_json", None)
        for k in JSON_COLUMNS:
            if isinstance(rec.get(k), str):
                try:
                    rec[k] = json.loads(rec[k])
                except ValueError:
                    pass
        out = {k: _clean(rec.get(k)) for k in CORE_FIELDS}
        for k, v in rec.items():
            if k not in out:
                out[k] = _clean(v)
        if extra:
            try:
                for k, v in json.loads(extra).items():
                    out.setdefault(k, v)
            except (TypeError, ValueError):
                out["extra_json"] = extra
        rows.append(out)
    return rows


def merge(out: Path, inputs: list[Path]) -> None:
    """`results merge OUT IN...`: join stores into OUT, every run and record once, nothing
    lost; running it again changes nothing (core.store.merge_stores)."""
    from core.store import MergeError, StoreError, merge_stores

    try:
        counts = merge_stores(out, inputs)
    except (MergeError, StoreError) as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2)
    typer.echo(f"merged {len(counts.inputs)} store(s) into {out}: {counts.records_added} record(s) added, "
               f"{counts.records_present} already there; {counts.runs_added} run(s) added, "
               f"{counts.runs_combined} combined from shards"
               + (f"; {counts.e2e_runs_added} e2e run(s) with {counts.e2e_records_added} record(s) added."
                  if counts.e2e_runs_added or counts.e2e_records_added else "."))


def _statuses(text: str) -> list[str]:
    """--status as a list of record statuses; an unknown one is one line and exit 2."""
    from core.record import STATUSES
    from suite.commands.common import fail

    wanted = [s.strip() for s in text.split(",") if s.strip()]
    if not wanted:
        fail(f"--status {text!r} names no status; expected a comma list of some of {', '.join(STATUSES)}.")
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown:
        fail(f"--status {text}: {', '.join(map(repr, unknown))} is not a record status; "
             f"expected some of {', '.join(STATUSES)}.")
    return wanted


def _backends(text: str, stored: set[str]) -> list[str]:
    """--backend as backend names: each a name or a prefix ending in '*' (as `sweep -b`
    takes), matched against the registry and the backends the records hold; one that
    matches neither is one line and exit 2."""
    from baselines.base import all_backends
    from suite.commands.common import fail

    known = stored | {b.name for b in all_backends()}
    wanted = [b.strip() for b in text.split(",") if b.strip()]
    if not wanted:
        fail(f"--backend {text!r} names no backend; expected a comma list such as foscar-int4,torch-ref.")
    names: list[str] = []
    for name in wanted:
        if name.endswith("*"):
            hits = sorted(k for k in known if k.startswith(name[:-1]))
        else:
            hits = [name] if name in known else []
        if not hits:
            fail(f"--backend {name!r} matches no backend of the registry or of these records; "
                 f"expected one of {', '.join(sorted(known))} (a trailing * matches a prefix).")
        names.extend(hits)
    return names


def register(app: typer.Typer) -> None:
    @app.command("results")
    def results(
        action: Optional[List[str]] = typer.Argument(
            None, metavar="[merge OUT IN...]",
            help="`merge OUT IN1 IN2 ...` joins stores (one per shard) into OUT: every run and record "
            "once, nothing lost; running it again changes nothing."),
        run: Optional[str] = typer.Option(None, "--run", help="Run id (default: the latest run)."),
        all_runs: bool = typer.Option(False, "--all", help="Every run in the store."),
        runs: bool = typer.Option(False, "--runs", help="List the runs and exit."),
        as_json: bool = typer.Option(False, "--json", help="One JSON object per record, one per line."),
        csv: Optional[Path] = typer.Option(None, "--csv", help="Write the records to this CSV file."),
        parquet: Optional[Path] = typer.Option(None, "--parquet", help="Write the records to this Parquet file (pyarrow)."),
        status: Optional[str] = typer.Option(None, "--status", help="Only these statuses, e.g. passed,incorrect."),
        backend: Optional[str] = typer.Option(None, "--backend", help="Only these backends (comma list; 'torch*' matches a prefix)."),
        db: Path = typer.Option(Path("results/foscar.sqlite"), "--db", help="Results store (SQLite)."),
    ) -> None:
        """Records of a run: a table by default; --json, --csv, --parquet export every field.
        `results merge OUT IN...` joins stores."""
        if action:
            if action[0] != "merge" or len(action) < 3:
                typer.echo(f"results takes no {' '.join(action)!r}; the one action is `results merge OUT IN1 [IN2 ...]`.",
                           err=True)
                raise typer.Exit(2)
            merge(Path(action[1]), [Path(a) for a in action[2:]])
            return
        import pandas as pd
        from rich.console import Console

        from core.store import ResultStore, StoreError
        from suite.commands.common import fail, output_file
        from suite.summary import summary_table

        console = Console()
        output_file("--csv", csv)
        output_file("--parquet", parquet)
        statuses = _statuses(status) if status is not None else None
        try:
            store = ResultStore(db, readonly=True)
        except StoreError as exc:
            fail(str(exc))
        if runs:
            df = store.runs()
            if as_json:
                for r in df.drop(columns=["env_json"], errors="ignore").to_dict(orient="records"):
                    typer.echo(json.dumps({k: _clean(v) for k, v in r.items()}, default=str))
            else:
                cols = [c for c in ("run_id", "started_at", "git_sha", "git_dirty", "n_records", "n_passed") if c in df]
                console.print(df[cols].to_string(index=False) if not df.empty else "no runs")
            return
        run_id = None if all_runs else (run or store.latest_run())
        if not all_runs and run_id is None:
            fail(f"{db} holds no runs yet; `foscar-bench sweep --db {db}` adds one.", 1)
        if run_id is not None and not store.has_run(run_id):
            fail(f"run {run_id!r} is not in {db}; `foscar-bench results --runs --db {db}` lists them.")
        df = store.records(run_id)
        if statuses is not None:
            df = df[df["status"].isin(statuses)]
        if backend is not None:
            df = df[df["backend"].isin(_backends(backend, set(df["backend"])))]
        rows = record_dicts(df)
        if csv or parquet:
            flat = pd.DataFrame(rows)
            for col in flat.columns:  # lists/dicts from extra_json as JSON text
                if flat[col].map(lambda v: isinstance(v, (list, dict))).any():
                    flat[col] = flat[col].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
            try:
                if csv:
                    flat.to_csv(csv, index=False)
                    console.print(f"wrote {len(flat)} records to {csv}")
                if parquet:
                    try:
                        flat.to_parquet(parquet, index=False)
                    except ImportError as exc:
                        fail(f"--parquet {parquet}: Parquet needs pyarrow ({exc}); `pip install pyarrow`.")
                    console.print(f"wrote {len(flat)} records to {parquet}")
            except OSError as exc:
                fail(f"{exc.filename or csv or parquet} cannot be written ({exc.strerror or exc}); pick a writable path.")
        if as_json:
            for r in rows:
                typer.echo(json.dumps(r, default=str))
        elif not (csv or parquet):
            console.print(summary_table(df, title=f"run {run_id}" if run_id else "all runs"))
