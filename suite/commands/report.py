"""`foscar-bench report`: render a run's report (paper tables, rooflines, scaling, accuracy), or the bundled one."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        run: Optional[List[str]] = typer.Option(
            None, "--run", help="Run id or git sha to report (repeatable; 'all' for every run). "
            "Default: the latest run, or every bundled run with --bundled."),
        out: Path = typer.Option(Path("out/report"), "--out", help="Folder to write index.html, PNG/SVG and CSV into."),
        db: Optional[Path] = typer.Option(None, "--db", help="Results store (default: results/foscar.sqlite)."),
        bundled: bool = typer.Option(False, "--bundled", help="Render the H200 results shipped in the repo."),
    ) -> None:
        """Write a report folder: the paper's tables beside ours, rooflines, scaling, accuracy."""
        from reports.report import build_report
        from reports.source import SourceError, default_db, open_bundled, open_store, select_runs

        opened = None
        try:
            opened = open_bundled() if bundled else open_store(db or default_db())
            results = select_runs(opened, run or (["all"] if bundled else None))
        except SourceError as err:
            from reports.e2e import e2e_only

            results = e2e_only(opened, run)  # a store of `foscar-bench e2e` runs alone still renders
            if results is None:
                typer.echo(str(err), err=True)
                raise typer.Exit(1)
        index = build_report(results, out)
        typer.echo(f"Report of {results.records['run_id'].nunique()} run(s), "
                   f"{len(results.records)} record(s): {index}")
