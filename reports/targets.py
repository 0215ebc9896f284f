"""The targets scorecard: each of our targets beside what the selected runs measured, met, missed or
not measured, with the case, runs and commits its figure came from (`foscar-bench targets`, and
the first section of the report).

The goals are the `targets` rows of reports/data/paper.csv, one scorecard row each, so a goal
added there is judged here without a change of code. Every goal is judged on the records the
report's sections 1 and 2 read (each case's newest record in the selected runs), in the scope
the targets are set for: one GPU (the targets' own, the H200, unless another is named),
Llama-3-8B heads and group 128, and for the bandwidth, ALU and speedup goals our kernels' default
K/V format (core.case.Case's: K channel-wise, V token-wise), the one the paper's table and the
project's earlier hand-written target tables (docs/PERFORMANCE.md) judge.

- bandwidth: the record's `frac_peak_bus` at the goal's batch and KV length, the fraction of the
  bus-derived peak the harness computed, as section 1 shows it;
- alu: `alu_per_elem` (thread-level ALU instructions per KV element, as `foscar-bench alu`
  stores it) of the newest record that carries one;
- speedup: section 2's geometric mean itself (reports.tables.speedup_table, same pairing), over
  the records of the batch {1, 8, 32, 128} x KV {4K, 16K, 32K, 128K} grid; over fewer than the
  16 cases it is not a measurement of the goal, and says how many cases it covers;
- accuracy: every record of our kernels in scope, whatever its K/V format.

A record that failed the accuracy gate never meets a goal: the goal it bears on is missed.
"""
from __future__ import annotations

import fnmatch
import math
import operator
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path

import pandas as pd

from core.case import MODELS, Case
from reports import catalog, html, paper, tables
from reports.source import Results, from_frames, latest_per_case, oldest_first, select_runs

MET, MISSED, NOT_MEASURED = "met", "missed", "not measured"
GRID_BATCHES = (1, 8, 32, 128)
GRID_KV_LENS = (4096, 16384, 32768, 131072)
GRID_CASES = len(GRID_BATCHES) * len(GRID_KV_LENS)
GRID_TEXT = (f"grid of batch {', '.join(map(str, GRID_BATCHES))} x KV "
             f"{', '.join(f'{k // 1024}K' for k in GRID_KV_LENS)}")
MODEL = "llama3-8b"
HEADS = dict(zip(("num_q_heads", "num_kv_heads", "head_dim"), MODELS[MODEL]))
FORMAT = {f.name: f.default for f in fields(Case) if f.name in ("k_mode", "v_mode", "group_size")}
COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
ORDER = ("bandwidth", "alu", "speedup", "accuracy")  # the scorecard's order of paper.csv's tables
HEADING = "Targets: each goal beside what the selected runs measured"
ANCHOR = "targets"
ROW_CLASS = {"met": "improvement", "missed": "regression"}  # html.CSS's green and red rows

MEANING = (
    "Each of our targets (reports/data/paper.csv, source targets) beside what the selected runs "
    "measured, on the GPU the targets are set for, with Llama-3-8B heads and group 128, our kernels in "
    "their default format (K channel-wise, V token-wise) except for accuracy, which counts every record "
    "of ours. Each figure comes from each case's newest record, as sections 1, 2 and 5 read them: the "
    "fraction of the bus-derived peak at the target's case, the ALU instructions per KV element that "
    "`foscar-bench alu` stored, section 2's geo-mean over the batch {1, 8, 32, 128} x KV {4K, 16K, 32K, "
    "128K} grid, the largest relative error. A record that failed the accuracy gate never meets a target; "
    "a geo-mean over fewer than the grid's 16 cases is not measured and says how many it covers. "
    "`foscar-bench targets` prints this table."
)


@dataclass
class TargetRow:
    """One goal and what the records say about it."""

    target: str          # the goal in words: kernel, figure and case
    backend: str         # our kernel (a glob for the accuracy goal)
    over: str            # the baseline of a speedup goal, '' otherwise
    metric: str          # paper.csv's metric: frac_peak_bus, alu_per_elem, speedup_geomean, rel_error
    goal: float | None
    comparison: str      # how the measured value must stand to the goal: '>=', '<=' (paper.csv's qualifier)
    measured: float | None
    measured_text: str
    case: str            # where the figure was taken: the case, the grid, or the records counted
    format: str          # the K/V format of ours judged (the accuracy goal: every one, at group 128)
    runs: str
    commits: str
    status: str          # MET, MISSED or NOT_MEASURED
    reason: str          # why that status, in a sentence
    cases: int | None = None  # speedup goals: the grid cases the geo-mean covers
    gpu: str = ""             # the GPU whose records were judged ('' when the records hold none to judge)

    @property
    def goal_text(self) -> str:
        return _goal_text(self.metric, self.comparison, self.goal)


