"""`foscar-bench targets`: our targets beside what a store measured, met / missed / not measured
(reports.targets); exit 1 with --fail-on-miss when a target is missed."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

# --fail-on-miss: a missed target fails; one not measured does not (the table says which).
MISSED_EXIT = 1
BAD_INPUT_EXIT = 2


def render(rows: list, console: Any) -> None:
    """The scorecard as a rich table, then its counts."""
    from rich.markup import escape
    from rich.table import Table

    from reports import targets

    shown = targets.display(rows)
    gpu = rows[0].gpu if rows else ""
    table = Table(title=escape(f"Targets (reports/data/paper.csv) judged on {gpu or 'no GPU of the selected runs'}, "
                               f"our kernels in {targets.formats_text(rows)}"))
    for col in shown.columns:
        table.add_column(escape(col), no_wrap=col in ("goal", "status"), overflow="fold")
    style = {targets.MET: "green", targets.MISSED: "red", targets.NOT_MEASURED: "yellow"}
    for row, cells in zip(rows, shown.itertuples(index=False)):
        table.add_row(*(escape(str(c)) for c in cells), style=style.get(row.status))
    console.print(table)
    console.print(targets.counts(rows))


def register(app: typer.Typer) -> None:
    @app.command("targets")
    def targets_command(
        db: Optional[List[Path]] = typer.Option(
            None, "--db", help="Results store (repeatable: several read as one; default: results/foscar.sqlite)."),
        run: Optional[List[str]] = typer.Option(
            None, "--run", help="Run id or git sha to judge (repeatable; 'all' for every run). "
            "Default: the latest run, or every bundled run with --bundled."),
        bundled: bool = typer.Option(False, "--bundled", help="Judge the H200 results shipped in the repo."),
        gpu: Optional[str] = typer.Option(
            None, "--gpu", help="The GPU whose records are judged: its name or a part of it "
            "(default: the targets' GPU, H200)."),
        json_out: Optional[Path] = typer.Option(
            None, "--json-out", help="Also write the rows (and the store, runs and GPU judged) as JSON to this file."),
        fail_on_miss: bool = typer.Option(
            False, "--fail-on-miss",
            help="Exit 1 when a target is missed; a target not measured does not fail (exit 0)."),
    ) -> None:
        """Print each of our targets beside what the store measured: met, missed or not measured, and why."""
        from rich.console import Console

        from reports import targets
        from reports.source import SourceError, default_db, open_bundled, open_stores, select_runs
        from suite.commands.common import fail, output_file

        if bundled and db:
            fail("pass --bundled or --db, not both: --bundled judges the shipped H200 results.", BAD_INPUT_EXIT)
        output_file("--json-out", json_out)
        try:
            results = open_bundled() if bundled else open_stores(db or [default_db()])
            results = select_runs(results, run or (["all"] if bundled else None))
            rows = targets.scorecard(results, gpu=gpu)
        except SourceError as err:
            hint = "" if bundled or db else " (`foscar-bench targets --bundled` judges the shipped H200 results)"
            fail(f"{err}{hint}", BAD_INPUT_EXIT)
        except ValueError as err:
            fail(str(err), BAD_INPUT_EXIT)
        render(rows, Console(width=None if sys.stdout.isatty() else 200))
        if json_out:
            _write_json(json_out, results, rows)
        if fail_on_miss and any(r.status == targets.MISSED for r in rows):
            raise typer.Exit(MISSED_EXIT)


def _write_json(path: Path, results: Any, rows: list) -> None:
    """The rows with where they came from; written whole, so a reader never sees half a file."""
    from reports import targets
    from suite.commands.common import fail, write_json

    doc = {"store": results.db, "runs": sorted(str(r) for r in results.runs["run_id"]),
           "rows": json.loads(targets.frame(rows).to_json(orient="records"))}
    try:
        write_json(path, doc)
    except OSError as exc:
        fail(f"--json-out {path}: writing failed ({exc.strerror or exc}); pick a writable path.", BAD_INPUT_EXIT)
