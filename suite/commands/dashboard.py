"""`foscar-bench dashboard`: not built yet."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard() -> None:
        """(not implemented yet)"""
        typer.echo("foscar-bench dashboard is not implemented yet.", err=True)
        raise typer.Exit(2)