class Scope:
    """The records a scorecard judges: each case's newest record on one GPU with Llama-3-8B heads,
    and the speedup pairs section 2 forms over the grid's cases among them."""

    def __init__(self, records: pd.DataFrame, gpu: str | None, gpu_problem: str = ""):
        self.gpu, self.gpu_problem = gpu, gpu_problem
        on = records[records["gpu_name"] == gpu] if gpu else records.iloc[0:0]
        heads = pd.Series(True, index=on.index)
        for col, value in HEADS.items():
            heads &= on[col] == value
        self.records = on[heads]

    def ours(self, backend: str, default_format: bool = True) -> pd.DataFrame:
        """Records of one kernel of ours at group 128, in the default K/V format unless told otherwise."""
        r = self.records
        keep = (r["backend"] == backend) & (r["group_size"] == FORMAT["group_size"])
        if default_format:
            keep &= (r["k_mode"] == FORMAT["k_mode"]) & (r["v_mode"] == FORMAT["v_mode"])
        return r[keep]

    @cached_property
    def grid(self) -> pd.DataFrame:
        r = self.records
        return r[r["batch"].isin(GRID_BATCHES) & r["kv_len"].isin(GRID_KV_LENS)]

    @cached_property
    def speedups(self) -> pd.DataFrame:
        """Section 2's table over the grid's records (one row per kernel, format and baseline)."""
        return tables.speedup_table(self.grid).frame

    @cached_property
    def pairs(self) -> pd.DataFrame:
        """Section 2's per-case pairs over the grid's records."""
        return tables.case_speedups(self.grid)


def scorecard(source: Results | pd.DataFrame, runs: list[str] | None = None,
              gpu: str | None = None) -> list[TargetRow]:
    """One row per target of reports/data/paper.csv, judged on `source` (a Results, or its records
    frame); `runs` (run ids or git sha prefixes, 'all') selects runs first as `report --run` does.
    `gpu`: the GPU whose records are judged, its full name or a part of it (default: the targets'
    GPU, H200). Raises ValueError when a `gpu` given names no GPU of the records, or several; a
    bad run name raises reports.source.SourceError."""
    results = source if isinstance(source, Results) else from_frames(source)
    if runs:
        results = select_runs(results, runs)
    records = latest_per_case(results.records)
    goals = paper.targets()
    goals = goals.iloc[goals["table"].map(lambda t: ORDER.index(t) if t in ORDER else len(ORDER))
                       .argsort(kind="stable")]
    scope = _scope(records, gpu, _targets_gpu(goals))
    ours = _our_backends(goals)
    return [_judge_target(t, scope, ours) for t in goals.itertuples(index=False)]


def frame(rows: list[TargetRow]) -> pd.DataFrame:
    """The rows as a table (what the report writes to targets.csv), goal_text included."""
    return pd.DataFrame([{**asdict(r), "goal_text": r.goal_text} for r in rows])


def display(rows: list[TargetRow]) -> pd.DataFrame:
    """What the page and the terminal show: one line per goal."""
    return pd.DataFrame({
        "target": [r.target for r in rows],
        "goal": [r.goal_text for r in rows],
        "measured": [r.measured_text for r in rows],
        "status": [r.status for r in rows],
        "case": [r.case for r in rows],
        "from": [_from_text(r) for r in rows],
        "why": [r.reason for r in rows],
    })


def formats_text(rows: list[TargetRow]) -> str:
    """The K/V formats the rows judged, for a title: 'K channel, V token, g128; for the relative L2
    error against float64, any K/V format, g128'."""
    seen = list(dict.fromkeys(r.format for r in rows))
    if len(seen) <= 1:
        return seen[0] if seen else ""
    main = max(seen, key=lambda f: sum(r.format == f for r in rows))
    rest = "; ".join(f"for the {r.target.split(': ', 1)[-1]}, {r.format}" for r in rows if r.format != main)
    return f"{main}; {rest}"


def _from_text(row: TargetRow) -> str:
    """'run R at C', 'runs R1, R2 at C' or '12 runs, newest R at C1, C2' (see _listing)."""
    if not row.runs:
        return ""
    counted = " runs, newest " in row.runs
    runs = row.runs if counted else ("runs " if "," in row.runs else "run ") + row.runs
    return f"{runs} at {row.commits}" if row.commits else runs


