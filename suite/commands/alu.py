"""`foscar-bench alu`: not built yet."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("alu")
    def alu() -> None:
        """(not implemented yet)"""
        typer.echo("foscar-bench alu is not implemented yet.", err=True)
        raise typer.Exit(2)
