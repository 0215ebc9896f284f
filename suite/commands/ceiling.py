"""`foscar-bench ceiling`: the measured read ceiling of one GPU (suite.readceiling), alone;
with --floor, the read floor per byte count, and with --bound, the speedup bound it sets
on a run's cases (suite.readfloor)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer


def _store_records(db: Path, run: Optional[str], baseline_run: Optional[str]) -> tuple[str, list, str, list]:
    """(run id, its records, baseline run id, its records) as dicts; one line and exit 2 on a
    store or run id that is not there."""
    from core.store import ResultStore, StoreError
    from suite.commands.common import fail

    try:
        store = ResultStore(db, readonly=True)
    except StoreError as exc:
        fail(str(exc))
    run_id = run or store.latest_run()
    if run_id is None:
        fail(f"{db} holds no runs yet; `foscar-bench sweep --db {db}` adds one.")
    for option, rid in (("--run", run_id), ("--baseline-run", baseline_run)):
        if rid is not None and not store.has_run(rid):
            fail(f"{option} {rid!r} is not a run in {db}; `foscar-bench results --runs --db {db}` lists them.")
    base_id = baseline_run or run_id
    ours = store.records(run_id).to_dict(orient="records")
    base = ours if base_id == run_id else store.records(base_id).to_dict(orient="records")
    store.close()
    return run_id, ours, base_id, base


def load_floor(path: Path) -> dict:
    """A floor curve from a JSON file (a --floor --json-out file, or a --bound one carrying its
    floor); one line and exit 2 when it cannot be read or holds no measured size."""
    from suite.commands.common import fail
    from suite.readfloor import check_curve

    try:
        curve = json.loads(path.read_text())
    except OSError as exc:
        fail(f"--floor-from {path}: cannot be read ({exc.strerror or exc}); write one with "
             "`foscar-bench ceiling --floor --json-out F`.")
    except ValueError as exc:
        fail(f"--floor-from {path} is not JSON ({exc}); write one with `foscar-bench ceiling --floor --json-out F`.")
    if isinstance(curve, dict) and isinstance(curve.get("floor"), dict) and "sizes" not in curve:
        curve = curve["floor"]  # the JSON a --bound run wrote carries its floor
    try:
        return check_curve(curve, f"--floor-from {path}")
    except ValueError as exc:
        fail(str(exc))
    return {}


def _targets(groups: list[dict]) -> dict[tuple, float]:
    """Our geo-mean speedup targets per (ours, over), as the report's section 2b reads them."""
    from reports.bound import target

    goals = {(g["ours"], g["over"]): target(g["ours"], g["over"]) for g in groups}
    return {key: value for key, value in goals.items() if value}


def _measure_floor(gpu: int, sizes: Optional[list[int]], quick: bool, rounds: Optional[int],
                   policies: Optional[dict[int, str]] = None) -> dict:
    from suite.envinfo import visible_gpu_count

    if visible_gpu_count() == 0:
        typer.echo("No CUDA GPU is visible here: the read floor is measured on the GPU it describes; "
                   "--bound --floor-from F reads one measured there.")
        raise typer.Exit(1)
    import torch

    from suite.readfloor import measure_read_floor

    def progress(p: dict) -> None:
        us = p.get("median_us")
        typer.echo(f"  {p['bytes']} bytes: " + (f"{us:.2f} us, {p.get('candidate')}, L2 {p.get('l2_policy')}"
                                                 if us else p.get("note", "not measured")), err=True)

    return measure_read_floor(torch.device("cuda", gpu), sizes, quick=quick, rounds=rounds, policies=policies,
                              on_point=progress)