def counts(rows: list[TargetRow]) -> str:
    """'11 targets: 2 met, 8 missed, 1 not measured.'"""
    n = {s: sum(r.status == s for r in rows) for s in (MET, MISSED, NOT_MEASURED)}
    return f"{len(rows)} targets: " + ", ".join(f"{v} {k}" for k, v in n.items()) + "."


def section(page, results: Results) -> None:
    """Append the scorecard to a report page (reports.report._Page: .body, .out), with its meaning."""
    page.body.append(html.heading(HEADING, ANCHOR))
    page.body.append(html.para(MEANING))
    try:
        rows = scorecard(results)
    except ValueError as err:
        page.body.append(html.note(str(err)))
        return
    frame(rows).to_csv(Path(page.out) / "targets.csv", index=False)
    gpu = rows[0].gpu if rows else ""
    page.body.append(html.table(
        display(rows), f"(Targets) {counts(rows)} Records judged: {gpu or 'none (see each row)'}, our kernels "
        f"in {formats_text(rows)}; each row names the case, runs and commits its figure came from.", "targets.csv",
        row_classes=[ROW_CLASS.get(r.status, "") for r in rows]))


# -- the GPU -------------------------------------------------------------------------------------

def _targets_gpu(goals: pd.DataFrame) -> str:
    names = goals["gpu"].dropna().unique()
    return str(names[0]) if len(names) else "H200"


def pick_gpu(records: pd.DataFrame, name: str) -> str:
    """The one GPU name of `records` that `name` means: an exact match (any case), else the one
    name that contains it. ValueError naming `name` when none or several do."""
    held = sorted(str(g) for g in records["gpu_name"].dropna().unique())
    exact = [g for g in held if g.lower() == name.lower()]
    if exact:
        return exact[0]
    part = [g for g in held if name.lower() in g.lower()]
    if len(part) == 1:
        return part[0]
    if part:
        raise ValueError(f"GPU {name!r} matches {len(part)} GPUs of the selected runs ({', '.join(part)}); "
                         "give the full name with --gpu.")
    raise ValueError(f"GPU {name!r} is not a GPU of the selected runs (they hold "
                     f"{', '.join(held) or 'no record'}); name one of those with --gpu.")


def _scope(records: pd.DataFrame, gpu: str | None, default: str) -> Scope:
    """The scope on `gpu` when named (ValueError when it is not there); else on the targets' GPU,
    or on none, with a reason every row gives, when the records hold no such GPU."""
    if gpu:
        return Scope(records, pick_gpu(records, gpu))
    try:
        return Scope(records, pick_gpu(records, default))
    except ValueError:
        held = sorted(str(g) for g in records["gpu_name"].dropna().unique())
        problem = (f"no record on an {default} in the selected runs"
                   + (f" (they hold {', '.join(held)}; --gpu judges another GPU's records against these goals)"
                      if held else ""))
        return Scope(records, None, problem)


# -- one target ----------------------------------------------------------------------------------

def _our_backends(goals: pd.DataFrame) -> list[str]:
    """Our kernels the goals name one by one (the accuracy goal's glob is matched against these)."""
    names = {b for b in goals["backend"] if b and "*" not in b and catalog.is_ours(b)}
    return sorted(names, key=catalog.sort_key)


def _judge_target(t, scope: Scope, ours: list[str]) -> TargetRow:
    row = TargetRow(target=_target_text(t), backend=t.backend, over=t.over_backend, metric=t.metric,
                    goal=None if pd.isna(t.value) else float(t.value), comparison=t.qualifier,
                    measured=None, measured_text="", case="", format=_format_text(), runs="", commits="",
                    status=NOT_MEASURED, reason="", gpu=scope.gpu or "")
    if row.goal is None or row.comparison not in COMPARE:
        return _set(row, NOT_MEASURED, "reports/data/paper.csv gives this target no value and comparison to judge.")
    if scope.gpu is None:
        return _set(row, NOT_MEASURED, scope.gpu_problem + ".")
    judge = {"bandwidth": _bandwidth, "alu": _alu, "speedup": _speedup, "accuracy": _accuracy}.get(t.table)
    if judge is None:
        return _set(row, NOT_MEASURED, f"no rule here judges a target of table {t.table!r}.")
    return judge(row, t, scope, ours)


