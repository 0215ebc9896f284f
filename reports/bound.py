"""The report's speedup-bound section: per case, our time, a baseline's, the read floor at the
bytes our kernel moves, the measured speedup and its bound (baseline / floor), and per pair the
geo-means beside our target (docs/MEASUREMENT.md).

The bound itself is computed by suite.readfloor.speedup_bounds, which the command line runs
(reports import core only, README "Layout"); this module picks the runs it is computed over
and renders what it returns, or says how to get a floor when none was given."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from reports import catalog, html, paper
from reports.plotting import kv_label
from reports.tables import SHAPE

HEADING = "2b. Speedup bound: what the read floor leaves for our speedups"
ANCHOR = "speedup-bound"
MEANING = (
    "The read floor at N bytes is the fastest cold read of N bytes on the GPU, timed as the sweep times a "
    "case (docs/MEASUREMENT.md). No kernel of ours can finish a case faster than the floor at the bytes it "
    "moves, so baseline time / floor time bounds the speedup any kernel of ours could reach over that "
    "baseline on that GPU, and the geo-mean of those bounds bounds the geo-mean speedup: a target above "
    "the geo-mean bound is out of reach there, whatever the kernel does. 'ours / floor' says how far each "
    "case is from its floor."
)
NO_FLOOR = (
    "No read floor was given, so no bound is shown: measure one on the GPU the records came from with "
    "`foscar-bench ceiling --floor --db DB --run ID --json-out F` and pass it as `foscar-bench report --floor-from F`."
)
CHOICE = (
    "Ours come from the latest selected run in which our kernels passed a batch x KV grid, the baselines "
    "from the selected run whose records cover most of its shapes (that run itself on a tie, else the "
    "latest); --run picks other runs. Section 2 takes each case's newest record across all selected runs "
    "instead, so its geo-means can differ slightly from these."
)
MARKS = {
    "<": "< the floor is scaled down from the smallest measured size (a looser bound)",
    ">": "> the floor is scaled up from the largest measured size at the curve's best bandwidth",
    "!": "! the baseline's accuracy check failed (inaccurate): timed and flagged",
    "*": "* the baseline ran with clocks throttled",
}


@dataclass
class Bound:
    """What the section shows. `floor_source` None: no floor was given (the section says how to
    get one). `result` is suite.readfloor.speedup_bounds's return value over the records of
    `ours_run` and `baseline_run`; `problem` says why there is none when a floor was given."""

    floor_source: str | None = None
    floor_gpu: str | None = None
    ours_run: str | None = None
    baseline_run: str | None = None
    baselines: tuple[str, ...] = ()
    result: dict[str, Any] | None = None
    problem: str = ""


def _started(results) -> dict[str, str]:
    runs = results.runs
    return {r: str(s) if isinstance(s, str) else "" for r, s in zip(runs["run_id"], runs["started_at"])}


def pick_runs(results, ours: Sequence[str], baselines: Sequence[str],
              gpu: str | None = None) -> tuple[str | None, str | None]:
    """(our run, baseline run) among `results`' runs. Ours: the latest run in which one of
    `ours` passed, with a time and its bytes, over more than one batch and more than one KV
    length (a grid), else the latest with any such record; on `gpu` when a run there has one.
    Baselines: the run whose timed records of `baselines` cover most (baseline, shape) pairs
    of our run's shapes; our run itself on a tie, else the latest. None where there is none."""
    recs = results.records
    if recs.empty:
        return None, None
    mine = recs[recs["backend"].isin(list(ours)) & (recs["status"] == "passed")
                & (recs["median_us"] > 0) & (recs["bytes"] > 0)]
    if gpu and (mine["gpu_name"] == gpu).any():
        mine = mine[mine["gpu_name"] == gpu]
    if mine.empty:
        return None, None
    started = _started(results)

    def rank(run: str) -> tuple:
        g = mine[mine["run_id"] == run]
        return g["batch"].nunique() > 1 and g["kv_len"].nunique() > 1, started.get(run, ""), run

    ours_run = max(mine["run_id"].unique(), key=rank)
    shapes = set(mine.loc[mine["run_id"] == ours_run, SHAPE].itertuples(index=False, name=None))
    theirs = catalog.timed(recs[recs["backend"].isin(list(baselines))])
    cover = {}
    for run, g in theirs.groupby("run_id"):
        cover[run] = len({(b, *s) for b, s in zip(g["backend"], g[SHAPE].itertuples(index=False, name=None))
                          if s in shapes})
    cover = {r: n for r, n in cover.items() if n}
    if not cover:
        return ours_run, None
    base_run = max(cover, key=lambda r: (cover[r], r == ours_run, started.get(r, ""), r))
    return ours_run, base_run


