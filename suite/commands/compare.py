"""`foscar-bench compare BASE HEAD`: changes judged against both sides' noise; exit 1 on a gated regression."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare(
        base: str = typer.Argument(..., help="BASE: a run id or a git sha (prefix) of a run in the store."),
        head: str = typer.Argument(..., help="HEAD: a run id or a git sha (prefix)."),
        db: Optional[Path] = typer.Option(None, "--db", help="Results store (default: results/foscar.sqlite)."),
        fail_on_regression: Optional[str] = typer.Option(
            None, "--fail-on-regression",
            help="Exit 1 when a median time regressed by more than this (e.g. 5%) outside the noise "
            "of both sides, or a case that passed in BASE no longer passes or is missing from HEAD."),
        threshold: str = typer.Option("2%", "--threshold", help="Smallest change to list as a change."),
        cross_gpu_threshold: Optional[str] = typer.Option(
            None, "--cross-gpu-threshold",
            help="Where BASE and HEAD of a series ran on different physical GPUs (gpu_uuid), the smallest "
            "change to call, gate included (default 5%: reports.noise.CROSS_GPU_THRESHOLD; H200s of one "
            "pool differ by 2-3.5% at small shapes); smaller ones read ambiguous (different GPUs)."),
        show_all: bool = typer.Option(False, "--all", help="List unchanged series too."),
    ) -> None:
        """Print a table of changes from BASE to HEAD; gate CI with --fail-on-regression."""
        from reports.compare import compare as run_compare, render
        from reports.noise import CROSS_GPU_THRESHOLD, parse_fraction
        from reports.source import SourceError, default_db, open_store
        from suite.commands.common import fail

        try:
            gate = parse_fraction(fail_on_regression)
            min_change = parse_fraction(threshold) or 0.0
            across = parse_fraction(cross_gpu_threshold)
            across = CROSS_GPU_THRESHOLD if across is None else across
            cmp = run_compare(open_store(db or default_db()), base, head, min_change, gate, across)
        except (SourceError, ValueError) as err:
            fail(str(err))
        render(cmp, show_all=show_all)
        if len(cmp.failures):
            raise typer.Exit(1)
