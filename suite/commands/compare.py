"""`foscar-bench compare`: not built yet."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare() -> None:
        """(not implemented yet)"""
        typer.echo("foscar-bench compare is not implemented yet.", err=True)
        raise typer.Exit(2)