def register(app: typer.Typer) -> None:
    @app.command("ceiling")
    def ceiling(
        gpu: int = typer.Option(0, "--gpu", help="CUDA index of the GPU to measure."),
        out: Optional[Path] = typer.Option(
            None, "--json", "--json-out",
            help="Also write the result to this JSON file: the ceiling's search, the floor (--floor), "
            "or the bound table with its floor (--bound)."),
        quick: bool = typer.Option(False, "--quick", help="A smaller search (a few candidates) for a smoke test."),
        rounds: Optional[int] = typer.Option(
            None, "--rounds", help="Interleaved timing rounds of the best candidates (ceiling: 3, floor: 2)."),
        floor: bool = typer.Option(
            False, "--floor",
            help="Measure the read floor instead: per byte count, the fastest cold read of that many bytes, "
            "timed as the sweep times a decode step (CUDA graphs; L2 rotated or flushed as the run's records of "
            "that size were, else rotated up to 256 copies)."),
        sizes: Optional[str] = typer.Option(
            None, "--sizes",
            help="Byte counts for --floor, e.g. 2375812,4MB,1.5GiB (KB/MB/GB: powers of 1000, KiB/MiB/GiB: "
            "of 1024). Default: the bytes of the run's passed foscar-int* records when --run, --db or "
            "--bound is given, else 31 sizes from 256 KiB to 8 GiB."),
        bound: bool = typer.Option(
            False, "--bound",
            help="Per case of --run: our time, the baseline's, the floor at our bytes, the measured speedup and "
            "its bound (baseline / floor), with geo-means per (ours, baseline). Needs --floor-from F or --floor."),
        floor_from: Optional[Path] = typer.Option(
            None, "--floor-from", help="For --bound: a floor written by `foscar-bench ceiling --floor --json-out F`."),
        db: Optional[Path] = typer.Option(None, "--db", help="Results store (default: results/foscar.sqlite)."),
        run: Optional[str] = typer.Option(None, "--run", help="Run holding our records (default: the latest run)."),
        baseline_run: Optional[str] = typer.Option(
            None, "--baseline-run", help="Run holding the baselines' records (default: --run)."),
        over: Optional[str] = typer.Option(
            None, "--over", help="Baselines to bound against, comma list (default: flashinfer-bf16-tc,trtllm-xqa-fp8)."),
    ) -> None:
        """Search streaming-read kernels and launch shapes for the best read bandwidth; print
        the ceiling with its spread and every candidate, best first. --floor measures the
        read floor per byte count instead; --bound sets it against a run's speedups."""
        from suite.commands.common import fail, output_file

        output_file("--json-out", out)
        if floor_from and not bound:
            fail(f"--floor-from {floor_from} is read by --bound; add --bound, or measure a floor with --floor.")
        if floor_from and floor:
            fail("--floor measures a floor and --floor-from reads one; give one of the two.")
        if bound and not floor_from and not floor:
            fail("--bound needs a floor: --floor-from F (written by `foscar-bench ceiling --floor --json-out F` "
                 "on the GPU), or --floor to measure one now.")
        if not (floor or bound):
            stray = [name for name, value in (("--sizes", sizes), ("--db", db), ("--run", run),
                                              ("--baseline-run", baseline_run), ("--over", over)) if value]
            if stray:
                fail(f"{stray[0]} belongs to --floor or --bound; add one of them.")
        if floor or bound:
            _floor_and_bound(gpu, out, quick, rounds, floor, sizes, bound, floor_from, db, run, baseline_run, over)
            return

        from suite.envinfo import visible_gpu_count

        if visible_gpu_count() == 0:
            typer.echo("No CUDA GPU is visible here: the read ceiling is measured on the GPU it describes.")
            raise typer.Exit(1)
        import torch

        from suite.readceiling import measure_read_ceiling, table

        summary = measure_read_ceiling(torch.device("cuda", gpu), quick=quick, rounds=rounds or 3)
        summary["gpu_name"] = torch.cuda.get_device_name(gpu)
        for line in table(summary, limit=len(summary.get("candidates", []))):
            typer.echo(line)
        if out:
            out.write_text(json.dumps(summary, indent=2))
            typer.echo(f"wrote {out}")


def _floor_and_bound(gpu: int, out: Optional[Path], quick: bool, rounds: Optional[int], floor: bool,
                     sizes: Optional[str], bound: bool, floor_from: Optional[Path], db: Optional[Path],
                     run: Optional[str], baseline_run: Optional[str], over: Optional[str]) -> None:
    from core.store import DEFAULT_DB
    from suite.commands.common import fail
    from suite.readfloor import (BASELINES, OURS, bound_lines, floor_lines, floor_policies, parse_sizes,
                                 sizes_from_records, speedup_bounds)

    size_list = None
    if sizes:
        try:
            size_list = parse_sizes(sizes)
        except ValueError as exc:
            fail(str(exc))
    baselines = tuple(b.strip() for b in over.split(",") if b.strip()) if over else BASELINES
    if over and not baselines:
        fail(f"--over {over!r} names no backend; write e.g. flashinfer-bf16-tc,trtllm-xqa-fp8.")
    use_store = bool(bound or run or db)
    db = db or DEFAULT_DB
    run_id = base_id = None
    ours_recs: list = []
    base_recs: list = []
    if use_store:
        run_id, ours_recs, base_id, base_recs = _store_records(db, run, baseline_run)
    curve: dict[str, Any]
    if floor_from:
        curve = load_floor(floor_from)
        source = str(floor_from)
    else:
        if size_list is None and run_id is not None:
            size_list = sizes_from_records(ours_recs)
            if not size_list:
                fail(f"run {run_id} in {db} holds no passed record of {', '.join(OURS)} with its bytes; "
                     "pass --sizes, or a --run that does.")
        # L2 kept cold per size as the run's records of that size were timed (the sweep decides
        # by shape, which a byte count does not name); sizes without records: by size
        policies = floor_policies(ours_recs) if run_id is not None else None
        curve = _measure_floor(gpu, size_list, quick, rounds, policies)
        source = "measured now"
        for line in floor_lines(curve):
            typer.echo(line)
    result: dict[str, Any] = curve
    if bound:
        res = speedup_bounds(ours_recs, base_recs, curve, baselines=baselines)
        typer.echo(f"ours: run {run_id}; baselines: run {base_id} ({db}); floor: {source}, "
                   f"{curve.get('gpu_name') or 'GPU unnamed'}")
        for line in bound_lines(res, _targets(res["geomeans"])):
            typer.echo(line)
        result = {"ours_run": run_id, "baseline_run": base_id, "db": str(db), "floor_source": source,
                  **res, "floor": curve}
    if out:
        out.write_text(json.dumps(result, indent=2, default=str))
        typer.echo(f"wrote {out}")
    if bound and not result.get("geomeans"):
        raise typer.Exit(1)
