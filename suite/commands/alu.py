"""`foscar-bench alu`: instructions per KV element, statically from SASS (`--static`, no GPU)
or from Nsight Compute counters for one case of any backend (`--backend`), with the DRAM
bytes read set against the byte model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

# The exit code when --backend profiled nothing: every backend's ncu run failed.
NOTHING_PROFILED = 3


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _parse_loop(text: str | None) -> tuple[int, int] | str:
    if not text:
        return "auto"
    try:
        start, end = (int(x, 16) for x in text.split(":"))
    except ValueError:
        raise typer.BadParameter(f"--loop {text!r}: expected START:END in hex, e.g. 0x14c0:0xbfa0.")
    return start, end


def run_static(
    *, arch: str, cubin: Path | None, kernel: str | None, elems: float | None,
    tensor_per_iter: float | None, scope: str, marker: bool, loop: str | None,
) -> list[dict]:
    """Static rows: from --cubin with the caller's numbers, else from foscar.build.build."""
    from suite.alu import ours, sass

    if cubin is not None:
        results = sass.static_alu(
            cubin, kernel, elems, scope=scope, tensor_per_iter=tensor_per_iter,
            loop=_parse_loop(loop), marker=marker, arch=arch,
        )
        names = ours.demangle([r.kernel for r in results])
        return [{"name": names.get(r.kernel, r.kernel), **r.as_dict()} for r in results]
    try:
        from foscar.build import build
    except ImportError as exc:
        raise sass.SassError(f"foscar.build is not importable ({exc}); pass --cubin PATH.") from exc
    result = build(arch)
    return [{"name": name, **counts.as_dict()} for name, counts in
            ours.analyze_build(result, kernel, arch=arch, scope=scope)]


def short_name(name: str) -> str:
    """'void foscar::foscar_decode_kernel<4, 128, 32, true, false, false>(foscar::DecodeParams)'
    -> 'foscar_decode_kernel<4, 128, 32, true, false, false>'."""
    name = name.split("(")[0]
    name = name[5:] if name.startswith("void ") else name
    head, sep, tail = name.partition("<")
    return head.rsplit("::", 1)[-1] + sep + tail


def _static_table(rows: list[dict]):
    from rich.table import Table

    table = Table(title="static SASS counts (main loop per thread; per element = / KV elements per trip; "
                        "local = STL/LDL in the loop / in the whole kernel)")
    for col in ("kernel", "loop", "insts", "alu", "fma", "xu", "tensor", "mem", "ctl", "unif",
                "local", "elems", "ALU/elem", "inst/elem"):
        table.add_column(col, justify="left" if col in ("kernel", "loop") else "right")
    for r in rows:
        c = r["by_class"]
        loop = f"{r['loop'][0]:#x}-{r['loop'][1]:#x}" if r.get("loop") else "kernel"
        table.add_row(
            short_name(r["name"]), loop, str(r["n_instructions"]), str(c["alu"]), str(c["fma"]), str(c["xu"]),
            str(c["tensor"]), str(c["memory"]), str(c["control"]), str(c["uniform"]),
            f"{r.get('local_in_body', 0)}/{r.get('local_in_kernel', 0)}",
            _fmt(r.get("elems_per_body"), 0), _fmt(r.get("alu_per_elem")), _fmt(r.get("inst_per_elem")),
        )
    return table


