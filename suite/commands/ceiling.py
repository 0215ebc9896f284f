"""`foscar-bench ceiling`: the measured read ceiling of one GPU (suite.readceiling), alone."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("ceiling")
    def ceiling(
        gpu: int = typer.Option(0, "--gpu", help="CUDA index of the GPU to measure."),
        out: Optional[Path] = typer.Option(None, "--json", help="Also write the whole search to this JSON file."),
        quick: bool = typer.Option(False, "--quick", help="A smaller search (7 candidates) for a smoke test."),
        rounds: int = typer.Option(3, "--rounds", help="Interleaved timing rounds of the best candidates."),
    ) -> None:
        """Search streaming-read kernels and launch shapes for the best read bandwidth; print
        the ceiling with its spread and every candidate, best first."""
        from suite.envinfo import visible_gpu_count

        if visible_gpu_count() == 0:
            typer.echo("No CUDA GPU is visible here: the read ceiling is measured on the GPU it describes.")
            raise typer.Exit(1)
        import torch

        from suite.readceiling import measure_read_ceiling, table

        summary = measure_read_ceiling(torch.device("cuda", gpu), quick=quick, rounds=rounds)
        summary["gpu_name"] = torch.cuda.get_device_name(gpu)
        for line in table(summary, limit=len(summary.get("candidates", []))):
            typer.echo(line)
        if out:
            out.write_text(json.dumps(summary, indent=2))
            typer.echo(f"wrote {out}")
