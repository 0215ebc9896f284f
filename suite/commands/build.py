"""`foscar-bench build`: not built yet."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build() -> None:
        """(not implemented yet)"""
        typer.echo("foscar-bench build is not implemented yet.", err=True)
        raise typer.Exit(2)