def _bandwidth(row: TargetRow, t, scope: Scope, ours: list[str]) -> TargetRow:
    batch, kv_len = int(t.batch), int(t.kv_len)
    row.case = f"batch {batch}, KV {kv_len}"
    at = _at(scope.ours(t.backend), batch, kv_len)
    elsewhere = _other_formats(row, scope, batch, kv_len)
    if at.empty:
        return _set(row, NOT_MEASURED, f"no passed record at batch {batch}, KV {kv_len}: none of {t.backend} "
                    f"in {_format_text()} on {scope.gpu}.{elsewhere}")
    rec = _newest(at)
    _where(row, rec)
    if rec["status"] in catalog.GATE_FAILED:
        return _set(row, MISSED, f"its record failed the accuracy gate ({_failure(rec)}).{elsewhere}")
    if rec["status"] != "passed":
        return _set(row, NOT_MEASURED, f"no passed record at batch {batch}, KV {kv_len}: the newest ended "
                    f"{rec['status']}{_said(rec)}.{elsewhere}")
    frac = rec["frac_peak_bus"]
    if pd.isna(frac) or not frac > 0:
        return _set(row, NOT_MEASURED, f"its record at batch {batch}, KV {kv_len} carries no fraction of the "
                    "bus-derived peak.")
    row.measured, row.measured_text = float(frac), _bandwidth_text(rec)
    return _compare(row, elsewhere)


def _other_formats(row: TargetRow, scope: Scope, batch: int, kv_len: int) -> str:
    """' K token, V token, g128 reached 94.3% (run R at C), which would meet it.': the best passed
    record of the kernel at the case in a K/V format other than the default (named, never counted),
    or '' when there is none."""
    other = _at(scope.ours(row.backend, default_format=False), batch, kv_len)
    other = other[(other["status"] == "passed") & (other["frac_peak_bus"] > 0)
                  & ~((other["k_mode"] == FORMAT["k_mode"]) & (other["v_mode"] == FORMAT["v_mode"]))]
    if other.empty:
        return ""
    best = other.loc[other["frac_peak_bus"].idxmax()]
    meets = COMPARE.get(row.comparison, operator.ge)(best["frac_peak_bus"], row.goal or 0.0)
    return (f" {tables.fmt_label(best)} reached {tables.pct(best['frac_peak_bus'])} (run {best['run_id']} at "
            f"{tables.commit(best['git_sha'], best.get('git_dirty'))}){', which would meet it' if meets else ''}.")


def _alu(row: TargetRow, t, scope: Scope, ours: list[str]) -> TargetRow:
    mine = scope.ours(t.backend)
    have = mine[mine["alu_per_elem"].notna()]
    if have.empty:
        run = _newest(mine)["run_id"] if len(mine) else "RUN"
        return _set(row, NOT_MEASURED, f"no record of {t.backend} in {_format_text()} carries an ALU count "
                    f"(`foscar-bench alu -b {t.backend} --run {run}` stores one).")
    rec = _newest(have)
    _where(row, rec)
    row.case = f"batch {int(rec['batch'])}, KV {int(rec['kv_len'])}"
    row.measured = float(rec["alu_per_elem"])
    inst = rec.get("inst_per_elem")
    row.measured_text = f"{row.measured:.3f}" + ("" if pd.isna(inst) else f" (of {inst:.3f} instructions per element)")
    if rec["status"] in catalog.GATE_FAILED:
        return _set(row, MISSED, f"its record failed the accuracy gate ({_failure(rec)}).")
    return _compare(row)


def _speedup(row: TargetRow, t, scope: Scope, ours: list[str]) -> TargetRow:
    row.case = GRID_TEXT
    fmt = _format_text()
    table = scope.speedups
    hit = (table[(table["kernel"] == t.backend) & (table["format"] == fmt) & (table["over"] == t.over_backend)]
           if len(table) else table)
    failed = _failed_in_grid(scope, t.backend)
    if hit.empty:
        why = f" {failed}" if failed else ""
        return _set(row, MISSED if failed else NOT_MEASURED,
                    f"no grid case where {t.backend} and {t.over_backend} both passed on {scope.gpu}.{why}")
    g = hit.iloc[0]
    paired = _paired_cases(scope, t.backend, t.over_backend)
    row.cases, row.measured = int(g["n_cases"]), float(g["geomean_speedup"])
    row.measured_text = (f"{row.measured:.2f}x over " + ("the 16 cases" if row.cases == GRID_CASES
                                                         else f"{row.cases} of the {GRID_CASES} cases")
                         + (f" ({int(g['n_over_inaccurate'])} over an inaccurate baseline)"
                            if g["n_over_inaccurate"] else ""))
    row.runs = _listing(_ordered_runs(_paired_records(scope, t.backend, t.over_backend, paired)), "run")
    row.commits = g["ours_commits"].replace(",", ", ")
    if failed:
        return _set(row, MISSED, failed)
    if row.cases < GRID_CASES:  # section 2 counts each shape once (tables.case_speedups): never more
        return _set(row, NOT_MEASURED, f"only {row.cases} of the {GRID_CASES} grid cases passed for both; "
                    f"without a pair: {_unpaired(scope, t.backend, t.over_backend, paired)}.")
    return _compare(row)