def run_records(results, run: str | None) -> list[dict]:
    """A run's records as dicts, as suite.readfloor.speedup_bounds takes them."""
    if run is None:
        return []
    return results.records[results.records["run_id"] == run].to_dict(orient="records")


def target(ours: str, over: str) -> float | None:
    """Our geo-mean speedup target for (ours, over): reports/data/paper.csv, source `targets`."""
    value, _ = paper.lookup("targets", "speedup", "speedup_geomean", ours, None, over)
    return value


def verdict(bound: float, goal: float | None) -> str:
    if goal is None or pd.isna(goal) or goal <= 0:
        return ""
    gap = 100 * abs(bound / goal - 1)
    gap_text = f"{gap:.0f}%" if gap >= 1 else f"{gap:.1f}%"
    if bound >= goal:
        return f"{goal:g}x: in reach (the bound is {gap_text} above it)"
    return f"{goal:g}x: out of reach on this GPU (the bound is {gap_text} below it)"


def _pair_label(ours: str, fmt: str, over: str) -> str:
    return f"{catalog.label(ours)}{', ' + fmt + ',' if fmt else ''} over {catalog.label(over)}"


def summary_frame(result: dict[str, Any]) -> pd.DataFrame:
    """One row per (ours, format, baseline): the geo-means, the bound's range and the target."""
    rows = []
    for g in result.get("geomeans", []):
        goal = target(g["ours"], g["over"])
        rows.append({**g, "target": goal,
                     "target_in_reach": None if goal is None else bool(g["geomean_bound"] >= goal)})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["ours", "over", "format"], key=_order).reset_index(drop=True)


def cases_frame(result: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(result.get("cases", []))
    if frame.empty:
        return frame
    return frame.sort_values(["ours", "over", "format", "batch", "kv_len"], key=_order).reset_index(drop=True)


def _order(col: pd.Series) -> pd.Series:
    return col.map(catalog.sort_key) if col.name in ("ours", "over") else col


def summary_display(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "ours": frame["ours"].map(catalog.label),
        "format": frame["format"],
        "over": frame["over"].map(catalog.label),
        "cases": frame["n_cases"],
        "geo-mean measured speedup": [f"{v:.2f}x" for v in frame["geomean_speedup"]],
        "geo-mean bound": [f"{v:.2f}x" for v in frame["geomean_bound"]],
        "bound range": [f"{a:.2f}x to {b:.2f}x" for a, b in zip(frame["min_bound"], frame["max_bound"])],
        "ours / floor (geo-mean)": [f"{v:.2f}x" for v in frame["geomean_ours_over_floor"]],
        "target (targets)": [verdict(b, t) for b, t in zip(frame["geomean_bound"], frame["target"])],
    })


def pair_display(cases: pd.DataFrame, g: pd.Series) -> tuple[pd.DataFrame, set[str]]:
    """One pair's cases and its geo-mean row with the target; and the marks used."""
    rows, marks = [], set()
    for _, r in cases.iterrows():
        fmark = {"below": "<", "above": ">"}.get(r["floor_how"], "")
        bmark = "!" if r["over_inaccurate"] else ("*" if r["over_throttled"] else "")
        marks |= {fmark, bmark} - {""}
        rows.append({
            "batch": str(int(r["batch"])), "KV": kv_label(r["kv_len"]),
            "ours (µs)": f"{r['ours_us']:.1f}", "baseline (µs)": f"{r['over_us']:.1f}",
            "floor at our bytes (µs)": f"{r['floor_us']:.2f}",
            "measured speedup": f"{r['speedup']:.2f}x", "bound": f"{r['bound']:.2f}x",
            "ours / floor": f"{r['ours_over_floor']:.2f}x", "target (targets)": "",
            "marks": " ".join(m for m in (bmark, fmark) if m),
        })
    rows.append({
        "batch": "geo-mean", "KV": f"{int(g['n_cases'])} cases", "ours (µs)": "", "baseline (µs)": "",
        "floor at our bytes (µs)": "", "measured speedup": f"{g['geomean_speedup']:.2f}x",
        "bound": f"{g['geomean_bound']:.2f}x", "ours / floor": f"{g['geomean_ours_over_floor']:.2f}x",
        "target (targets)": verdict(g["geomean_bound"], g["target"]) or "none set", "marks": "",
    })
    return pd.DataFrame(rows), marks


