"""`foscar-bench report`: render a run's report (paper tables, speedup bound, rooflines, scaling, accuracy),
or the bundled one."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

# The read floor measured with the bundled grid runs (docs/MEASUREMENT.md): --bundled's default.
BUNDLED_FLOOR = Path(__file__).resolve().parents[2] / "docs" / "data" / "floor_h200_grid_e0c73ba.json"


def _floor_text(path: Path) -> str:
    """The path as the section names it: relative to the checkout when it lies inside it."""
    root = BUNDLED_FLOOR.parents[2]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def speedup_bound(results, floor_from: Optional[Path], bundled: bool):
    """The report's speedup-bound section input (reports.bound.Bound): the floor of --floor-from,
    else with --bundled the bundled one when it is there, set against the runs reports.bound
    picks; None when there is no floor (the section then says how to get one)."""
    from reports.bound import Bound, pick_runs, run_records
    from suite.commands.ceiling import load_floor
    from suite.readfloor import BASELINES, OURS, speedup_bounds

    path = floor_from or (BUNDLED_FLOOR if bundled and BUNDLED_FLOOR.is_file() else None)
    if path is None:
        return None
    curve = load_floor(path)
    source = _floor_text(path) + (" (bundled)" if floor_from is None else "")
    bound = Bound(floor_source=source, floor_gpu=curve.get("gpu_name"), baselines=tuple(BASELINES))
    bound.ours_run, bound.baseline_run = pick_runs(results, OURS, BASELINES, gpu=curve.get("gpu_name"))
    if bound.ours_run is None:
        bound.problem = (f"No selected run holds a passed record of {' or '.join(OURS)} with its time and bytes: "
                         "no bound to show.")
    elif bound.baseline_run is None:
        bound.problem = (f"No selected run holds a timed record of {' or '.join(BASELINES)} on a shape of run "
                         f"{bound.ours_run}: no bound to show (add the run that does with --run, or --db).")
    else:
        bound.result = speedup_bounds(run_records(results, bound.ours_run), run_records(results, bound.baseline_run),
                                      curve, ours=OURS, baselines=BASELINES)
    return bound


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        run: Optional[List[str]] = typer.Option(
            None, "--run", help="Run id or git sha to report (repeatable; 'all' for every run). "
            "Default: the latest run, or every bundled run with --bundled."),
        out: Path = typer.Option(Path("out/report"), "--out", help="Folder to write index.html, PNG/SVG and CSV into."),
        db: Optional[List[Path]] = typer.Option(
            None, "--db", help="Results store (repeatable: several read as one; default: results/foscar.sqlite)."),
        bundled: bool = typer.Option(False, "--bundled", help="Render the H200 results shipped in the repo."),
        floor_from: Optional[Path] = typer.Option(
            None, "--floor-from",
            help="A read floor (`foscar-bench ceiling --floor --json-out F`, on the GPU the records came from) "
            f"for the speedup-bound section. Default with --bundled: docs/data/{BUNDLED_FLOOR.name}."),
    ) -> None:
        """Write a report folder: the paper's tables beside ours, the speedup bound, rooflines, scaling, accuracy."""
        from reports.report import build_report
        from reports.source import SourceError, default_db, open_bundled, open_stores, select_runs
        from suite.commands.common import fail, output_dir

        if bundled and db:
            fail("pass --bundled or --db, not both: --bundled renders the shipped H200 results.")
        try:
            results = open_bundled() if bundled else open_stores(db or [default_db()])
            results = select_runs(results, run or (["all"] if bundled else None))
        except SourceError as err:
            from reports.e2e import e2e_only

            # a store of `foscar-bench e2e` runs alone still renders
            results = None if bundled or not db or len(db) != 1 else e2e_only(db[0], run)
            if results is None:
                hint = "" if bundled or db else " (`foscar-bench report --bundled` renders the shipped H200 results)"
                fail(f"{err}{hint}", 1)
        bound = speedup_bound(results, floor_from, bundled)
        try:
            index = build_report(results, output_dir("--out", out), bound=bound)
        except OSError as exc:
            fail(f"--out {out}: writing the report failed ({exc.strerror or exc}); pick a writable folder.")
        typer.echo(f"Report of {results.records['run_id'].nunique()} run(s), "
                   f"{len(results.records)} record(s): {index}")