def _accuracy(row: TargetRow, t, scope: Scope, ours: list[str]) -> TargetRow:
    names = [b for b in ours if fnmatch.fnmatchcase(b, t.backend)]
    mine = pd.concat([scope.ours(b, default_format=False) for b in names]) if names else scope.records.iloc[0:0]
    measured = mine[mine["rel_error"].notna()]
    failed = mine[mine["status"].isin(catalog.GATE_FAILED)]
    row.case = f"every record of {', '.join(names) or t.backend}"
    row.format = f"any K/V format, g{FORMAT['group_size']}"
    if measured.empty and failed.empty:
        return _set(row, NOT_MEASURED, f"no record of {', '.join(names) or t.backend} on {scope.gpu} carries an error.")
    row.runs = _listing(_ordered_runs(mine), "run")
    row.commits = _listing(_ordered_commits(mine), "commit")
    if len(measured):
        row.measured = float(measured["rel_error"].max())
        row.measured_text = f"max {row.measured:.2e} over {len(measured)} record(s)"
    if len(failed):
        cases = "; ".join(f"{r['backend']} b{int(r['batch'])} KV {int(r['kv_len'])} {_failure(r)}"
                          for _, r in failed.head(4).iterrows())
        more = f"; and {len(failed) - 4} more" if len(failed) > 4 else ""
        return _set(row, MISSED, f"{len(failed)} record(s) failed the accuracy gate: {cases}{more}.")
    return _compare(row)


# -- verdicts and wording ------------------------------------------------------------------------

def _compare(row: TargetRow, more: str = "") -> TargetRow:
    ok = COMPARE[row.comparison](row.measured, row.goal)
    return _set(row, MET if ok else MISSED, _gap(row) + "." + more)


def _gap(row: TargetRow) -> str:
    """How far the measured value stands from the goal, in points for fractions, else relative."""
    diff = row.measured - row.goal
    side = "above" if diff > 0 else "below"
    bound = "the goal" if row.comparison.startswith(">") else "the limit"
    if diff == 0:
        return f"at {bound}"
    if row.metric.startswith("frac"):
        return f"{100 * abs(diff):.1f} points {side} {bound}"
    return f"{100 * abs(diff) / abs(row.goal):.1f}% {side} {bound}"


def _set(row: TargetRow, status: str, reason: str) -> TargetRow:
    row.status, row.reason = status, reason.strip()
    return row


def _target_text(t) -> str:
    kernel = t.kernel if "*" in t.backend else catalog.label(t.backend).removesuffix(" (ours)")
    if t.table == "bandwidth":
        return f"{kernel}: fraction of bus peak, batch {int(t.batch)}, KV {int(t.kv_len) // 1024}K"
    if t.table == "alu":
        return f"{kernel}: ALU instructions per KV element"
    if t.table == "speedup":
        return f"{kernel}: geo-mean speedup over {catalog.label(t.over_backend)}"
    if t.table == "accuracy":
        return f"{kernel}: relative L2 error against float64"
    return f"{kernel}: {t.metric}"


def _goal_text(metric: str, comparison: str, goal: float | None) -> str:
    return f"{comparison} {_value_text(metric, goal)}" if goal is not None else "none set"


