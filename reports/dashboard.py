"""`foscar-bench dashboard`: static site of every (backend, shape) series over commits with noise bands."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from reports import catalog, html, noise, series
from reports.export import write_exports
from reports.plotting import new_figure, plain_log_ticks, save
from reports.report import slug
from reports.source import Results

def steps(per_point: pd.DataFrame, min_change: float) -> pd.DataFrame:
    """Each series' change from one commit to the next it was measured at, with a verdict.

    A series is paired with its own previous measurement, so a commit that did not measure it
    neither hides a change across it nor reads as gone then new; a series first measured after
    the first commit is `new` there, and one never measured after some commit is `gone` at the
    commit after its last."""
    if per_point.empty:
        return pd.DataFrame()
    pts = sorted(per_point["point"].unique())
    labels = per_point.drop_duplicates("point").set_index("point")["point_label"]
    recs = per_point.sort_values("point", kind="stable")
    by_series = recs.groupby(series.SERIES_KEYS, dropna=False)["point"]
    prev, nxt = by_series.shift(1), by_series.shift(-1)
    after = {p: q for p, q in zip(pts, pts[1:])}
    # (from point, to point) -> (BASE rows, HEAD rows): the two measurements of each step
    pairs: dict[tuple, tuple[list, list]] = {}
    for i, (point, before, later) in enumerate(zip(recs["point"], prev, nxt)):
        if pd.notna(before):
            pairs.setdefault((int(before), point), ([], []))[1].append(i)
        elif point != pts[0]:  # first measured here: new
            pairs.setdefault((pts[pts.index(point) - 1], point), ([], []))[1].append(i)
        if pd.notna(later):
            pairs.setdefault((point, int(later)), ([], []))[0].append(i)
        elif point != pts[-1]:  # never measured again: gone at the next commit
            pairs.setdefault((point, after[point]), ([], []))[0].append(i)
    frames = []
    for (frm, to), (base, head) in sorted(pairs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pair = series.pair(recs.iloc[base], recs.iloc[head], min_change)
        pair["from"], pair["to"], pair["to_point"] = labels[frm], labels[to], to
        frames.append(pair)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _band(g: pd.DataFrame, metric: str) -> tuple[pd.Series, pd.Series]:
    if metric == "median_us":
        return g["p10_us"], g["p90_us"]
    # bandwidth = bytes / time: the fast end of the time band is the high end here
    return g["bytes"] / (g["p90_us"] * 1e-6) / 1e12, g["bytes"] / (g["p10_us"] * 1e-6) / 1e12


def _relative(g: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Median, p10, p90 of time as % change from the series' first point."""
    first = g["median_us"].iloc[0]
    return tuple(100 * (g[c] / first - 1) for c in ("median_us", "p10_us", "p90_us"))


def series_figure(shape_recs: pd.DataFrame, shape_steps: pd.DataFrame, labels: list[str], title: str):
    """Three panels over commits: time, time relative to the first commit, bandwidth; one
    line per backend/format with its p10..p90 band shaded; called changes marked."""
    fig, axes = new_figure(ncols=3, width=16, height=4.0)
    timed = shape_recs[(shape_recs["status"] == "passed") & (shape_recs["median_us"] > 0)]
    called = shape_steps[shape_steps["verdict"].isin([noise.SLOWER, noise.FASTER])] \
        if len(shape_steps) else shape_steps
    fmt = timed.apply(series.format_short, axis=1) if len(timed) else pd.Series(dtype=str)
    for (backend, form), g in sorted(timed.groupby(["backend", fmt]), key=lambda kv: catalog.sort_key(kv[0][0])):
        g = g.sort_values("point")
        c = catalog.color(backend)
        panels = ((g["median_us"], *_band(g, "median_us")), _relative(g),
                  (g["eff_bandwidth_tbps"], *_band(g, "eff_bandwidth_tbps")))
        for col, (mid, lo, hi) in enumerate(panels):
            ax = axes[0][col]
            ax.plot(g["point"], mid, marker="o", markersize=3, color=c,
                    label=f"{catalog.label(backend)} ({form})" if col == 0 else None)
            ax.fill_between(g["point"], lo, hi, color=c, alpha=0.2 if col != 1 else 0.08, linewidth=0)
            mine = called[(called["backend"] == backend)
                          & (called.apply(series.format_short, axis=1) == form)] if len(called) else called
            for _, h in mine.iterrows():
                at = g["point"] == h["to_point"]
                if at.any():
                    bad = h["verdict"] == noise.SLOWER
                    up = bad != (col == 2)  # time rises on a regression, bandwidth falls
                    ax.scatter([h["to_point"]], [mid[at].iloc[0]], marker="^" if up else "v", s=70,
                               color="red" if bad else "green", zorder=5, edgecolor="black")
    names = ("kernel time, median (µs)", "time vs first commit (%)", "effective bandwidth (TB/s)")
    for col, name in enumerate(names):
        ax = axes[0][col]
        ax.set_ylabel(name)
        ax.set_title(f"{title}" if col == 0 else name.split(" (")[0])
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7.5)
        ax.set_xlabel("commit (oldest left)")
        ax.set_xlim(-0.5, len(labels) - 0.5)
    axes[0][0].set_yscale("log")
    plain_log_ticks(axes[0][0])
    axes[0][1].axhline(0, color="black", linewidth=0.8)
    # a fixed layout (no tight bbox) draws each figure once: the dashboard has many
    fig.subplots_adjust(left=0.05, right=0.75, bottom=0.22, top=0.92, wspace=0.28)
    fig.legend(loc="center left", bbox_to_anchor=(0.755, 0.5), fontsize=7)
    return fig


