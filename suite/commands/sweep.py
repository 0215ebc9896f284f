"""`foscar-bench sweep`: expand a preset and axes into cases, meet every backend, check
each against the float64 reference, time it, and store the records."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

# The exit code of a sweep that measured nothing: every item it ran ended in one of these.
NOTHING_RAN = 3
LOST_STATUSES = ("crashed", "timeout")

NO_GPU_LINE = (
    "No CUDA GPU is visible here, so nothing can be timed: `foscar-bench sweep --dry-run` "
    "lists the cases, and `foscar-bench report --bundled` shows the bundled H200 results."
)


# The axes with options of their own below; any other axis of core.case.Case is taken as
# `--NAME V1,V2` (its field name with dashes), so a new field of Case needs no code here.
NAMED_AXES = ("batch", "kv_len", "bits", "k_mode", "v_mode", "group_size", "page_size", "seed")


def _other_axes_help() -> str:
    from core.case import axes

    others = [name for name in axes() if name not in NAMED_AXES]
    if not others:
        return "Every field of core.case.Case is an axis; a new one is taken as --NAME V1,V2."
    return "Other axes: " + ", ".join(f"--{n.replace('_', '-')}" for n in others) + " (comma lists)."


def register(app: typer.Typer) -> None:
    @app.command("sweep", epilog=_other_axes_help(),
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def sweep(
        ctx: typer.Context,
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
        page_size: Optional[str] = typer.Option(None, "--page-size", help="Tokens per page (quantized formats round up to a group)."),
        seed: Optional[str] = typer.Option(None, "--seed"),
        backends: Optional[str] = typer.Option(None, "--backends", "-b", help="Comma list; 'flashinfer-*' matches a prefix. Default: all."),
        gpus: Optional[str] = typer.Option(None, "--gpus", help="CUDA indices, e.g. 0,1. Default: every visible GPU."),
        db: Path = typer.Option(Path("results/foscar.sqlite"), "--db", help="Results store (SQLite)."),
        resume: Optional[str] = typer.Option(None, "--resume", help="Continue run RUN: skip its finished cases (items no worker ever took run again)."),
        shard: Optional[str] = typer.Option(None, "--shard", help="Run shard I of N (I from 0) of the expanded items, e.g. 3/8: one per host; `results merge` joins the stores."),
        run_id: Optional[str] = typer.Option(None, "--run-id", help="Name the run (e.g. one id for every shard of a job array); continues it if the store already holds it with the same settings."),
        dry_run: bool = typer.Option(False, "--dry-run", help="List the cases and exit."),
        list_backends: bool = typer.Option(False, "--list-backends", help="List backends and whether they can run here."),
        case_timeout: float = typer.Option(900.0, "--case-timeout", help="Seconds before a case is recorded `timeout` (its kernels' build is timed apart)."),
        build_timeout: float = typer.Option(1800.0, "--build-timeout", help="Seconds a backend may take to build or load its kernels (a JIT compile) before its first case."),
        read_ceiling: bool = typer.Option(True, "--read-ceiling/--no-read-ceiling", help="Measure the streaming-read ceiling once per GPU."),
        ceiling_from: Optional[Path] = typer.Option(None, "--ceiling-from", help="Use the read ceiling a `foscar-bench ceiling --json F` run measured on this GPU model instead of searching again."),
        cpu: bool = typer.Option(False, "--cpu", hidden=True, help="Run workers on the CPU (tests the harness only)."),
        progress: bool = typer.Option(True, "--progress/--no-progress"),
    ) -> None:
        """Run a sweep. Example: foscar-bench sweep --preset paper --db out.sqlite. A case
        that fails is recorded with its status and the sweep goes on (exit 0); exit 3 when
        every item it ran ended crashed or timeout (no worker could start, say), 2 for bad
        input."""
        from rich.console import Console

        from baselines.base import all_backends, select_backends
        from core.store import ResultStore, StoreError
        from suite.cases import expand, make_spec, parse_int_list, parse_str_list, unpaired
        from suite.sweep import parse_shard, plan_items, shard_items

        console = Console()
        if list_backends:
            _print_backends(console, all_backends())
            return
        named = dict(batch=batch, kv_len=kv_len, bits=bits, k_mode=k_mode, v_mode=v_mode,
                     group_size=group_size, page_size=page_size, seed=seed)
        # Everything the command line says is checked before a GPU or the store is looked at.
        try:
            axes = {**_parse_axes(named, parse_int_list, parse_str_list), **_extra_axes(ctx.args)}
            axes.update(models=parse_str_list(model, "--model"), num_q_heads=num_q_heads,
                        num_kv_heads=num_kv_heads, head_dim=head_dim)
            backend_names = parse_str_list(backends, "--backends")
            shard_ix = parse_shard(shard)
            gpu_list = _parse_gpus(gpus)
            done: set[str] = set()
            if resume:
                with ResultStore(db, readonly=True) as past:
                    if not past.has_run(resume):
                        raise ValueError(f"run {resume!r} is not in {db}; `foscar-bench results --runs --db {db}` lists runs.")
                    config = past.run_info(resume)["config"]
                    done = past.finished_keys(resume)
                given = ([k for k, v in axes.items() if v is not None] + (["backends"] if backend_names else [])
                         + (["preset"] if preset else []) + (["shard"] if shard else [])
                         + (["run-id"] if run_id else []))
                if given:
                    console.print(f"[yellow]--resume uses the run's own axes, backends and shard; "
                                  f"ignoring {', '.join(given)}.")
                spec = make_spec(None, **config["spec"])
                backend_names = config["backends"]
                shard_ix = parse_shard(config.get("shard"))
            else:
                spec = make_spec(preset, **axes)
            chosen = select_backends(backend_names or spec.backends)
            cases = expand(spec)
            items = plan_items(cases, chosen)
            if not items:
                raise ValueError(f"no backend pairs with any case of this sweep: {'; '.join(unpaired(cases, chosen))}; "
                                 "change --bits, --k-mode/--v-mode or --backends.")
            if shard_ix:
                items = shard_items(items, *shard_ix)
            config = {"spec": spec.as_dict(), "backends": [b.name for b in chosen], "preset": preset}
            if shard_ix:
                config["shard"] = f"{shard_ix[0]}/{shard_ix[1]}"
            continuing = False
            if run_id and not resume and db.is_file():
                with ResultStore(db, readonly=True) as past:
                    if past.has_run(run_id):
                        _check_same_sweep(past.run_info(run_id)["config"], config, run_id, db)
                        done = past.finished_keys(run_id)
                        continuing = True
        except (ValueError, KeyError, StoreError) as exc:
            typer.echo(str(exc.args[0] if exc.args else exc), err=True)
            raise typer.Exit(2)

        if dry_run:
            _print_items(console, items, done)
            return
        if not items:
            console.print(f"shard {shard_ix[0]}/{shard_ix[1]} of this sweep holds no item; nothing to run "
                          "(no run is recorded).")
            return
        devices = _devices(gpu_list, gpus, cpu)
        try:
            store = ResultStore(db)
        except StoreError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2)
        from suite.envinfo import collect
        from suite.summary import latest_per_item, summary_table
        from suite.sweep import SweepOptions, run_sweep

        config = {**config, "devices": devices}
        if continuing:
            console.print(f"run {run_id} is in {db} already: continuing it")
        run_id = store.start_run(argv=sys.argv, config=config, env=collect(use_torch=False), run_id=resume or run_id)
        log_dir = db.parent / "logs" / run_id
        console.print(
            f"run {run_id}: {len(items)} items ({len({i.case.key for i in items})} cases x backends) "
            f"on {', '.join('cpu' if d == 'cpu' else 'cuda:' + d for d in devices)}; store {db}"
        )
        ceiling = None
        if ceiling_from:
            try:
                ceiling = json.loads(ceiling_from.read_text())
            except (OSError, ValueError) as exc:
                typer.echo(f"--ceiling-from {ceiling_from}: not a ceiling JSON ({exc}); write one with "
                           "`foscar-bench ceiling --json F`.", err=True)
                raise typer.Exit(2)
        options = SweepOptions(devices=devices, case_timeout_s=case_timeout, build_timeout_s=build_timeout,
                               read_ceiling=read_ceiling and not cpu, ceiling=ceiling,
                               log_dir=str(log_dir))
        try:
            outcome = run_sweep(store=store, run_id=run_id, items=items, options=options, console=console, progress=progress)
        except KeyboardInterrupt:
            console.print(f"\n[yellow]interrupted; what was recorded is kept. Resume with: "
                          f"foscar-bench sweep --resume {run_id} --db {db}")
            raise typer.Exit(130)
        df = store.records(run_id)
        console.print(summary_table(df, title=f"run {run_id}"))
        counts = latest_per_item(df).groupby("status").size().to_dict() if not df.empty else {}
        console.print(
            "status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            + f"   (worker logs: {log_dir})\n"
            f"all fields: foscar-bench results --run {run_id} --db {db} --json"
        )
        if outcome.written and set(outcome.counts) <= set(LOST_STATUSES):
            typer.echo(f"none of the {outcome.written} item(s) this sweep ran was measured (each ended "
                       f"{' or '.join(sorted(outcome.counts))}); read the worker logs in {log_dir}, then "
                       f"`foscar-bench sweep --resume {run_id} --db {db}`.", err=True)
            raise typer.Exit(NOTHING_RAN)


def _check_same_sweep(old: dict, new: dict, run_id: str, db) -> None:
    """A named run is continued only by the sweep that began it (same axes, backends, shard);
    the refusal names each value that differs, the run's and this sweep's."""
    diff = []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    for key in sorted(set(old_spec) | set(new_spec)):
        if old_spec.get(key) != new_spec.get(key):
            diff.append(f"{key} {old_spec.get(key)} there, {new_spec.get(key)} here")
    for key in ("backends", "shard"):
        if old.get(key) != new.get(key):
            diff.append(f"{key} {old.get(key)} there, {new.get(key)} here")
    if diff:
        raise ValueError(f"run {run_id} in {db} was started with other settings ({'; '.join(diff)}); "
                         "give a new --run-id, or --resume it to run its own settings.")


def _parse_axes(named: dict, parse_int_list, parse_str_list) -> dict:
    """The named axis options as lists of their Case field's type."""
    from core.case import axes

    kinds = {name: kind for name, (kind, _) in axes().items()}
    return {name: (parse_int_list if kinds[name] is int else parse_str_list)(text, f"--{name.replace('_', '-')}")
            for name, text in named.items()}


