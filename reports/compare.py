"""`foscar-bench compare`: changes between two runs or commits, judged by reports.noise, and a CI verdict."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from reports import catalog, noise, series
from reports.plotting import kv_label
from reports.source import Results, resolve

STATUS_LOSS = "now "
GONE = "gone"  # series.pair's verdict for a series BASE holds and HEAD lacks


@dataclass
class Comparison:
    """Paired series of BASE and HEAD; `failures` are what a CI gate fails on."""

    changes: pd.DataFrame
    base_runs: list[str]
    head_runs: list[str]
    min_change: float
    fail_threshold: float | None
    gpu_threshold: float = noise.CROSS_GPU_THRESHOLD  # across physical GPUs (noise.judge)

    @property
    def cross_gpu(self) -> pd.Series:
        """True for the series whose BASE and HEAD records name different physical GPUs."""
        return _different(self.changes)

    @property
    def failures(self) -> pd.DataFrame:
        if self.fail_threshold is None:
            return self.changes.iloc[0:0]
        return self.changes[self.changes["gate"]]


def _different(changes: pd.DataFrame) -> pd.Series:
    if "gpu_uuid_base" not in changes:
        return pd.Series(False, index=changes.index)
    pairs = zip(changes["gpu_uuid_base"], changes["gpu_uuid_head"])
    return pd.Series([bool(noise.different_gpus(a, b)) for a, b in pairs], index=changes.index, dtype=bool)


def compare(results: Results, base: str, head: str, min_change: float = 0.02,
            fail_threshold: float | None = None, gpu_threshold: float = noise.CROSS_GPU_THRESHOLD) -> Comparison:
    """Pair every series of BASE with HEAD's and judge each (reports.noise.judge). A CI
    failure is a series judged slower with `fail_threshold` as the threshold (beyond it,
    beyond both sides' noise, at matching SM clocks, and beyond `gpu_threshold` where BASE
    and HEAD ran on different physical GPUs), or one that passed in BASE and no longer
    passes in HEAD, absence included ('gone': an interrupted HEAD sweep fails the gate).

    Why across GPUs a change is not called on the threshold alone: H200s of one pool differ
    by 2-3.5 % at small shapes (noise.CROSS_GPU_THRESHOLD), which neither side's interval
    sees; a 2 % "slower" between two machines says more about the machines than the code.
    Such a series reads ambiguous (different GPUs: a vs b) unless its change passes the
    larger threshold, so that every call still means something. Records without gpu_uuid
    (old ones, CPU runs) are judged as before."""
    base_runs, head_runs = resolve(results, base), resolve(results, head)
    recs = results.records
    base_recs, head_recs = recs[recs["run_id"].isin(base_runs)], recs[recs["run_id"].isin(head_runs)]
    changes = series.pair(base_recs, head_recs, min_change, gpu_threshold)
    gate = []
    for _, row in changes.iterrows():
        if fail_threshold is None:
            gate.append(False)
        elif str(row["verdict"]).startswith(STATUS_LOSS):
            gate.append(True)
        elif row["verdict"] == GONE:
            gate.append(row["status_base"] == "passed")  # HEAD lacks it: a run cut short, or a case dropped
        elif row["change"] is not None and pd.notna(row["change"]):
            j = noise.judge(series.sample(row, "_base"), series.sample(row, "_head"), fail_threshold,
                            gpu_threshold=gpu_threshold)
            gate.append(j.verdict == noise.SLOWER)
        else:
            gate.append(False)
    changes["gate"] = gate
    return Comparison(changes, base_runs, head_runs, min_change, fail_threshold, gpu_threshold)


def _us(median, noise_rel) -> str:
    if pd.isna(median):
        return "-"
    if noise_rel is not None and pd.notna(noise_rel):
        return f"{median:.1f} ±{100 * noise_rel:.1f}%"
    return f"{median:.1f}"


def render(cmp: Comparison, console: Console | None = None, show_all: bool = False) -> None:
    """Print the changes (all series with show_all, else those not judged the same)."""
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    df = cmp.changes
    shown = df if show_all else df[~df["verdict"].isin([noise.SAME, "not timed"])]
    many_gpus = df["gpu_name"].nunique() > 1
    gpus = ", ".join(sorted(df["gpu_name"].dropna().unique()))
    table = Table(title=f"{gpus}: BASE {', '.join(cmp.base_runs)} -> HEAD {', '.join(cmp.head_runs)}")
    cols = (["GPU"] if many_gpus else []) + ["backend", "case", "format", "BASE µs ±CI", "HEAD µs ±CI",
                                             "change ±noise", "verdict"]
    for col in cols:
        table.add_column(escape(col), justify="right" if "µs" in col or col.startswith("change") else "left",
                         no_wrap=col != "verdict")
    style = {noise.SLOWER: "red", noise.FASTER: "green", noise.AMBIGUOUS: "yellow"}
    rank = {noise.SLOWER: 0, noise.AMBIGUOUS: 2}
    order = shown.assign(_k=shown["verdict"].map(rank).fillna(1)).sort_values(
        ["_k", "backend", "batch", "kv_len"], key=lambda s: s.map(catalog.sort_key) if s.name == "backend" else s)
    for _, r in order.iterrows():
        verdict = r["verdict"] + (f" ({r['why']})" if r.get("why") else "") + (" (fails gate)" if r["gate"] else "")
        change = "" if pd.isna(r["change"]) else f"{100 * r['change']:+.1f}% ±{100 * r['noise']:.1f}%"
        cells = ([str(r["gpu_name"])] if many_gpus else []) + [
            str(r["backend"]), f"b{int(r['batch'])} kv{kv_label(r['kv_len'])}", series.format_short(r),
            _us(r["median_us_base"], series.sample(r, "_base").noise if pd.notna(r["median_us_base"]) else None),
            _us(r["median_us_head"], series.sample(r, "_head").noise if pd.notna(r["median_us_head"]) else None),
            change, verdict,
        ]
        table.add_row(*map(escape, cells),
                      style=style.get(r["verdict"], "red" if r["verdict"].startswith(STATUS_LOSS) else None))
    if len(shown):
        console.print(table)
    counts = df["verdict"].value_counts()
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    console.print(f"{len(df)} series compared; a change is called beyond {100 * cmp.min_change:.1f}% and "
                  f"beyond the noise of both sides (95% intervals of the medians), at SM clocks within "
                  f"{100 * noise.CLOCK_TOLERANCE:.0f}%: {summary}.{_cross_gpu_summary(cmp)}")
    if cmp.fail_threshold is not None:
        n = len(cmp.failures)
        console.print(f"[bold {'red' if n else 'green'}]{n} regression(s) beyond "
                      f"{100 * cmp.fail_threshold:.1f}% and outside the noise, or lost passing cases.[/]")


def _cross_gpu_summary(cmp: Comparison) -> str:
    """' N of them compared records from different GPUs (a vs b); ...', or '' when none did."""
    cross = cmp.changes[cmp.cross_gpu]
    if not len(cross):
        return ""
    pairs = sorted({" vs ".join(noise.short_uuids(str(a), str(b)))
                    for a, b in zip(cross["gpu_uuid_base"], cross["gpu_uuid_head"])})
    shown = ", ".join(pairs[:3]) + (f" and {len(pairs) - 3} more pairs" if len(pairs) > 3 else "")
    return (f" {len(cross)} of them compared records from different GPUs ({shown}); there a change is "
            f"called only beyond {100 * max(cmp.min_change, cmp.gpu_threshold):.1f}%, as H200s of one pool "
            f"differ by 2-3.5% at small shapes.")
