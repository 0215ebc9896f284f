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
        db: Optional[List[Path]] = typer.Option(
            None, "--db", help="Results store (repeatable: several read as one; default: results/foscar.sqlite)."),
        bundled: bool = typer.Option(False, "--bundled", help="Render the H200 results shipped in the repo."),
    ) -> None:
        """Write a report folder: the paper's tables beside ours, rooflines, scaling, accuracy."""
        from reports.report import build_report
        from reports.source import SourceError, default_db, open_bundled, open_stores, select_runs
        from suite.commands.common import fail, output_dir

        if bundled and db:
            fail("pass --bundled or --db, not both: --bundled renders the shipped H200 results.")
        try:
            results = open_bundled() if bundled else open_stores(db or [default_db()])
            results = select_runs(results, run or (["all"] if bundled else None))
        except SourceError as err:
            from reports.e2e import e2e_only

            # a store of `foscar-bench e2e` runs alone still renders
            results = None if bundled or not db or len(db) != 1 else e2e_only(db[0], run)
            if results is None:
                hint = "" if bundled or db else " (`foscar-bench report --bundled` renders the shipped H200 results)"
                fail(f"{err}{hint}", 1)
        try:
            index = build_report(results, output_dir("--out", out))
        except OSError as exc:
            fail(f"--out {out}: writing the report failed ({exc.strerror or exc}); pick a writable folder.")
        typer.echo(f"Report of {results.records['run_id'].nunique()} run(s), "
                   f"{len(results.records)} record(s): {index}")
