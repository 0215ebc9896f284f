"""Figures 3a (bandwidth vs bytes per KV element, HBM and issue roofs) and 3b (classic FLOP/s roofline)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter

from reports import catalog, tables
from reports.gpu import GpuFacts
from reports.plotting import new_figure

HBM_STYLES = {"datasheet peak": ":", "bus-derived peak": "-", "measured read ceiling": "--"}


def kv_elements(records: pd.DataFrame) -> pd.Series:
    """K plus V elements one decode step reads."""
    return 2 * records["batch"] * records["kv_len"] * records["num_kv_heads"] * records["head_dim"]


def alu_figures(records: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """backend -> (ALU instructions per KV element, 'measured' | 'static SASS count')."""
    out = {}
    for backend, g in records.groupby("backend"):
        measured = g["alu_per_elem"].dropna()
        static = g["alu_static_per_elem"].dropna()
        if len(measured):
            out[backend] = (float(measured.median()), "measured")
        elif len(static):
            out[backend] = (float(static.median()), "static SASS count")
    return out


def _points(records: pd.DataFrame) -> pd.DataFrame:
    ok = records[(records["status"] == "passed") & (records["bytes"] > 0) & (records["eff_bandwidth_tbps"] > 0)].copy()
    ok["bytes_per_elem"] = ok["bytes"] / kv_elements(ok)
    return ok


def _marked(points: pd.DataFrame) -> pd.DataFrame:
    """Per backend, the point to label: batch 128 / KV 32K when present, else its largest case."""
    head = tables.headline(points)
    rest = points[~points["backend"].isin(set(head["backend"]))]
    largest = rest.sort_values("bytes").groupby("backend").tail(1)
    return pd.concat([head.sort_values("eff_bandwidth_tbps").groupby("backend").tail(1), largest])


def bandwidth_vs_bytes(records: pd.DataFrame, facts: GpuFacts):
    """Figure 3a, or None when no passed record has bytes and a bandwidth."""
    points = _points(records)
    if points.empty:
        return None
    fig, axes = new_figure(width=8.2, height=5.2)
    ax = axes[0][0]
    for backend, g in sorted(points.groupby("backend"), key=lambda kv: catalog.sort_key(kv[0])):
        ax.scatter(g["bytes_per_elem"], g["eff_bandwidth_tbps"], s=10, alpha=0.3, color=catalog.color(backend))
    marked = _marked(points)
    marked = marked.iloc[sorted(range(len(marked)), key=lambda i: catalog.sort_key(marked["backend"].iloc[i]))]
    for _, r in marked.iterrows():
        ax.scatter(r["bytes_per_elem"], r["eff_bandwidth_tbps"], s=70, color=catalog.color(r["backend"]),
                   edgecolor="black", linewidth=0.6, zorder=5, label=catalog.label(r["backend"]))
    x = np.geomspace(0.12, 3.0, 200)
    top = float(points["eff_bandwidth_tbps"].max())
    _hbm_lines(ax, facts)
    top = max([top, *facts.hbm_roofs().values()])
    if facts.alu_rate:
        _issue_roofs(ax, records, facts, x)
    ax.set_xscale("log")
    ax.set_xlim(0.12, 3.0)
    ax.set_ylim(0, top * 1.25)
    ax.xaxis.set_major_locator(FixedLocator([0.125, 0.25, 0.5, 1, 2]))
    ax.xaxis.set_major_formatter(FixedFormatter(["0.125", "0.25", "0.5", "1", "2"]))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("bytes read per KV element (B/element; codes, scales, offsets, tails, Q/O, page table)")
    ax.set_ylabel("effective bandwidth (TB/s, decimal)")
    ax.set_title(f"Effective bandwidth against bytes per KV element: {facts.name}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
              title="points: batch 128, KV 32K (else largest case)\nlines: instruction-issue roofs",
              title_fontsize=7.5)
    return fig


def _hbm_lines(ax, facts: GpuFacts) -> None:
    """Horizontal HBM roofs, labels nudged apart when two roofs nearly coincide."""
    last = None
    for name, tbps in sorted(facts.hbm_roofs().items(), key=lambda kv: kv[1]):
        ax.axhline(tbps, color="black", linestyle=HBM_STYLES.get(name, "-"), linewidth=1)
        below = last is not None and tbps - last < 0.25
        ax.annotate(f"HBM {name}: {tbps:.2f} TB/s", (1.0, tbps), xycoords=("axes fraction", "data"),
                    xytext=(-4, 10 if below else 2), textcoords="offset points", ha="right",
                    va="bottom", fontsize=7.5)
        last = tbps


def _issue_roofs(ax, records: pd.DataFrame, facts: GpuFacts, x: np.ndarray) -> None:
    """Per kernel with an ALU figure: bandwidth = ALU rate / ALU per element x bytes per element."""
    points = _points(records)
    # the paper's Hopper kernel needs 1.00 ALU/element (FOSCAR.md section 4): where that
    # roof crosses the HBM roofs is why INT2 (0.28 B/elem) is harder than INT4 (0.53)
    int2 = points[points["bits"] == 2]["bytes_per_elem"]
    at = float(int2.median()) if len(int2) else 0.28  # INT2, group 128, fp16 scale and offset
    ax.plot(x, facts.alu_rate * x / 1e12, color="gray", linestyle="-.", linewidth=1,
            label=f"1.00 ALU/elem (paper's H100 kernel): {facts.alu_rate * at / 1e12:.2f} TB/s at {at:.2f} B/elem")
    for backend, (alu, kind) in sorted(alu_figures(records).items(), key=lambda kv: catalog.sort_key(kv[0])):
        if alu <= 0:
            continue
        mine = points[points["backend"] == backend]
        if len(mine):
            at = float(mine["bytes_per_elem"].median())
        else:  # no timed point (e.g. incorrect): its bytes per element still place the roof
            rows = records[(records["backend"] == backend) & records["bytes"].notna()]
            if not len(rows):
                continue
            at = float((rows["bytes"] / kv_elements(rows)).median())
        roof_at = facts.alu_rate / alu * at / 1e12
        ax.plot(x, facts.alu_rate / alu * x / 1e12, color=catalog.color(backend), linestyle="-.",
                linewidth=1.2, label=f"{catalog.label(backend)}: {alu:.2f} ALU/elem ({kind}) "
                f"-> {roof_at:.2f} TB/s at {at:.2f} B/elem")
        ax.scatter([at], [roof_at], marker="x", s=40, color=catalog.color(backend), zorder=6)


def classic(records: pd.DataFrame, facts: GpuFacts):
    """Figure 3b, or None when no passed record has FLOPs, bytes and a time."""
    ok = records[(records["status"] == "passed") & (records["flops"] > 0) & (records["bytes"] > 0)
                 & (records["median_us"] > 0)].copy()
    if ok.empty:
        return None
    ok["intensity"] = ok["flops"] / ok["bytes"]
    ok["tflops"] = ok["flops"] / (ok["median_us"] * 1e-6) / 1e12
    fig, axes = new_figure(width=8.2, height=5.2)
    ax = axes[0][0]
    for backend, g in sorted(ok.groupby("backend"), key=lambda kv: catalog.sort_key(kv[0])):
        ax.scatter(g["intensity"], g["tflops"], s=16, alpha=0.7, color=catalog.color(backend),
                   label=catalog.label(backend))
    lo = min(0.5, float(ok["intensity"].min()) / 2)
    hi = max(2000.0, float(ok["intensity"].max()) * 4)
    x = np.geomspace(lo, hi, 200)
    ceilings = facts.compute_ceilings()
    top = max([float(ok["tflops"].max())] + [c / 1e12 for c in ceilings.values()])
    for name, flops in ceilings.items():
        ax.axhline(flops / 1e12, color="dimgray", linewidth=1)
        ax.text(lo * 1.1, flops / 1e12 * 1.08, f"{name}: {flops / 1e12:.0f} TFLOP/s", fontsize=7.5)
    for name, tbps in facts.hbm_roofs().items():
        y = tbps * x
        keep = y <= top * 2.5
        ax.plot(x[keep], y[keep], color="black", linestyle=HBM_STYLES.get(name, "-"), linewidth=1,
                label=f"memory diagonal, HBM {name}: {tbps:.2f} TB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(float(ok["tflops"].min()) / 3, lo * 0.5), top * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax.set_ylabel("attained throughput (TFLOP/s)")
    ax.set_title(f"Roofline: {facts.name}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if not ceilings:
        ax.text(0.98, 0.02, "compute ceilings unknown for this GPU (no SM count/clock)",
                transform=ax.transAxes, ha="right", fontsize=7.5)
    return fig