def _dynamic_table(rows: list[dict]):
    from rich.table import Table

    table = Table(title="Nsight Compute, per KV element (thread-level ALU; pipe mix in issue slots)")
    for col in ("backend", "status", "ALU/elem", "ALU issue", "inst/elem", "static ALU", "pipe mix",
                "DRAM/model", "us/step"):
        table.add_column(col, justify="left" if col in ("backend", "status", "pipe mix") else "right")
    for r in rows:
        f = r.get("figures") or {}
        mix = f.get("pipe_mix") or {}
        top = sorted(((p, m.get("per_elem") or 0.0) for p, m in mix.items() if p not in ("fmaheavy", "fmalite")),
                     key=lambda pm: -pm[1])[:5]
        ratio = f.get("dram_model_ratio")
        flag = " !" if f.get("dram_flag") else ""
        table.add_row(
            r["backend"], r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')[:60]}",
            _fmt(f.get("alu_per_elem")), _fmt(f.get("alu_issue_per_elem")), _fmt(f.get("inst_per_elem")),
            _fmt(r.get("alu_static_per_elem")), " ".join(f"{p}={v:.2f}" for p, v in top) or "-",
            (_fmt(ratio) + flag) if ratio is not None else "-", _fmt(f.get("time_us"), 1),
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command("alu")
    def alu(
        static: bool = typer.Option(False, "--static", help="Count SASS of the built kernels (no GPU)."),
        arch: str = typer.Option("sm_90a", "--arch", help="SM target to build and disassemble."),
        cubin: Optional[Path] = typer.Option(None, "--cubin", help="Analyse this cubin/.so/fatbin instead of the FOSCAR build."),
        kernel: Optional[str] = typer.Option(None, "--kernel", help="Regex on kernel names (mangled or demangled)."),
        elems: Optional[float] = typer.Option(None, "--elems", help="KV elements one main-loop trip consumes per thread (with --cubin)."),
        tensor_per_iter: Optional[float] = typer.Option(None, "--tensor-per-iter", help="Tensor instructions one source iteration issues (gives the unroll)."),
        scope: str = typer.Option("loop", "--scope", help="loop (main loop) or kernel (whole kernel)."),
        marker: bool = typer.Option(False, "--marker", help="Pick the main loop between PMTRIG markers (asm volatile(\"pmevent N;\"))."),
        loop: Optional[str] = typer.Option(None, "--loop", help="Main loop address range START:END (hex), as listed by --static."),
        backend: Optional[str] = typer.Option(None, "--backend", "-b", help="Backends to profile under ncu, comma list."),
        batch: int = typer.Option(128, "--batch"),
        kv_len: int = typer.Option(32768, "--kv-len"),
        bits: int = typer.Option(4, "--bits"),
        k_mode: str = typer.Option("channel", "--k-mode"),
        v_mode: str = typer.Option("token", "--v-mode"),
        group_size: int = typer.Option(128, "--group-size"),
        model: str = typer.Option("llama3-8b", "--model"),
        page_size: int = typer.Option(64, "--page-size"),
        seed: int = typer.Option(0, "--seed"),
        warmup: int = typer.Option(3, "--warmup", help="Decode steps before the profiled ones."),
        iters: int = typer.Option(2, "--iters", help="Decode steps profiled (figures are per step)."),
        kernel_regex: Optional[str] = typer.Option(None, "--kernel-regex", help="Profile only kernels matching this regex."),
        replay_mode: Optional[str] = typer.Option(None, "--replay-mode", help="ncu replay mode: kernel (default) or application."),
        timeout: float = typer.Option(1800.0, "--timeout", help="Seconds one ncu run may take."),
        run: Optional[str] = typer.Option(None, "--run", help="Store the figures into this run's records."),
        db: Path = typer.Option(Path("results/foscar.sqlite"), "--db", help="Results store (SQLite)."),
        json_out: Optional[Path] = typer.Option(None, "--json-out", help="Write every figure as JSON here."),
        ncu_log: Optional[Path] = typer.Option(None, "--ncu-log", help="Keep each ncu run's full output in this folder."),
    ) -> None:
        """ALU and all instructions per KV element, the pipe mix and DRAM bytes vs the byte
        model. Examples: foscar-bench alu --static; foscar-bench alu -b foscar-int4,foscar-int2
        --batch 128 --kv-len 32768 --run RUN. Exit 3 when no backend could be profiled (ncu
        missing or unusable, no kernel seen), 2 for bad input."""
        from rich.console import Console

        from foscar.build import BuildError
        from suite.alu.sass import SassError
        from suite.commands.common import fail

        console = Console(width=max(Console().width, 150))
        if not static and not backend:
            raise typer.BadParameter("pass --static, or --backend NAME[,NAME] to profile under ncu.")
        chosen = _check_dynamic(backend, run, db) if backend else []
        out: dict[str, Any] = {}
        if static:
            try:
                rows = run_static(arch=arch, cubin=cubin, kernel=kernel, elems=elems,
                                  tensor_per_iter=tensor_per_iter, scope=scope, marker=marker, loop=loop)
            except (SassError, OSError) as exc:
                console.print(f"[red]static analysis failed:[/red] {exc}")
                raise typer.Exit(1)
            except BuildError as exc:
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                more = f" (`foscar-bench build --arch {arch}` shows the whole log)" if len(lines) > 1 else ""
                fail(f"--arch {arch}: {lines[0]}{more}", 1)
            out["static"] = rows
            console.print(_static_table(rows))
            for r in rows:
                for note in r.get("notes") or []:
                    console.print(f"  [yellow]{r['name'][:60]}[/yellow]: {note}")
        if backend:
            out["dynamic"] = run_dynamic(
                chosen, console=console, arch=arch, case_fields=dict(
                    batch=batch, kv_len=kv_len, bits=bits, k_mode=k_mode, v_mode=v_mode,
                    group_size=group_size, model=model, page_size=page_size, seed=seed),
                warmup=warmup, iters=iters, kernel_regex=kernel_regex, replay_mode=replay_mode,
                timeout=timeout, run=run, db=db, ncu_log=ncu_log,
            )
            console.print(_dynamic_table(out["dynamic"]))
        if json_out:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(out, indent=1, default=str))
            console.print(f"wrote {json_out}")
        failed = [r for r in out.get("dynamic", []) if r["status"] != "ok"]
        if failed and len(failed) == len(out["dynamic"]):
            why = sorted({r["status"] for r in failed})
            fail(f"no backend could be profiled ({', '.join(why)}: {failed[0].get('reason') or 'see the table'}); "
                 "fix that and run it again.", NOTHING_PROFILED)


