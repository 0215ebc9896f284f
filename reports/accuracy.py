"""Figure 5: each backend's error against the float64 reference beside its quantization's own error."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from reports import catalog, paper
from reports.plotting import new_figure

BARS = (("rel_error", -0.2, "", "kernel output vs float64 reference"),
        ("quant_rel_error", 0.2, "//", "quantized cache vs source (quantization alone)"))


def accuracy(records: pd.DataFrame):
    """Grouped bars (median, whiskers min..max) on a log axis; None when no errors recorded."""
    have = records[(records["rel_error"] > 0) | (records["quant_rel_error"] > 0)]
    if have.empty:
        return None
    groups = sorted(have.groupby(["backend", "bits"], dropna=False), key=lambda kv: catalog.sort_key(kv[0][0]))
    positive = have[["rel_error", "quant_rel_error"]].where(lambda v: v > 0).stack()
    floor = 10 ** np.floor(np.log10(float(positive.min()) / 3))
    fig, axes = new_figure(width=max(6.0, 0.75 * len(groups) + 2.5), height=4.8)
    ax = axes[0][0]
    failed_any = False
    for i, ((backend, _), g) in enumerate(groups):
        n_failed = int(g["status"].isin(catalog.GATE_FAILED).sum())
        if n_failed:  # a red X over the kernel's bar, with how many of its records failed
            failed_any = True
            worst = float(g["rel_error"].max()) if (g["rel_error"] > 0).any() else floor * 3
            ax.scatter([i + BARS[0][1]], [worst * 2.2], **catalog.FAILED_MARK)
            ax.annotate(f"{n_failed}/{len(g)}", (i + BARS[0][1], worst * 2.2), xytext=(0, 6),
                        textcoords="offset points", ha="center", fontsize=6.5, color="red")
        for col, offset, hatch, _ in BARS:
            vals = g[col][g[col] > 0]
            if vals.empty:
                exact = (g[col] == 0).any()
                ax.text(i + offset, floor * 1.4, "0" if exact else "n/a", ha="center", fontsize=7)
                continue
            med = float(vals.median())
            ax.bar(i + offset, med, width=0.38, color=catalog.color(backend), hatch=hatch,
                   edgecolor="black", linewidth=0.5)
            ax.errorbar(i + offset, med, yerr=[[med - vals.min()], [vals.max() - med]],
                        color="black", capsize=2, linewidth=0.8)
    handles = [Patch(facecolor="white", edgecolor="black", hatch=h, label=name) for _, _, h, name in BARS]
    target, _ = paper.lookup("targets", "accuracy", "rel_error", "foscar-int*")
    if target:
        ax.axhline(target, color="red", linestyle="--", linewidth=1)
        handles.append(Line2D([], [], color="red", linestyle="--",
                              label=f"target for our kernels: {target:.0e} (reports/data/paper.csv: targets)"))
    if failed_any:
        handles.append(Line2D([], [], linestyle="none", marker="X", color="red", markersize=7,
                              label="failed the accuracy gate (failed/records; listed below)"))
    ax.set_yscale("log")
    ax.set_ylim(floor, max(1.0, float(positive.max()) * 3) * (8 if failed_any else 1))
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels([catalog.label(b) + ("" if pd.isna(bits) else f"\n{bits:.0f}-bit")
                        for (b, bits), _ in groups], rotation=40, ha="right", fontsize=7.5)
    ax.set_ylabel("relative L2 error (dimensionless)")
    ax.set_title("Output error per backend (solid) and error of its quantization alone (hatched)")
    # beside the axes, never over a bar
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5)
    fig.tight_layout()
    return fig
