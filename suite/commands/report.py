"""`foscar-bench report`: not built yet."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report() -> None:
        """(not implemented yet)"""
        typer.echo("foscar-bench report is not implemented yet.", err=True)
        raise typer.Exit(2)
