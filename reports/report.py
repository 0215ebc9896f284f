"""`foscar-bench report`: index.html, every figure as PNG and SVG, and a CSV per table, from selected runs."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd

from reports import accuracy, bound as bound_section, captions, e2e, html, paper, roofline, scaling, tables
from reports import targets as targets_section
from reports.gpu import above_ceiling, gpu_facts
from reports.plotting import save
from reports.source import Results, latest_per_case


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


class _Page:
    """Collects the body of index.html while figures and tables are written beside it."""

    def __init__(self, out_dir: Path, results: Results, records: pd.DataFrame):
        self.out, self.results, self.records, self.body = out_dir, results, records, []

    def caption(self, what: str, records: pd.DataFrame) -> str:
        return captions.caption(what, records, self.results.runs)

    def figure(self, fig, stem: str, what: str, records: pd.DataFrame, missing: str) -> None:
        if fig is None:
            self.body.append(html.note(missing))
            return
        files = save(fig, self.out, stem)
        self.body.append(html.figure(files, self.caption(what, records), alt=what))

    def table(self, table: tables.Table, what: str) -> None:
        for text in table.notes:
            self.body.append(html.note(text))
        if table.frame.empty:
            return
        csv_name = f"{table.name}.csv"
        table.frame.to_csv(self.out / csv_name, index=False)
        self.body.append(html.table(table.display, self.caption(what, self.records), csv_name))


def build_report(results: Results, out_dir: Path, title: str = "FOSCAR decode-attention report",
                 bound: bound_section.Bound | None = None) -> Path:
    """Render the report of `results` into out_dir; returns the path of index.html. `bound`: the
    speedup bound over a read floor (reports.bound; the command line computes it), or None: the
    section then says how to get a floor."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = latest_per_case(results.records)
    page = _Page(out_dir, results, records)
    page.body.append(html.para(f"Store: {results.db}. " + captions.provenance(records, results.runs), "meta"))
    page.body.extend(html.note(n) for n in results.notes)
    if records.empty:
        page.body.append(html.note("The selected runs hold no records: every figure and table below is empty."))
    targets_section.section(page, results)
    _paper_sections(page, records)
    bound_section.section(page, results, bound)
    for gpu in sorted(records["gpu_name"].unique()):
        _gpu_sections(page, records[records["gpu_name"] == gpu], gpu, results)
    _accuracy_section(page, records)
    e2e.section(page, results)  # its own tables in the same store (foscar-bench e2e)
    page.body.append(html.heading("Record status", "status"))
    page.table(tables.status_table(records), "Records per backend and status, with the first reason given.")
    shutil.copyfile(paper.PAPER_CSV, out_dir / "paper_reference.csv")
    page.body.append(html.para("Reference figures: " + paper.sources_text() + ". All in paper_reference.csv "
                               "(a copy of the repository's reports/data/paper.csv).", "meta"))
    index = out_dir / "index.html"
    index.write_text(html.page(title, page.body), encoding="utf-8")
    return index


def _paper_sections(page: _Page, records: pd.DataFrame) -> None:
    page.body.append(html.heading("1. The paper's bandwidth table, with our measurements", "bandwidth"))
    page.table(tables.bandwidth_table(records),
               "Measured: effective bandwidth (bytes the byte model requires / median kernel time) at "
               "batch 128, KV 32K, as a fraction of each peak, beside the paper's H100/B200 fractions of "
               "peak HBM bandwidth, our earlier H200 measurement and our targets.")
    page.body.append(html.heading("2. Speedups", "speedups"))
    page.table(tables.speedup_table(records),
               "Measured: geometric mean over the selected runs' cases of baseline time / our time, "
               "counting only cases where both passed on the same shape and GPU; one row per K/V format "
               "of ours, over the shapes that format ran (a baseline that ran one shape in several "
               "formats counts with its median); paper values beside.")
    pairs = tables.case_speedups(records)
    if not pairs.empty:
        pairs.to_csv(page.out / "speedups_per_case.csv", index=False)
        page.body.append(html.para("Per-case speedups: speedups_per_case.csv.", "meta"))


