"""`foscar-bench env`: the GPUs, driver, CUDA and library versions this machine offers."""
from __future__ import annotations

import json

import typer


def _fmt(value, unit: str = "", scale: float = 1.0, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and scale != 1.0:
        value = value / scale
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def render(env: dict) -> str:
    lines = [
        f"host {env['host']}  python {env['python']}  driver {_fmt(env.get('driver_version'))}"
        f"  CUDA (driver) {_fmt(env.get('cuda_driver_version'))}",
        "libraries: " + ", ".join(f"{k} {v or '-'}" for k, v in env["libraries"].items()),
    ]
    if not env["gpus"]:
        lines.append(f"No GPU: {env.get('no_gpu', 'none visible')}.")
        return "\n".join(lines)
    for i, g in enumerate(env["gpus"]):
        lines += [
            f"GPU {i}: {g.get('name')}  {g.get('uuid') or ''}",
            f"  SMs {_fmt(g.get('sm_count'))}  compute capability {_fmt(g.get('capability'))}"
            f"  memory {_fmt(g.get('total_memory_bytes'), ' GB', 1e9, 1)}"
            f"  L2 {_fmt(g.get('l2_bytes'), ' MB', 1e6, 1)}",
            f"  memory bus {_fmt(g.get('memory_bus_width_bits'))} bit at max {_fmt(g.get('max_mem_clock_mhz'))} MHz"
            f"  ->  bus-derived peak {_fmt(g.get('bus_peak_tbps'), ' TB/s')}"
            f"  (datasheet {_fmt(g.get('datasheet_peak_tbps'), ' TB/s')})",
            f"  SM clock max {_fmt(g.get('max_sm_clock_mhz'))} MHz, now "
            f"{_fmt((g.get('clocks_now') or {}).get('sm_clock_mhz'))} MHz; throttle reasons "
            f"{', '.join((g.get('clocks_now') or {}).get('throttle_reasons') or []) or 'none'}",
        ]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("env")
    def env(
        as_json: bool = typer.Option(False, "--json", help="Print the same as one JSON object."),
    ) -> None:
        """GPUs (NVML: name, UUID, SMs, bus width, memory clock, bus-derived and datasheet
        peak bandwidth, L2), driver and CUDA versions, and torch/triton/flashinfer versions."""
        from suite.envinfo import collect

        info = collect(use_torch=True)
        if as_json:
            typer.echo(json.dumps(info, indent=2, default=str))
        else:
            typer.echo(render(info))
