"""Figure 4: latency and fraction of bus-peak bandwidth against KV length and batch, per backend and width."""
from __future__ import annotations

import pandas as pd
from matplotlib.lines import Line2D

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
    """x = 'kv_len' (panels per batch) or 'batch' (panels per KV length); None when no data.
    A point whose records were all flagged (timed, check failed) is hollow; a record that
    failed the gate untimed is a red X on the panel's x axis."""
    ok = catalog.timed(records)
    shape = main_shape(ok)
    if shape is None:
        return None, ""
    same_shape = lambda df: df[(df["num_q_heads"] == shape[0]) & (df["num_kv_heads"] == shape[1])  # noqa: E731
                               & (df["head_dim"] == shape[2])]
    ok = same_shape(ok).assign(flagged=lambda d: d["status"] != "passed")
    failed = same_shape(catalog.failed_untimed(records))
    panel = "batch" if x == "kv_len" else "kv_len"
    panels = _pick(ok[panel].unique().tolist())
    series = ok.groupby(["backend", "bits", panel, x], as_index=False, dropna=False).agg(
        median_us=("median_us", "median"), frac_peak_bus=("frac_peak_bus", "median"), flagged=("flagged", "all"))
    if series.groupby(["backend", "bits", panel]).size().max() < 2:
        return None, ""
    widths = series.groupby("backend")["bits"].nunique()
    fig, axes = new_figure(ncols=len(panels), nrows=2, width=3.1 * len(panels) + 1.8, height=6.0,
                           sharex=True)
    named: set = set()
    for col, value in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        part = series[series[panel] == value]
        for (backend, bits), g in sorted(part.groupby(["backend", "bits"], dropna=False),
                                         key=lambda kv: catalog.sort_key(kv[0][0])):
            g = g.sort_values(x)
            name = catalog.label(backend) + (f", {bits:.0f}-bit" if widths.get(backend, 1) > 1 else "")
            style = dict(color=catalog.color(backend), marker="o", markersize=3, linewidth=1.3,
                         linestyle="-" if catalog.is_ours(backend) else "--")
            top.plot(g[x], g["median_us"], label=None if name in named else name, **style)
            named.add(name)
            bottom.plot(g[x], 100 * g["frac_peak_bus"], **style)
            hollow = g[g["flagged"]]
            for ax, ys in ((top, hollow["median_us"]), (bottom, 100 * hollow["frac_peak_bus"])):
                ax.scatter(hollow[x], ys, s=40, facecolor="white", edgecolor=catalog.color(backend), linewidth=1.5,
                           zorder=4)
        bad = failed[failed[panel] == value]
        for ax in (top, bottom):
            catalog.draw_failed(ax, bad[x], bad["backend"])
        title = f"batch {int(value)}" if panel == "batch" else f"KV {kv_label(value)} tokens"
        top.set_title(title)
        top.set_yscale("log")
        plain_log_ticks(top)
        bottom.set_ylim(0, 105)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ticks = sorted(set(series[x]) | set(failed[failed[panel].isin(panels)][x]))
            ax.set_xlim(ticks[0] / 1.4, ticks[-1] * 1.4)
            ax.set_xticks(ticks)
            ax.set_xticklabels([kv_label(t) if x == "kv_len" else str(int(t)) for t in ticks],
                               rotation=45 if len(ticks) > 5 else 0)
        bottom.set_xlabel("KV length (tokens per sequence)" if x == "kv_len" else "batch (sequences)")
    axes[0][0].set_ylabel("kernel time, median (µs)")
    axes[1][0].set_ylabel("bandwidth (% of bus-derived peak)")
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.append(h)
            labels.append(lab)
    if len(failed[failed[panel].isin(panels)]):
        handles.append(catalog.failed_handle())
        labels.append(catalog.FAILED_LABEL)
    if series["flagged"].any():
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="black"))
        labels.append(catalog.FLAGGED_LABEL)
    legend_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.02 + 0.035 * legend_rows, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, bbox_to_anchor=(0.5, 0.0))
    shape_text = f"{int(shape[0])} query / {int(shape[1])} KV heads, d = {int(shape[2])}"
    return fig, shape_text