def _value_text(metric: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if metric.startswith("frac"):
        return tables.pct(value)
    if metric == "speedup_geomean":
        return f"{value:.2f}x"
    if metric == "rel_error":
        return f"{value:.2e}"
    return f"{value:.3g}"


def _format_text() -> str:
    return tables.fmt_label(FORMAT)


def _bandwidth_text(rec) -> str:
    frac, eff = rec["frac_peak_bus"], rec["eff_bandwidth_tbps"]
    text = tables.pct(frac)
    if eff > 0:
        text += f" of {eff / frac:.2f} TB/s ({eff:.2f} TB/s"
        text += f", {rec['median_us']:.1f} µs)" if rec["median_us"] > 0 else ")"
    return text


def _failure(rec) -> str:
    err = rec.get("rel_error")
    return rec["status"] + ("" if pd.isna(err) else f", rel. error {err:.2e}")


def _said(rec) -> str:
    reason = rec.get("reason")
    return f": {str(reason)[:120]}" if isinstance(reason, str) and reason else ""


def _at(records: pd.DataFrame, batch: int, kv_len: int) -> pd.DataFrame:
    return records[(records["batch"] == batch) & (records["kv_len"] == kv_len)]


def _newest(records: pd.DataFrame) -> pd.Series:
    """The newest record, by the order latest_per_case keeps."""
    return oldest_first(records).iloc[-1]


def _where(row: TargetRow, rec) -> None:
    row.runs = str(rec["run_id"])
    row.commits = tables.commit(rec["git_sha"], rec.get("git_dirty"))


def _ordered_runs(records: pd.DataFrame) -> list[str]:
    order = oldest_first(records)
    return list(dict.fromkeys(str(r) for r in order["run_id"]))


def _ordered_commits(records: pd.DataFrame) -> list[str]:
    order = oldest_first(records)
    return list(dict.fromkeys(tables.commit(s, d) for s, d in zip(order["git_sha"], order["git_dirty"])))


def _listing(names: list[str], what: str) -> str:
    """Up to three names, oldest first; more as a count and the newest."""
    if len(names) <= 3:
        return ", ".join(names)
    return f"{len(names)} {what}s, newest {names[-1]}"


def _paired_records(scope: Scope, ours: str, over: str, paired: set[tuple]) -> pd.DataFrame:
    """The grid records behind section 2's pairs: ours passed (default format) and the baseline's
    timed ones, on the paired shapes."""
    grid = scope.grid
    on = pd.Series([s in paired for s in zip(*(grid[c] for c in tables.SHAPE))], index=grid.index, dtype=bool)
    mine = scope.ours(ours).index.intersection(grid.index)
    keep = on & ((grid.index.isin(mine) & (grid["status"] == "passed"))
                 | grid.index.isin(catalog.timed(grid[grid["backend"] == over]).index))
    return grid[keep]


def _paired_cases(scope: Scope, ours: str, over: str) -> set[tuple]:
    """The shapes (tables.SHAPE) where section 2 paired `ours`, default format, with `over`."""
    p = scope.pairs
    if p.empty:
        return set()
    p = p[(p["backend"] == ours) & (p["over"] == over)]
    for col in ("k_mode", "v_mode", "group_size"):
        p = p[p[col] == FORMAT[col]]
    return set(p[tables.SHAPE].itertuples(index=False, name=None))


def _failed_in_grid(scope: Scope, ours: str) -> str:
    """'N of our grid records failed the accuracy gate (...)' or ''."""
    mine = scope.ours(ours)
    bad = mine[mine.index.isin(scope.grid.index) & mine["status"].isin(catalog.GATE_FAILED)]
    if bad.empty:
        return ""
    cases = ", ".join(f"b{int(r['batch'])} KV {int(r['kv_len'])} ({_failure(r)})" for _, r in bad.head(4).iterrows())
    return f"{len(bad)} of {ours}'s grid records failed the accuracy gate: {cases}."


def _unpaired(scope: Scope, ours: str, over: str, paired: set[tuple]) -> str:
    """The grid cases without a pair, each with why: what ours and the baseline recorded there."""
    at_batch, at_kv = tables.SHAPE.index("batch"), tables.SHAPE.index("kv_len")
    have = {(s[at_batch], s[at_kv]) for s in paired}
    missing = [(b, k) for b in GRID_BATCHES for k in GRID_KV_LENS if (b, k) not in have]
    parts = []
    for batch, kv_len in missing[:6]:
        mine = _at(scope.ours(ours), batch, kv_len)
        theirs = catalog.timed(_at(scope.grid[scope.grid["backend"] == over], batch, kv_len))
        why = []
        status = _newest(mine)["status"] if len(mine) else None
        if status is None:
            why.append(f"no record of {ours}")
        elif status != "passed":
            why.append(f"{ours} {status}")
        if theirs.empty:
            why.append(f"no timed record of {over}")
        parts.append(f"b{batch} KV {kv_len} ({', '.join(why) or 'no pair'})")
    more = f"; and {len(missing) - 6} more" if len(missing) > 6 else ""
    return "; ".join(parts) + more
