"""The `foscar-bench` command line: one typer app; each command lives in suite/commands/."""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    help="FOSCAR low-bit KV-cache decode attention: build the kernels, sweep them against "
    "baselines, and report bandwidth, speedups and instruction counts.",
    no_args_is_help=True,
    add_completion=False,
)

# One module per command keeps each command's options next to its code. Order is the
# order `--help` lists them in.
COMMANDS = ("build", "sweep", "results", "report", "targets", "alu", "dashboard", "compare", "env", "ceiling", "e2e")

for _name in COMMANDS:
    importlib.import_module(f"suite.commands.{_name}").register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