def build_dashboard(results: Results, out_dir: Path, min_change: float = 0.02) -> Path:
    """Render the dashboard of every run in `results` into out_dir; returns index.html."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_point = series.per_point(results.records, results.runs)
    pts = series.points(results.runs)
    body = [html.para(f"Store: {results.db}. {len(pts)} commit(s), {len(results.runs)} run(s), "
                      f"{len(results.records)} record(s).", "meta")]
    body.append(html.para(
        f"A change is called slower or faster only when the median time moved by more than "
        f"{100 * min_change:.1f}%, by more than the noise of both sides (95% intervals of the "
        "medians), at SM clocks that agree (reports/noise.py); otherwise it is same or ambiguous. "
        "Shaded: p10..p90 of each point. Triangles mark called changes."))
    if len(pts) < 2:
        body.append(html.note(f"The store holds {len(pts)} commit(s): series need two or more to show change."))
    if per_point.empty:
        body.append(html.note("The store holds no records: nothing to plot."))
    st = steps(per_point, min_change) if len(pts) > 1 and not per_point.empty else pd.DataFrame()
    body += _changes_section(st)
    body += _commits_section(pts)
    exports = write_exports(per_point, out_dir) if not per_point.empty else []
    if exports:
        body.append(html.heading("Exports", "exports"))
        body.append("<ul>" + "".join(f'<li><a href="{e}">{e}</a></li>' for e in exports if "latest" in e) + "</ul>")
        body.append(html.para("Per commit: exports/<commit>-customSmallerIsBetter.json (github-action-benchmark, "
                              "median µs), -customBiggerIsBetter.json (TB/s), -bencher-bmf.json (Bencher BMF).", "meta"))
    body += _series_sections(per_point, st, list(pts["label"]), out_dir)
    index = out_dir / "index.html"
    index.write_text(html.page("FOSCAR benchmark dashboard", body), encoding="utf-8")
    return index


def _changes_section(st: pd.DataFrame) -> list[str]:
    out = [html.heading("Called changes", "changes")]
    called = st[st["verdict"].isin([noise.SLOWER, noise.FASTER]) | st["verdict"].str.startswith("now ")] \
        if len(st) else st
    if called.empty:
        out.append(html.para("No regression, improvement or lost passing case between a series' consecutive "
                             "measurements."))
        return out
    display = pd.DataFrame({
        "from": called["from"], "to": called["to"], "GPU": called["gpu_name"],
        "backend": called["backend"].map(catalog.label),
        "case": called.apply(series.shape_label, axis=1), "format": called.apply(series.format_label, axis=1),
        "BASE µs": called["median_us_base"].map(lambda v: f"{v:.1f}" if pd.notna(v) else ""),
        "HEAD µs": called["median_us_head"].map(lambda v: f"{v:.1f}" if pd.notna(v) else ""),
        "change": called["change"].map(lambda v: f"{100 * v:+.1f}%" if v is not None and pd.notna(v) else ""),
        "noise": called["noise"].map(lambda v: f"±{100 * v:.1f}%" if v is not None and pd.notna(v) else ""),
        "verdict": called["verdict"],
    })
    classes = ["regression" if v != noise.FASTER else "improvement" for v in called["verdict"]]
    out.append(html.table(display, row_classes=classes))
    return out


def _commits_section(pts: pd.DataFrame) -> list[str]:
    if pts.empty:
        return []
    display = pd.DataFrame({"commit": pts["label"], "first run": pts["started_at"],
                            "runs": pts["run_ids"].map(", ".join)})
    return [html.heading("Commits", "commits"), html.table(display)]


def _series_sections(per_point: pd.DataFrame, st: pd.DataFrame, labels: list[str], out_dir: Path) -> list[str]:
    out = []
    if per_point.empty:
        return out
    for gpu, g in per_point.groupby("gpu_name"):
        out.append(html.heading(f"Series on {gpu}", f"series-{slug(gpu)}"))
        for shape, s in g.groupby(series.SHAPE_KEYS):
            title = series.shape_label(s.iloc[0])
            mask = pd.Series(True, index=st.index) if len(st) else None
            if len(st):
                for k, v in zip(series.SHAPE_KEYS, shape):
                    mask &= st[k] == v
                mask &= st["gpu_name"] == gpu
            fig = series_figure(s, st[mask] if len(st) else st, labels, title)
            stem = f"series_{slug(gpu)}_b{int(shape[0])}_kv{int(shape[1])}_h{int(shape[2])}x{int(shape[3])}_d{int(shape[4])}"
            files = save(fig, out_dir, stem, formats=("png",), tight=False, dpi=90)
            when = ", ".join(f"{lab}" for lab in sorted(set(s["point_label"])))
            out.append(html.figure(files, f"Measured on {gpu}: {title}; median kernel time and effective "
                                          f"bandwidth per commit ({when}), band p10..p90.", alt=title))
    return out
