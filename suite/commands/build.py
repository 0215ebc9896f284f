"""`foscar-bench build`: compile the FOSCAR kernels and show their registers, shared memory and spills."""
from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build_cmd(
        arch: str = typer.Option(None, help="SM target, e.g. sm_90a; default: the GPU present, else sm_90a."),
        force: bool = typer.Option(False, help="Rebuild even if the cache holds this build."),
    ) -> None:
        """Compile the CUDA kernels with nvcc (cached by a hash of sources, flags and arch)."""
        from foscar.build import BuildError, build, detect_arch

        target = arch or detect_arch() or "sm_90a"
        console = Console()
        try:
            result = build(target, force=force)
        except BuildError as exc:
            console.print(f"[red]build failed:[/red] {exc}")
            raise typer.Exit(1)
        table = Table(title=f"libfoscar.so for {result.arch} ({'cached' if result.cached else 'built'}, key {result.key})")
        for col in ("kernel", "registers", "smem KB", "stack B", "spill st B", "spill ld B"):
            table.add_column(col, justify="left" if col == "kernel" else "right")
        smem = result.smem_bytes()
        spilled = []
        for res in result.resources:
            style = "red" if res.spills else None
            kb = f"{smem[res.name] / 1024:.1f}" if smem.get(res.name, -1) > 0 else "-"
            table.add_row(_label(res.name), str(res.registers), kb, str(res.stack_bytes), str(res.spill_store_bytes),
                          str(res.spill_load_bytes), style=style)
            if res.spills and "decode_kernel" in res.name:
                spilled.append(res.name)
        console.print(table)
        console.print(f"library: {result.so_path}")
        if spilled:
            console.print(f"[bold red]WARNING: {len(spilled)} hot decode kernel(s) spill registers to local "
                          "memory; see the red rows.[/bold red]")


def _label(name: str) -> str:
    """'decode int4 g128 K channel V token' for a decode kernel (', 2 KV heads per item' for a
    paired one); other names as they are."""
    from foscar.build import decode_template_args

    args = decode_template_args(name)
    if args is None:
        return name.replace("foscar::", "")
    bits, group, kch, vch, deq, heads = args
    mode = lambda flag: "channel" if flag else "token"  # noqa: E731
    pair = ", 2 KV heads per item" if heads == 2 else ""
    return f"decode int{bits} g{group} K {mode(kch)} V {mode(vch)}{' (dequant)' if deq else ''}{pair}"
