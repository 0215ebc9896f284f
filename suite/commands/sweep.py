"""`foscar-bench sweep`: not built yet."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep() -> None:
        """(not implemented yet)"""
        typer.echo("foscar-bench sweep is not implemented yet.", err=True)
        raise typer.Exit(2)
