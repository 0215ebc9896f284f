"""`foscar-bench results`: not built yet."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("results")
    def results() -> None:
        """(not implemented yet)"""
        typer.echo("foscar-bench results is not implemented yet.", err=True)
        raise typer.Exit(2)