def _extra_axes(args: list[str]) -> dict:
    """`--NAME V1,V2` for an axis of Case without an option of its own; anything else left
    on the command line is one error naming it."""
    from core.case import axes
    from suite.cases import parse_int_list, parse_str_list

    kinds = {name: kind for name, (kind, _) in axes().items() if name not in NAMED_AXES}
    out: dict = {}
    rest = list(args)
    while rest:
        word = rest.pop(0)
        name = word[2:].split("=")[0].replace("-", "_") if word.startswith("--") else None
        if name not in kinds:
            known = ", ".join(f"--{n.replace('_', '-')}" for n in kinds) or "none beyond those in --help"
            raise ValueError(f"sweep does not take {word!r}; see `foscar-bench sweep --help` (other axes: {known}).")
        text = word.split("=", 1)[1] if "=" in word else (rest.pop(0) if rest else None)
        if text is None:
            raise ValueError(f"{word} needs a value, e.g. {word} 1,2.")
        out[name] = (parse_int_list if kinds[name] is int else parse_str_list)(text, word.split("=")[0])
    return out


def _parse_gpus(gpus: str | None) -> list[str] | None:
    """--gpus as CUDA indices, each once (two workers on one GPU would time each other);
    None: every visible GPU. A bad list is one ValueError naming it."""
    if gpus is None:
        return None
    chosen = [g.strip() for g in gpus.split(",") if g.strip()]
    if not chosen:
        raise ValueError(f"--gpus {gpus!r} names no GPU; expected CUDA indices such as 0,1, or leave --gpus out "
                         "for every visible GPU.")
    index = [str(int(g)) if g.isdigit() else g for g in chosen]  # 0 and 00 are one GPU
    twice = sorted({g for g in index if index.count(g) > 1})
    if twice:
        raise ValueError(f"--gpus {gpus}: index {', '.join(twice)} is given more than once; expected each CUDA "
                         f"index once (one worker per GPU), e.g. --gpus {','.join(dict.fromkeys(index))}.")
    return index


