"""`foscar-bench dashboard`: static site of every series over commits, noise bands, called changes, exports."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        out: Path = typer.Option(Path("out/dashboard"), "--out", help="Folder to write the site into."),
        db: Optional[Path] = typer.Option(None, "--db", help="Results store (default: results/foscar.sqlite)."),
        threshold: str = typer.Option("2%", "--threshold",
                                      help="Smallest change of the median called a change (outside the noise too)."),
    ) -> None:
        """Write the dashboard: per (backend, shape) series over commits with p10..p90 bands."""
        from reports.dashboard import build_dashboard
        from reports.noise import parse_fraction
        from reports.source import SourceError, default_db, open_store
        from suite.commands.common import fail, output_dir

        try:
            min_change = parse_fraction(threshold) or 0.0
            results = open_store(db or default_db())
        except (SourceError, ValueError) as err:
            fail(str(err), 1)
        try:
            index = build_dashboard(results, output_dir("--out", out), min_change)
        except OSError as exc:
            fail(f"--out {out}: writing the dashboard failed ({exc.strerror or exc}); pick a writable folder.")
        typer.echo(f"Dashboard of {len(results.runs)} run(s): {index}")
