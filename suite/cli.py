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


def _one_line(doc: str) -> str:
    """A docstring's first paragraph on one line: `--help`'s command list keeps the line breaks
    of a docstring's source, so a wrapped first paragraph would print ragged."""
    return " ".join(doc.strip().split("\n\n")[0].split())


for _info in app.registered_commands:
    if _info.short_help is None and _info.callback is not None and _info.callback.__doc__:
        _info.short_help = _one_line(_info.callback.__doc__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