def _devices(chosen: list[str] | None, gpus: str | None, cpu: bool) -> list[str]:
    from suite.envinfo import visible_gpu_count

    if cpu:
        return ["cpu"]
    n = visible_gpu_count()
    if n == 0:
        typer.echo(NO_GPU_LINE)
        raise typer.Exit(1)
    if chosen is not None:
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
               else {16: "bf16", 8: "fp8", 4: "fp4"}.get(c.bits, str(c.bits))) + c.extra_key.replace("-", " ")
        table.add_row(str(it.item_id), it.backend.name, str(c.batch), str(c.kv_len),
                      f"{c.num_q_heads}/{c.num_kv_heads}", str(c.head_dim), fmt, str(c.page_size),
                      "yes" if it.key in done else "")
    console.print(table)


def _local_gpu():
    """The first visible GPU's description, or None on a machine without one."""
    from suite.envinfo import visible_gpu_count

    if visible_gpu_count() == 0:
        return None
    try:
        from core.gpu import GpuInfo

        return GpuInfo.from_torch(0)
    except Exception:  # noqa: BLE001 - NVML sees a GPU that torch cannot use: none here
        return None


def here_reason(backend, gpu) -> str | None:
    """Why `backend` cannot run on this machine (None: it can, on a paper-sized case): its
    library, a GPU it needs, then what it says of such a case on this GPU."""
    from core.case import Case
    from core.gpu import GpuInfo

    reason = backend.available()
    if reason:
        return reason
    if backend.needs_cuda and gpu is None:
        return "needs a CUDA GPU; none is visible here."
    case = backend.case_for(Case(batch=1, kv_len=4096, bits=backend.bits if backend.bits in (2, 4) else 4))
    return backend.case_reason(case, gpu or GpuInfo.cpu()) if case is not None else None


def _print_backends(console, backends) -> None:
    from rich.table import Table
    from rich.text import Text

    gpu = _local_gpu()
    table = Table(pad_edge=False, box=None, header_style="bold")
    for col in ("backend", "family", "bits", "tol", "here", "what"):
        table.add_column(col, no_wrap=col != "what", overflow="fold")
    notes = []
    for b in backends:
        reason = here_reason(b, gpu)
        if reason:
            notes.append(Text(f"{b.name}: {reason}", overflow="fold"))
        table.add_row(b.name, b.family, str(b.bits or "case"), f"{b.tolerance:g}", "no" if reason else "yes",
                      b.description)
    console.print(table)
    for n in notes:
        console.print(n)
