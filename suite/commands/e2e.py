"""`foscar-bench e2e`: whole decode steps of a Llama-3-shaped model with each KV cache format:
step latency, tokens/s, the attention share, capacity at a memory budget, and a logits check."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Optional

import typer

NO_GPU_LINE = (
    "No CUDA GPU is visible here, so nothing can be timed: run `foscar-bench e2e` on a Hopper GPU, "
    "or `foscar-bench report --bundled` to see the bundled results."
)
# 70B-class weights leave this share of the GPU to KV and activations when they are cut to fewer layers.
KV_SHARE_WHEN_CUT = 0.5


class InputError(ValueError):
    """A bad command-line value: one sentence, exit code 2."""


def _ints(text: str, name: str) -> list[int]:
    from suite.cases import parse_int_list

    try:
        values = parse_int_list(text) or []
    except ValueError:
        raise InputError(f"{name} {text!r} is not a comma list of integers (k = 1024), e.g. 1,8,32 or 4k,32k.") from None
    if not values or any(v <= 0 for v in values):
        raise InputError(f"{name} {text!r} must list positive integers.")
    return values


def _backends(text: str) -> list:
    from baselines.base import get_backend
    from baselines.growing import GROWERS

    chosen = []
    served = sorted(f"{f}/{k}" for f, k in GROWERS)
    for name in [p.strip() for p in text.split(",") if p.strip()]:
        try:
            backend = get_backend(name)
        except KeyError as exc:
            raise InputError(str(exc.args[0])) from None
        if (backend.family, getattr(backend, "kv_format", "")) not in GROWERS:
            raise InputError(
                f"backend {name!r} has no growing cache for the decode loop; expected one of "
                "flashinfer-bf16-tc, trtllm-xqa-fp8, foscar-int4, foscar-int2 "
                f"(family/format served: {', '.join(served)}).")
        chosen.append(backend)
    if not chosen:
        raise InputError("--backends names no backend; expected e.g. flashinfer-bf16-tc,foscar-int4.")
    return chosen


def _layers_that_fit(shape, total_bytes: int, echo) -> "object":
    """All layers when the weights leave room for KV; else the most that leave KV_SHARE_WHEN_CUT free."""
    if shape.weight_bytes() <= (1 - KV_SHARE_WHEN_CUT) * total_bytes:
        return shape
    one = shape.with_layers(1)
    outside = one.weight_bytes() - 2 * shape.layer_params()
    n = int(((1 - KV_SHARE_WHEN_CUT) * total_bytes - outside) // (2 * shape.layer_params()))
    if n < 1:
        raise InputError(f"not even one layer of {shape.name} fits beside a KV cache on this GPU.")
    cut = shape.with_layers(min(n, shape.num_layers))
    echo(f"{shape.name}: all {shape.num_layers} layers' BF16 weights ({shape.weight_bytes() / 1e9:.0f} GB) leave "
         f"too little of this GPU's {total_bytes / 1e9:.0f} GB for a KV cache; running {cut.num_layers} of "
         f"{shape.num_layers} layers, labelled '{cut.label}'. Its step times and tokens/s are for those layers only; "
         "pass --layers to choose.")
    return cut


def register(app: typer.Typer) -> None:
    @app.command("e2e")
    def e2e(
        model: str = typer.Option("llama3-8b", "--model", help="llama3-8b | llama3-70b (| tiny, for CPU tests)."),
        layers: Optional[int] = typer.Option(None, "--layers", help="Run this many layers (default: all that fit)."),
        backends: str = typer.Option(",".join(("flashinfer-bf16-tc", "trtllm-xqa-fp8", "foscar-int4", "foscar-int2")),
                                     "--backends", "-b", help="KV formats: the suite's backends, comma list."),
        batch: str = typer.Option("1,8,32,128", "--batch", help="Batch sizes of the grid."),
        kv_len: str = typer.Option("4k,32k,128k", "--kv-len", help="Context length of every sequence (k = 1024)."),
        steps: int = typer.Option(32, "--steps", help="Timed decode steps per point (plus as many without attention)."),
        grid: bool = typer.Option(True, "--grid/--no-grid", help="Time every batch x KV length that fits."),
        capacity: bool = typer.Option(True, "--capacity/--no-capacity", help="Largest batch per format at each KV length, and its tokens/s."),
        check: bool = typer.Option(True, "--check/--no-check", help="Logits against float64 attention, once per format."),
        budget_gb: Optional[float] = typer.Option(None, "--budget-gb", help="Memory for KV and activations (GB). "
                                                  "Default: the GPU's free memory after the weights, less 2 GiB."),
        seed: int = typer.Option(0, "--seed"),
        db: Path = typer.Option(Path("results/foscar.sqlite"), "--db", help="Results store (its e2e tables)."),
        json_out: Optional[Path] = typer.Option(None, "--json", help="Also write this run's records to a JSON file."),
        merge: Optional[Path] = typer.Option(None, "--merge", help="Copy the e2e runs of this store into --db, then exit."),
        cpu: bool = typer.Option(False, "--cpu", hidden=True, help="Run on the CPU through the kernel emulator (tests)."),
    ) -> None:
        """Decode steps of a Llama-3-shaped model per KV format. Example: foscar-bench e2e --db out.sqlite"""
        echo = lambda line: typer.echo(line, err=True)  # noqa: E731 - progress on stderr
        if merge is not None:
            _merge(merge, db)
            return
        try:
            from suite.e2e.model import model_shape

            shape = model_shape(model)
            chosen = _backends(backends)
            batches, kv_lens = _ints(batch, "--batch"), _ints(kv_len, "--kv-len")
            if steps < 1:
                raise InputError(f"--steps {steps} must be at least 1.")
            if layers is not None:
                shape = shape.with_layers(layers)
            if budget_gb is not None and not math.isfinite(budget_gb):
                raise InputError(f"--budget-gb {budget_gb} is not a finite number of GB; pass a positive number "
                                 "such as 40, or leave it out for the GPU's free memory.")
            if budget_gb is not None and budget_gb <= 0:
                raise InputError(f"--budget-gb {budget_gb} must be positive.")
            if not (grid or capacity or check):
                raise InputError("--no-grid, --no-capacity and --no-check together leave nothing to run; "
                                 "drop at least one of them.")
            if cpu and shape.name != "tiny":
                raise InputError(f"--cpu runs only --model tiny (the kernel emulator is slow); got {model!r}.")
        except (InputError, ValueError) as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2)
        import torch

        if not cpu and not torch.cuda.is_available():
            typer.echo(NO_GPU_LINE, err=True)
            raise typer.Exit(1)
        device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
        try:
            records, run_id = _run(shape, layers, chosen, batches, kv_lens, steps, grid, capacity, check,
                                   budget_gb, seed, db, json_out, device, echo)
        except InputError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2)
        _summary(records, echo)
        typer.echo(f"e2e run {run_id}: {len(records)} records in {db}"
                   + (f" and {json_out}" if json_out else "") + "; `foscar-bench report --db "
                   f"{db}` shows them.")


def _run(shape, layers, chosen, batches, kv_lens, steps, grid, capacity, check, budget_gb, seed, db, json_out,
         device, echo):
    import torch

    from suite.e2e import bench as B
    from suite.e2e.model import Weights
    from core.e2e_store import E2EStore
    from suite.commands.common import write_json
    from suite.envinfo import collect

    if device.type == "cuda" and layers is None:
        shape = _layers_that_fit(shape, torch.cuda.get_device_properties(device).total_memory, echo)
    t0 = time.time()
    weights = Weights(shape, device, seed)
    echo(f"{shape.label}: {weights.nbytes() / 1e9:.1f} GB of seeded random BF16 weights on {device} "
         f"({time.time() - t0:.1f} s)")
    bench = B.Bench(device=device, shape=shape, weights=weights, gpu=B.gpu_info(device), seed=seed, progress=echo)
    config = {"model": shape.name, "num_layers": shape.num_layers, "backends": [b.name for b in chosen],
              "batch": batches, "kv_len": kv_lens, "steps": steps, "grid": grid, "capacity": capacity,
              "check": check, "budget_gb": budget_gb, "seed": seed}
    store = E2EStore(db)
    run_id = store.start_run(argv=sys.argv, config=config, env=collect(use_torch=device.type == "cuda"))
    records: list[dict] = []
    plan = ([("check", b, None, None) for b in chosen] if check else [])
    # Capacity before the grid: if a time limit cuts the run, the serving question is answered first.
    if capacity:
        plan += [("capacity", b, None, kv) for kv in kv_lens for b in chosen]
    if grid:
        plan += [("grid", b, n, kv) for kv in kv_lens for n in batches for b in chosen]
    budget = None
    for i, (mode, backend, n, kv) in enumerate(plan, start=1):
        if mode != "check" and budget is None:
            budget = int(budget_gb * 1e9) if budget_gb else B.kv_budget_bytes(bench)
            echo(f"memory budget for KV and activations: {budget / 1e9:.1f} GB")
        t = time.time()
        if mode == "check":
            rec = B.check(bench, backend)
        elif mode == "grid":
            rec = B.measure(bench, backend, n, kv, steps, budget_bytes=budget)
        else:
            rec = B.capacity(bench, backend, kv, steps, budget)
        store.add(run_id, rec)
        records.append(rec)
        if json_out is not None:  # rewritten after every point: a run cut short leaves what it measured
            write_json(json_out, {"run_id": run_id, "config": config, "records": records})
        echo(f"[{i}/{len(plan)}] {_line(rec)} ({time.time() - t:.1f} s)")
    store.close()
    return records, run_id


def _line(rec: dict) -> str:
    what = f"{rec['mode']} {rec['backend']} batch {rec.get('batch')} KV {rec.get('kv_len')}"
    if rec["status"] != "passed":
        return f"{what}: {rec['status']}: {rec.get('reason', '')}"
    if rec["mode"] == "check":
        return (f"{what}: logits rel. L2 {rec['logits_rel_error']:.2e} <= {rec['logits_tolerance']:.3g} "
                f"(attention a no-op: {rec['noattn_logits_rel_error']:.2e}), top-1 {100 * rec['top1_agreement']:.0f}%")
    return (f"{what}: step {rec['step_median_us'] / 1e3:.2f} ms (p10-p90 {rec['step_p10_us'] / 1e3:.2f}-"
            f"{rec['step_p90_us'] / 1e3:.2f}), {rec['tokens_per_s']:,.0f} tok/s, attention "
            f"{100 * rec['attn_share']:.0f}%")


def _summary(records: list[dict], echo) -> None:
    import pandas as pd

    from reports import e2e as report

    df = report.latest(pd.DataFrame([{**r, "run_id": "this", "started_at": "", "id": i, "git_sha": None}
                                     for i, r in enumerate(records)]))
    lines = report.ratios(df)
    if lines:
        echo("capacity (tokens/s at the largest batch each format holds):")
        for line in lines:
            echo("  " + line)
        echo(f"  the paper (SGLang, served): {report.PAPER_SERVING}. {report.HONESTY}")


def _merge(src: Path, dst: Path) -> None:
    from core.e2e_store import E2EStore, read_tables

    if not src.is_file():
        typer.echo(f"--merge {src}: no such store file.", err=True)
        raise typer.Exit(2)
    if read_tables(src).runs.empty:
        typer.echo(f"--merge {src}: the file holds no e2e runs.", err=True)
        raise typer.Exit(2)
    with E2EStore(dst) as store:
        runs, recs = store.merge_from(src)
    typer.echo(f"merged {runs} e2e run(s), {recs} record(s) from {src} into {dst}")