def _provenance(results, bound: Bound) -> str:
    recs = results.records[results.records["run_id"].isin([bound.ours_run, bound.baseline_run])]
    runs = results.runs
    parts = []
    for role, run in (("ours", bound.ours_run), ("baselines", bound.baseline_run)):
        row = runs[runs["run_id"] == run]
        sha = row["git_sha"].iloc[0] if len(row) else None
        parts.append(f"{role}: run {run} (git {str(sha)[:8] if isinstance(sha, str) and sha else 'unknown'})")
    gpus = ", ".join(sorted(set(recs["gpu_name"].dropna()))) or "unknown GPU"
    return (f"GPU: {gpus}. {'; '.join(parts)}; floor: {bound.floor_source}, measured on "
            f"{bound.floor_gpu or 'an unnamed GPU'}.")


def _gpu_note(result: dict[str, Any]) -> str:
    seen = result.get("gpus_seen", [])
    if len(seen) <= 1:
        return ""
    return (f"The records and the floor come from different GPUs ({', '.join(seen)}); a bound holds on "
            "the GPU its floor was measured on.")


def section(page, results, bound: Bound | None) -> None:
    """Append the speedup-bound section to a report page (reports.report._Page: .body, .out)."""
    page.body.append(html.heading(HEADING, ANCHOR))
    page.body.append(html.para(MEANING))
    if bound is None or bound.floor_source is None:
        page.body.append(html.note(NO_FLOOR))
        return
    if bound.problem or not bound.result or not bound.result.get("geomeans"):
        page.body.append(html.note(bound.problem or (
            f"No case where one of our kernels passed and {' or '.join(bound.baselines) or 'a baseline'} "
            f"carries a time on the same shape in runs {bound.ours_run} and {bound.baseline_run}: no bound to show.")))
        return
    result = bound.result
    where = _provenance(results, bound)
    page.body.append(html.para(CHOICE, "meta"))
    note = _gpu_note(result)
    if note:
        page.body.append(html.note(note))
    summary, cases = summary_frame(result), cases_frame(result)
    summary.to_csv(Path(page.out) / "speedup_bound.csv", index=False)
    cases.to_csv(Path(page.out) / "speedup_bound_cases.csv", index=False)
    page.body.append(html.table(
        summary_display(summary),
        "(2b) Measured and bounded: per pair, the geo-mean over its cases of baseline time / our time and of "
        "baseline time / floor time at our bytes, the bound's range over the cases, and our target with "
        f"whether the bound leaves it in reach. {where}", "speedup_bound.csv"))
    marks: set[str] = set()
    for _, g in summary.iterrows():
        part = cases[(cases["ours"] == g["ours"]) & (cases["format"] == g["format"]) & (cases["over"] == g["over"])]
        display, used = pair_display(part, g)
        marks |= used
        page.body.append(html.table(
            display, f"(2b) {_pair_label(g['ours'], g['format'], g['over'])}: per case (times are medians), "
            "then the geo-mean with the target beside it.", "speedup_bound_cases.csv"))
    if marks:
        page.body.append(html.para("Marks: " + "; ".join(MARKS[m] for m in ("<", ">", "!", "*") if m in marks) + ".",
                                   "meta"))
    if result.get("unmatched_ours"):
        left = result["unmatched_ours"]
        page.body.append(html.para(
            f"{len(left)} of our passed case(s) have no baseline time on their shape in run {bound.baseline_run} "
            f"and are left out: {'; '.join(left[:6])}{' ...' if len(left) > 6 else ''}.", "meta"))
