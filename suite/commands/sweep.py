"""`foscar-bench sweep`: expand a preset and axes into cases, meet every backend, check
each against the float64 reference, time it, and store the records."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

NO_GPU_LINE = (
    "No CUDA GPU is visible here, so nothing can be timed: `foscar-bench sweep --dry-run` "
    "lists the cases, and `foscar-bench report --bundled` shows the bundled H200 results."
)


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        preset: Optional[str] = typer.Option(None, "--preset", "-p", help="paper | quick | full, or a TOML path."),
        batch: Optional[str] = typer.Option(None, help="Batch sizes, e.g. 1,8,32,128."),
        kv_len: Optional[str] = typer.Option(None, "--kv-len", help="KV lengths, e.g. 1k,32k,131072."),
        bits: Optional[str] = typer.Option(None, help="Int widths for quantized backends: 2,4."),
        k_mode: Optional[str] = typer.Option(None, "--k-mode", help="token,channel."),
        v_mode: Optional[str] = typer.Option(None, "--v-mode", help="token,channel."),
        group_size: Optional[str] = typer.Option(None, "--group-size", help="32,64,128."),
        model: Optional[str] = typer.Option(None, "--model", help="llama3-8b,llama3-70b."),
        num_q_heads: Optional[int] = typer.Option(None, "--num-q-heads", help="Explicit shape (overrides --model)."),
        num_kv_heads: Optional[int] = typer.Option(None, "--num-kv-heads"),
        head_dim: Optional[int] = typer.Option(None, "--head-dim"),
        page_size: Optional[int] = typer.Option(None, "--page-size", help="Tokens per page (quantized formats round up to a group)."),
        seed: Optional[int] = typer.Option(None, "--seed"),
        backends: Optional[str] = typer.Option(None, "--backends", "-b", help="Comma list; 'flashinfer-*' matches a prefix. Default: all."),
        gpus: Optional[str] = typer.Option(None, "--gpus", help="CUDA indices, e.g. 0,1. Default: every visible GPU."),
        db: Path = typer.Option(Path("results/foscar.sqlite"), "--db", help="Results store (SQLite)."),
        resume: Optional[str] = typer.Option(None, "--resume", help="Continue run RUN: skip its finished cases."),
        shard: Optional[str] = typer.Option(None, "--shard", help="Run shard I of N (I from 0) of the expanded items, e.g. 3/8: one per host; `results merge` joins the stores."),
        run_id: Optional[str] = typer.Option(None, "--run-id", help="Name the run (e.g. one id for every shard of a job array); continues it if the store already holds it with the same settings."),
        dry_run: bool = typer.Option(False, "--dry-run", help="List the cases and exit."),
        list_backends: bool = typer.Option(False, "--list-backends", help="List backends and whether they can run here."),
        case_timeout: float = typer.Option(900.0, "--case-timeout", help="Seconds before a case is recorded `timeout`."),
        read_ceiling: bool = typer.Option(True, "--read-ceiling/--no-read-ceiling", help="Measure the streaming-read ceiling once per GPU."),
        test_backends: bool = typer.Option(False, "--test-backends", help="Also offer the harness's test-only backends (test-crash, ...)."),
        cpu: bool = typer.Option(False, "--cpu", hidden=True, help="Run workers on the CPU (tests the harness only)."),
        progress: bool = typer.Option(True, "--progress/--no-progress"),
    ) -> None:
        """Run a sweep. Example: foscar-bench sweep --preset paper --db out.sqlite"""
        from rich.console import Console

        from baselines.base import TEST_BACKENDS_ENV, all_backends, select_backends
        from suite.cases import expand, make_spec, parse_int_list, parse_str_list
        from suite.store import ResultStore
        from suite.sweep import parse_shard, plan_items, shard_items

        console = Console()
        if test_backends:
            os.environ[TEST_BACKENDS_ENV] = "1"
        if list_backends:
            _print_backends(console, all_backends())
            return
        devices = None if dry_run else _devices(gpus, cpu)
        store = ResultStore(db) if (resume or not dry_run or db.exists()) else None
        axes = dict(
            batch=parse_int_list(batch), kv_len=parse_int_list(kv_len), bits=parse_int_list(bits),
            k_mode=parse_str_list(k_mode), v_mode=parse_str_list(v_mode),
            group_size=parse_int_list(group_size), models=parse_str_list(model),
            num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            page_size=page_size, seed=seed,
        )
        backend_names = parse_str_list(backends)
        try:
            shard_ix = parse_shard(shard)
            if resume:
                if store is None or not store.has_run(resume):
                    raise ValueError(f"run {resume!r} is not in {db}; `foscar-bench results --runs --db {db}` lists runs.")
                config = store.run_info(resume)["config"]
                given = [k for k, v in axes.items() if v is not None] + (["backends"] if backend_names else [])
                if given:
                    console.print(f"[yellow]--resume uses the run's own axes; ignoring {', '.join(given)}.")
                spec = make_spec(None, **config["spec"])
                backend_names = config["backends"]
                shard_ix = parse_shard(config.get("shard"))
                test_backends = test_backends or config.get("test_backends", False)
                if test_backends:
                    os.environ[TEST_BACKENDS_ENV] = "1"
            else:
                spec = make_spec(preset, **axes)
            chosen = select_backends(backend_names)
            items = plan_items(expand(spec), chosen)
            if shard_ix:
                items = shard_items(items, *shard_ix)
        except (ValueError, KeyError) as exc:
            console.print(f"[red]{exc.args[0] if exc.args else exc}")
            raise typer.Exit(2)

        if dry_run:
            done = store.finished_keys(resume) if (store is not None and resume) else set()
            _print_items(console, items, done)
            return
        from suite.envinfo import collect
        from suite.sweep import SweepOptions, run_sweep
        from suite.summary import summary_table

        config = {
            "spec": spec.as_dict(),
            "backends": [b.name for b in chosen],
            "devices": devices,
            "test_backends": test_backends,
            "preset": preset,
        }
        if shard_ix:
            config["shard"] = f"{shard_ix[0]}/{shard_ix[1]}"
        if run_id and not resume and store.has_run(run_id):
            _check_same_sweep(store.run_info(run_id)["config"], config, run_id, db)
            console.print(f"run {run_id} is in {db} already: continuing it")
        run_id = store.start_run(argv=sys.argv, config=config, env=collect(use_torch=False), run_id=resume or run_id)
        log_dir = db.parent / "logs" / run_id
        console.print(
            f"run {run_id}: {len(items)} items ({len({i.case.key for i in items})} cases x backends) "
            f"on {', '.join('cpu' if d == 'cpu' else 'cuda:' + d for d in devices)}; store {db}"
        )
        options = SweepOptions(devices=devices, case_timeout_s=case_timeout, read_ceiling=read_ceiling and not cpu,
                               test_backends=test_backends, log_dir=str(log_dir))
        try:
            outcome = run_sweep(store=store, run_id=run_id, items=items, options=options, console=console, progress=progress)
        except KeyboardInterrupt:
            console.print(f"\n[yellow]interrupted; what was recorded is kept. Resume with: "
                          f"foscar-bench sweep --resume {run_id} --db {db}")
            raise typer.Exit(130)
        df = store.records(run_id)
        console.print(summary_table(df, title=f"run {run_id}"))
        counts = df.groupby("status").size().to_dict() if not df.empty else {}
        console.print(
            "status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            + f"   (worker logs: {log_dir})\n"
            f"all fields: foscar-bench results --run {run_id} --db {db} --json"
        )
        del outcome


def _check_same_sweep(old: dict, new: dict, run_id: str, db) -> None:
    """A named run is continued only by the sweep that began it (same axes, backends, shard)."""
    keys = ("spec", "backends", "shard", "test_backends")
    diff = [k for k in keys if old.get(k) != new.get(k)]
    if diff:
        typer.echo(f"run {run_id} in {db} was started with other {', '.join(diff)}; "
                   "give a new --run-id, or --resume it to run its own settings.", err=True)
        raise typer.Exit(2)


def _devices(gpus: str | None, cpu: bool) -> list[str]:
    from suite.envinfo import visible_gpu_count

    if cpu:
        return ["cpu"]
    n = visible_gpu_count()
    if n == 0:
        typer.echo(NO_GPU_LINE)
        raise typer.Exit(1)
    if gpus:
        chosen = [g.strip() for g in gpus.split(",") if g.strip()]
        bad = [g for g in chosen if not g.isdigit() or int(g) >= n]
        if bad:
            typer.echo(f"--gpus {gpus}: {bad} are not visible CUDA indices; expected 0..{n - 1}.", err=True)
            raise typer.Exit(2)
        return chosen
    return [str(i) for i in range(n)]


def _print_items(console, items, done: set[str]) -> None:
    from rich.table import Table

    table = Table(title=f"{len(items)} items ({len({i.case.key for i in items})} cases)", pad_edge=False,
                  box=None, header_style="bold")
    for col in ("#", "backend", "batch", "kv_len", "heads", "d", "format", "page", "done"):
        table.add_column(col, no_wrap=True)
    for it in items:
        c = it.case
        fmt = (f"int{c.bits} g{c.group_size} k{c.k_mode[0]}v{c.v_mode[0]}" if c.k_mode != "none"
               else {16: "bf16", 8: "fp8", 4: "fp4"}.get(c.bits, str(c.bits)))
        table.add_row(str(it.item_id), it.backend.name, str(c.batch), str(c.kv_len),
                      f"{c.num_q_heads}/{c.num_kv_heads}", str(c.head_dim), fmt, str(c.page_size),
                      "yes" if it.key in done else "")
    console.print(table)


def _print_backends(console, backends) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(pad_edge=False, box=None, header_style="bold")
    for col in ("backend", "family", "bits", "tol", "here", "what"):
        table.add_column(col, no_wrap=col != "what", overflow="fold")
    notes = []
    for b in backends:
        row = b.row()
        here = "yes" if row["available"] == "yes" else "no"
        if here == "no":
            notes.append(Text(f"{row['backend']}: {row['available']}", overflow="fold"))
        table.add_row(row["backend"], row["family"], str(row["bits"]), f"{row['tolerance']:g}", here,
                      row["description"])
    console.print(table)
    for n in notes:
        console.print(n)