def _gpu_sections(page: _Page, recs: pd.DataFrame, gpu: str, results: Results) -> None:
    facts = gpu_facts(gpu, {r: results.env(r) for r in recs["run_id"].unique()}, recs)
    tag = slug(gpu)
    page.body.append(html.heading(f"3. Rooflines: {gpu}", f"roofline-{tag}"))
    attr = {"datasheet peak": "peak_datasheet_tbps", "bus-derived peak": "peak_bus_tbps",
            "measured read ceiling": "read_ceiling_tbps"}
    roofs = ", ".join(f"{k} {v:.2f} TB/s ({facts.sources.get(attr[k], 'run environment')})"
                      for k, v in facts.hbm_roofs().items())
    assumed = f"; SM count {facts.sources['sm_count']}" if "sm_count" in facts.sources else ""
    alu = (f"ALU pipe rate {facts.alu_rate / 1e12:.1f}e12 thread-instructions/s ({facts.alu_rate_source}){assumed}"
           if facts.alu_rate else "ALU pipe rate unknown for this GPU: no issue roofs drawn")
    page.figure(
        roofline.bandwidth_vs_bytes(recs, facts), f"roofline_bandwidth_{tag}",
        f"(3a) Measured: effective bandwidth of every timed record against the bytes it reads per KV "
        f"element (large markers: batch 128, KV 32K, else each backend's largest case; {FAILED_NOTE}). "
        f"HBM roofs: {roofs or 'unknown'}. Issue roofs: ALU rate / ALU per element x bytes per element; {alu}.",
        recs, "(3a) No timed record with bytes and a bandwidth on this GPU: nothing to plot.")
    _ceiling_note(page, recs, facts)
    page.figure(
        roofline.classic(recs, facts), f"roofline_classic_{tag}",
        "(3b) Measured: FLOP/s (byte model's FLOPs / median time) against FLOP per byte read, for every "
        f"timed record ({FAILED_NOTE}), zoomed to the points; compute ceilings derived as SMs x clock x "
        "per-SM rate, memory diagonals as above.",
        recs, "(3b) No timed record with FLOPs, bytes and a time on this GPU: nothing to plot.")
    page.body.append(html.heading(f"4. Latency and bandwidth against KV length and batch: {gpu}", f"scaling-{tag}"))
    for axis, what in (("kv_len", "KV length"), ("batch", "batch")):
        fig, shape = scaling.scaling(recs, axis)
        page.figure(
            fig, f"scaling_{axis}_{tag}",
            f"(4) Measured: median kernel time (top, log scale) and effective bandwidth as % of the "
            f"bus-derived peak (bottom) against {what}; {shape}; solid lines ours, dashed baselines; "
            f"median over K/V formats where a backend ran several; {FAILED_NOTE}.",
            recs, f"(4) Fewer than two {what} values with timed records on this GPU: no {what} plot.")


FAILED_NOTE = ("a record that failed the accuracy gate is a red X on the x axis when untimed, a hollow "
               "marker when timed, and is listed in section 5")


def _ceiling_note(page: _Page, recs: pd.DataFrame, facts) -> None:
    """Say which run's read ceiling 3a draws, what the other runs plotted measured, and
    whether any record beats the ceiling its own run measured beyond both noises."""
    if not facts.read_ceiling_tbps:
        return
    spread = (f" ± {100 * facts.read_ceiling_spread / 2:.2f}%" if facts.read_ceiling_spread
              else "; no spread recorded: a single-kernel measurement from before the search")
    drawn = f"{facts.read_ceiling_tbps:.2f} TB/s{spread}"
    held = recs["run_id"].astype(str).value_counts()
    text = (f"The read ceiling drawn ({drawn}) is the one run {facts.read_ceiling_run} measured, the run "
            f"holding most records here of those that measured one ({int(held.get(facts.read_ceiling_run, 0))} "
            f"of {len(recs)})." if facts.read_ceiling_run else
            f"The read ceiling drawn: {drawn} ({facts.sources.get('read_ceiling_tbps', 'run environment')}).")
    others = sorted((c[0], run) for run, c in facts.run_ceilings.items() if run != facts.read_ceiling_run)
    if others:
        listed = "; ".join(f"{v:.2f} TB/s (run {run}, {_n_records(int(held.get(run, 0)))})"
                           for v, run in others[:8])
        more = f"; and {len(others) - 8} more" if len(others) > 8 else ""
        text += f" Other runs plotted here measured their own: {listed}{more}."
    timed = recs[recs["eff_bandwidth_tbps"] > 0]
    above = timed[timed["eff_bandwidth_tbps"] > facts.read_ceiling_tbps]
    if len(above):
        text += (f" {len(above)} record(s) sit above the drawn ceiling (up to {above['eff_bandwidth_tbps'].max():.2f} "
                 "TB/s), each judged against the ceiling its own run measured.")
    over = above_ceiling(recs, facts)
    if over.empty:
        page.body.append(html.para(
            text + " No record beats the read ceiling its own run measured by more than both noises.", "meta"))
        return
    worst = over.sort_values("over_ceiling", ascending=False)
    names = "; ".join(f"{r['backend']} b{int(r['batch'])} kv{int(r['kv_len'])} (run {r['run_id']}): "
                      f"{r['eff_bandwidth_tbps']:.2f} TB/s, +{100 * r['over_ceiling']:.1f}% "
                      f"over {r['ceiling_tbps']:.2f}" for _, r in worst.head(6).iterrows())
    page.body.append(html.note(
        f"{text} {len(over)} record(s) beat the read ceiling their own run measured by more than both noises, "
        f"so that ceiling does not bound them: {names}. "
        "`foscar-bench ceiling` measures the searched ceiling; sweeps made since record it."))


def _n_records(n: int) -> str:
    return f"{n} record" + ("" if n == 1 else "s")


def _accuracy_section(page: _Page, records: pd.DataFrame) -> None:
    page.body.append(html.heading("5. Accuracy", "accuracy"))
    page.figure(
        accuracy.accuracy(records), "accuracy",
        "(5) Measured: relative L2 error of each backend's output against a float64 attention over "
        "the same source (median, whiskers min to max over records), beside the relative error of "
        "its quantized cache against the source alone.",
        records, "(5) No record carries a relative error: no accuracy plot.")
    page.table(tables.accuracy_table(records), "Relative L2 errors per backend and width.")
    page.table(tables.failed_gate_table(records),
               "Records that failed the accuracy gate (drawn in every figure above, never left out).")
