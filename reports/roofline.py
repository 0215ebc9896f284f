"""Figures 3a (bandwidth vs bytes per KV element, HBM and issue roofs) and 3b (classic FLOP/s roofline).

Every record with a time is a point (a flagged one hollow); a record that failed the
accuracy gate without a time is a red X on the x axis at its bytes per element (3a) or
intensity (3b): nothing that ran is left out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter

from reports import catalog, tables
from reports.gpu import GpuFacts
from reports.plotting import new_figure, place_labels, plain_log_ticks

HBM_STYLES = {"datasheet peak": ":", "bus-derived peak": "-", "measured read ceiling": "--"}
LABEL_FONT = 7.5


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
    ok = catalog.timed(records)
    ok = ok[(ok["bytes"] > 0) & (ok["eff_bandwidth_tbps"] > 0)].copy()
    ok["bytes_per_elem"] = ok["bytes"] / kv_elements(ok)
    return ok


def _failed(records: pd.DataFrame) -> pd.DataFrame:
    bad = catalog.failed_untimed(records)
    bad = bad[bad["bytes"] > 0].copy()
    bad["bytes_per_elem"] = bad["bytes"] / kv_elements(bad)
    return bad


def _marked(points: pd.DataFrame) -> pd.DataFrame:
    """Per backend, the point to label: batch 128 / KV 32K when present, else its largest case."""
    head = tables.headline(points)
    rest = points[~points["backend"].isin(set(head["backend"]))]
    largest = rest.sort_values("bytes").groupby("backend").tail(1)
    return pd.concat([head.sort_values("eff_bandwidth_tbps").groupby("backend").tail(1), largest])


def _scatter(ax, g: pd.DataFrame, x: str, y: str, color: str, **kw) -> None:
    """Points of one backend; flagged ones (timed, check failed) hollow."""
    flagged = g["status"] != "passed"
    if (~flagged).any():
        ax.scatter(g.loc[~flagged, x], g.loc[~flagged, y], color=color, **kw)
    if flagged.any():
        kw = {k: v for k, v in kw.items() if k != "label"}
        ax.scatter(g.loc[flagged, x], g.loc[flagged, y], facecolor="none", edgecolor=color, linewidth=1.5, **kw)


def _failed_on_axis(ax, xs: pd.Series, backends: pd.Series, handles: list) -> None:
    """X markers on the x axis for records that failed the gate untimed."""
    if len(xs):
        catalog.draw_failed(ax, xs, backends)
        handles.append(catalog.failed_handle())


def bandwidth_vs_bytes(records: pd.DataFrame, facts: GpuFacts):
    """Figure 3a, or None when no record has bytes and a bandwidth."""
    points = _points(records)
    if points.empty:
        return None
    fig, axes = new_figure(width=8.2, height=5.2)
    ax = axes[0][0]
    for backend, g in sorted(points.groupby("backend"), key=lambda kv: catalog.sort_key(kv[0])):
        _scatter(ax, g, "bytes_per_elem", "eff_bandwidth_tbps", catalog.color(backend), s=10, alpha=0.3)
    marked = _marked(points)
    marked = marked.iloc[sorted(range(len(marked)), key=lambda i: catalog.sort_key(marked["backend"].iloc[i]))]
    for _, r in marked.iterrows():
        _scatter(ax, pd.DataFrame([r]), "bytes_per_elem", "eff_bandwidth_tbps", catalog.color(r["backend"]),
                 s=70, zorder=5, label=catalog.label(r["backend"]), **({"edgecolor": "black", "linewidth": 0.6}
                                                                      if r["status"] == "passed" else {}))
    x = np.geomspace(0.12, 3.0, 200)
    top = max([float(points["eff_bandwidth_tbps"].max()), *facts.hbm_roofs().values()])
    if facts.alu_rate:
        _issue_roofs(ax, records, facts, x)
    ax.set_xscale("log")
    ax.set_xlim(0.12, 3.0)
    ax.set_ylim(0, top * 1.25)
    _hbm_lines(ax, facts)
    ax.xaxis.set_major_locator(FixedLocator([0.125, 0.25, 0.5, 1, 2]))
    ax.xaxis.set_major_formatter(FixedFormatter(["0.125", "0.25", "0.5", "1", "2"]))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("bytes read per KV element (B/element; codes, scales, offsets, tails, Q/O, page table)")
    ax.set_ylabel("effective bandwidth (TB/s, decimal)")
    ax.set_title(f"Effective bandwidth against bytes per KV element: {facts.name}")
    handles, _ = ax.get_legend_handles_labels()
    failed = _failed(records)
    _failed_on_axis(ax, failed["bytes_per_elem"], failed["backend"], handles)
    if (points["status"] != "passed").any():
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none",
                              markeredgecolor="black", label=catalog.FLAGGED_LABEL))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
              title="points: batch 128, KV 32K (else largest case)\nlines: instruction-issue roofs",
              title_fontsize=7.5)
    return fig


def _hbm_lines(ax, facts: GpuFacts) -> list:
    """Horizontal HBM roofs, labelled at the left edge; labels of roofs that nearly
    coincide are moved apart (plotting.place_labels) so none overlaps another. Call it
    after the y limits are set. Returns the label artists."""
    roofs = sorted(facts.hbm_roofs().items(), key=lambda kv: kv[1])
    for name, tbps in roofs:
        ax.axhline(tbps, color="black", linestyle=HBM_STYLES.get(name, "-"), linewidth=1)
    fig = ax.figure
    to_px = lambda y: float(ax.transData.transform((1.0, y))[1])  # noqa: E731
    gap_px = 1.35 * LABEL_FONT * fig.dpi / 72
    wanted = [to_px(t) + 2 for _, t in roofs]  # just above each line
    placed = place_labels(wanted, gap_px)
    texts = []
    for (name, tbps), want, at in zip(roofs, wanted, placed):
        texts.append(ax.annotate(
            f"HBM {name}: {tbps:.2f} TB/s", (0.0, tbps), xycoords=("axes fraction", "data"),
            xytext=(4, 2 + (at - want) * 72 / fig.dpi), textcoords="offset points", ha="left", va="bottom",
            fontsize=LABEL_FONT, bbox=dict(facecolor="white", alpha=0.75, edgecolor="none", pad=0.3)))
    return texts


def _issue_roofs(ax, records: pd.DataFrame, facts: GpuFacts, x: np.ndarray) -> None:
    """Per kernel with an ALU figure: bandwidth = ALU rate / ALU per element x bytes per element."""
    points = _points(records)
    # the paper's Hopper kernel needs 1.00 ALU/element (a shift and a LOP3 per bf16x2): where that
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
    """Figure 3b, zoomed to the data, or None when no record has FLOPs, bytes and a time."""
    ok = catalog.timed(records)
    ok = ok[(ok["flops"] > 0) & (ok["bytes"] > 0)].copy()
    if ok.empty:
        return None
    ok["intensity"] = ok["flops"] / ok["bytes"]
    ok["tflops"] = ok["flops"] / (ok["median_us"] * 1e-6) / 1e12
    fig, axes = new_figure(width=8.2, height=5.2)
    ax = axes[0][0]
    for backend, g in sorted(ok.groupby("backend"), key=lambda kv: catalog.sort_key(kv[0])):
        _scatter(ax, g, "intensity", "tflops", catalog.color(backend), s=16, alpha=0.8, label=catalog.label(backend))
    lo, hi = float(ok["intensity"].min()) / 2, float(ok["intensity"].max()) * 2
    bottom = float(ok["tflops"].min()) / 3
    roofs = facts.hbm_roofs()
    top = max(float(ok["tflops"].max()) * 3, max(roofs.values(), default=0) * lo * 1.5)
    x = np.geomspace(lo, hi, 200)
    ceilings = facts.compute_ceilings()
    above = []
    for name, flops in ceilings.items():
        if flops / 1e12 > top:
            above.append(f"{name} {flops / 1e12:.0f} TFLOP/s")
            continue
        ax.axhline(flops / 1e12, color="dimgray", linewidth=1)
        ax.text(lo * 1.1, flops / 1e12 * 1.05, f"{name}: {flops / 1e12:.0f} TFLOP/s", fontsize=7.5)
    for name, tbps in roofs.items():
        ax.plot(x, tbps * x, color="black", linestyle=HBM_STYLES.get(name, "-"), linewidth=1,
                label=f"memory diagonal, HBM {name}: {tbps:.2f} TB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(bottom, top)
    plain_log_ticks(ax, "x")
    plain_log_ticks(ax, "y")
    ax.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax.set_ylabel("attained throughput (TFLOP/s)")
    ax.set_title(f"Roofline: {facts.name} (zoomed to the measured points)")
    handles, _ = ax.get_legend_handles_labels()
    bad = catalog.failed_untimed(records)
    bad = bad[(bad["flops"] > 0) & (bad["bytes"] > 0)]
    _failed_on_axis(ax, bad["flops"] / bad["bytes"], bad["backend"], handles)
    if above:
        handles.append(Line2D([], [], color="none", label="above the view: " + "; ".join(above)))
    elif not ceilings:
        handles.append(Line2D([], [], color="none", label="compute ceilings unknown for this GPU (no SM count/clock)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