def _check_dynamic(names: str, run: str | None, db: Path) -> list:
    """The backends --backend names, and --run in --db, checked before anything is profiled:
    a bad one is one line and exit 2."""
    from baselines.base import select_backends
    from core.store import ResultStore, StoreError
    from suite.commands.common import fail

    listed = [n.strip() for n in names.split(",") if n.strip()]
    if not listed:
        fail(f"--backend {names!r} names no backend; expected a comma list such as foscar-int4,foscar-int2.")
    try:
        chosen = select_backends(listed)
    except KeyError as exc:
        fail(f"--backend {names}: {exc.args[0]}")
    if run:
        if not db.is_file():
            fail(f"--db {db} does not exist; sweep run {run} into it first, or pass the --db it went to.")
        try:
            with ResultStore(db, readonly=True) as store:
                known = store.has_run(run)
        except StoreError as exc:
            fail(str(exc))
        if not known:
            fail(f"--run {run!r} is not in {db}; `foscar-bench results --runs --db {db}` lists its runs.")
    return chosen


def make_case(fields: dict) -> Any:
    from core.case import MODELS, Case

    if fields["model"] not in MODELS:
        raise typer.BadParameter(f"--model {fields['model']!r}: expected one of {sorted(MODELS)}.")
    hq, hkv, d = MODELS[fields["model"]]
    return Case(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, **fields)


def run_dynamic(backends: list, *, console: Any, arch: str, case_fields: dict, warmup: int, iters: int,
                kernel_regex: str | None, replay_mode: str | None, timeout: float,
                run: str | None, db: Path, ncu_log: Path | None = None) -> list[dict]:
    """Profiles each backend on the case; adds the static figure for our kernels; stores."""
    from suite.alu.ncu import ProfileResult, own_case, profile_case

    case = make_case(case_fields)
    rows = []
    for backend in backends:
        own = own_case(backend, case) or case
        console.print(f"profiling {backend.name} on {own.key} under ncu ...")
        res = profile_case(backend, own, warmup=warmup, iters=iters, kernel_regex=kernel_regex,
                           timeout_s=timeout, replay_mode=replay_mode,
                           log_path=ncu_log / f"{backend.name}.log" if ncu_log else None)
        res["alu_static_per_elem"] = _static_for(backend, own, arch, console)
        rows.append(res)
        if run:
            _store(db, run, res, console, ProfileResult)
    return rows


def _static_for(backend: Any, case: Any, arch: str, console: Any) -> float | None:
    if getattr(backend, "family", "") != "foscar":
        return None
    try:
        from foscar.build import build

        from suite.alu.ours import static_for_backend

        counts = static_for_backend(backend, case, build(arch))
        return counts.alu_per_elem if counts else None
    except Exception as exc:  # noqa: BLE001 - the dynamic figures stand on their own
        console.print(f"  [yellow]no static figure for {backend.name}:[/yellow] {exc}")
        return None


def _store(db: Path, run: str, res: dict, console: Any, result_cls: Any) -> None:
    from core.store import ResultStore, StoreError
    from suite.commands.common import fail

    fields = result_cls(**{k: res[k] for k in result_cls.__dataclass_fields__}).store_fields()
    fields["alu_static_per_elem"] = res.get("alu_static_per_elem")
    if not db.is_file():
        fail(f"--db {db} does not exist; sweep run {run} into it first, or pass the --db it went to.")
    try:
        with ResultStore(db) as store:
            changed = store.update_record(run, res["case_key"], res["backend"], **fields)
    except StoreError as exc:
        fail(str(exc))
    if not changed:
        console.print(f"  [yellow]run {run} has no record of {res['backend']} on {res['case_key']}; "
                      "sweep it first (figures not stored).[/yellow]")
