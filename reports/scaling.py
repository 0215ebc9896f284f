"""Figure 4: latency and fraction of bus-peak bandwidth against KV length and batch, per backend and width."""
from __future__ import annotations

import pandas as pd

from reports import catalog
from reports.plotting import kv_label, new_figure, plain_log_ticks


def _pick(values: list, most: int = 4) -> list:
    """At most `most` values, spread evenly and always keeping the ends."""
    values = sorted(values)
    if len(values) <= most:
        return values
    step = (len(values) - 1) / (most - 1)
    return [values[round(i * step)] for i in range(most)]


def main_shape(records: pd.DataFrame) -> tuple | None:
    """The (num_q_heads, num_kv_heads, head_dim) most records share."""
    counts = records.groupby(["num_q_heads", "num_kv_heads", "head_dim"]).size()
    return None if counts.empty else counts.idxmax()


def scaling(records: pd.DataFrame, x: str):
    """x = 'kv_len' (panels per batch) or 'batch' (panels per KV length); None when no data."""
    ok = records[(records["status"] == "passed") & (records["median_us"] > 0)]
    shape = main_shape(ok)
    if shape is None:
        return None, ""
    ok = ok[(ok["num_q_heads"] == shape[0]) & (ok["num_kv_heads"] == shape[1]) & (ok["head_dim"] == shape[2])]
    panel = "batch" if x == "kv_len" else "kv_len"
    panels = _pick(ok[panel].unique().tolist())
    series = ok.groupby(["backend", "bits", panel, x], as_index=False, dropna=False)[
        ["median_us", "frac_peak_bus"]].median()
    if series.groupby(["backend", "bits", panel]).size().max() < 2:
        return None, ""
    widths = series.groupby("backend")["bits"].nunique()
    fig, axes = new_figure(ncols=len(panels), nrows=2, width=3.1 * len(panels) + 1.8, height=6.0,
                           sharex=True)
    for col, value in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        part = series[series[panel] == value]
        for (backend, bits), g in sorted(part.groupby(["backend", "bits"], dropna=False),
                                         key=lambda kv: catalog.sort_key(kv[0][0])):
            g = g.sort_values(x)
            name = catalog.label(backend) + (f", {bits:.0f}-bit" if widths.get(backend, 1) > 1 else "")
            style = dict(color=catalog.color(backend), marker="o", markersize=3, linewidth=1.3,
                         linestyle="-" if catalog.is_ours(backend) else "--")
            top.plot(g[x], g["median_us"], label=name if col == 0 else None, **style)
            bottom.plot(g[x], 100 * g["frac_peak_bus"], **style)
        title = f"batch {int(value)}" if panel == "batch" else f"KV {kv_label(value)} tokens"
        top.set_title(title)
        top.set_yscale("log")
        plain_log_ticks(top)
        bottom.set_ylim(0, 105)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ticks = sorted(series[x].unique())
            ax.set_xticks(ticks)
            ax.set_xticklabels([kv_label(t) if x == "kv_len" else str(int(t)) for t in ticks],
                               rotation=45 if len(ticks) > 5 else 0)
        bottom.set_xlabel("KV length (tokens per sequence)" if x == "kv_len" else "batch (sequences)")
    axes[0][0].set_ylabel("kernel time, median (µs)")
    axes[1][0].set_ylabel("effective bandwidth (% of bus-derived peak)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.02 + 0.035 * legend_rows, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, bbox_to_anchor=(0.5, 0.0))
    shape_text = f"{int(shape[0])} query / {int(shape[1])} KV heads, d = {int(shape[2])}"
    return fig, shape_text
