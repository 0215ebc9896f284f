"""Report tables: paper bandwidth table beside ours, geomean speedups, accuracy and record status."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.case import MODELS
from reports import catalog, paper

HEADLINE_BATCH = 128
HEADLINE_KV = 32768
SHAPE = ["gpu_name", "batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim"]


@dataclass
class Table:
    """One table: `frame` is written to CSV as is; `display` is what the page shows."""

    name: str
    title: str
    frame: pd.DataFrame
    display: pd.DataFrame
    caption: str = ""
    notes: list[str] = field(default_factory=list)


def pct(value, qualifier: str = "") -> str:
    if qualifier == "n/a":
        return "n/a"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{qualifier + ' ' if qualifier else ''}{100 * value:.1f}%"


def num(value, fmt: str = "{:.3g}", qualifier: str = "") -> str:
    if qualifier == "n/a":
        return "n/a"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return (qualifier + " " if qualifier else "") + fmt.format(value)


def commit(sha, dirty=None) -> str:
    """A record's commit, short, '+dirty' when its tree was ('unknown' without one)."""
    if not isinstance(sha, str) or not sha:
        return "unknown"
    return sha[:8] + ("+dirty" if dirty in (1, True, "1") else "")


def fmt_label(row) -> str:
    if row.get("k_mode") in (None, "none") or pd.isna(row.get("k_mode")):
        return ""
    return f"K {row['k_mode']}, V {row['v_mode']}, g{int(row['group_size'])}"


HEADLINE_HEADS = MODELS["llama3-8b"]  # the paper's table: Llama-3-8B's query heads, KV heads, head_dim


def _at_paper_point(records: pd.DataFrame) -> pd.DataFrame:
    """The records at batch 128, KV 32K, whatever their heads."""
    return records[(records["batch"] == HEADLINE_BATCH) & (records["kv_len"] == HEADLINE_KV)]


def headline(records: pd.DataFrame) -> pd.DataFrame:
    """The records of the paper's bandwidth point: batch 128, KV 32K, Llama-3-8B's heads."""
    q, kv, d = HEADLINE_HEADS
    at = _at_paper_point(records)
    return at[(at["num_q_heads"] == q) & (at["num_kv_heads"] == kv) & (at["head_dim"] == d)]


def bandwidth_table(records: pd.DataFrame) -> Table:
    """Table 1: fraction of peak HBM bandwidth at batch 128, KV 32K, ours beside the paper's."""
    rows = []
    head = headline(records)
    for _, r in head.iterrows():
        rows.append(_bandwidth_row(r["backend"], r))
    measured = set(head["backend"])
    for backend in sorted(set(paper.load().query("table == 'bandwidth'")["backend"]) - measured - {""}):
        if not backend.endswith("*"):
            rows.append(_bandwidth_row(backend, None))
    for _, r in paper.load().query("table == 'bandwidth' and backend == ''").drop_duplicates("kernel").iterrows():
        rows.append(_bandwidth_row("", None, paper_kernel=r["kernel"]))
    frame = pd.DataFrame(rows)
    frame = frame.sort_values(["measured", "order", "gpu_name"], ascending=[False, True, True])
    # rows of ours from several commits (or runs of one) say where each was measured
    measured = frame[frame["measured"]]
    where = ("commit" if measured["commit"].nunique() > 1 else
             "run" if measured["run_id"].nunique() > 1 else None)
    frame = frame.drop(columns=["order", "measured"])
    notes = []
    other = _at_paper_point(records)
    if len(other) > len(head):
        q, kv, d = HEADLINE_HEADS
        notes.append(f"{len(other) - len(head)} record(s) at batch {HEADLINE_BATCH}, KV {HEADLINE_KV // 1024}K "
                     f"with other heads than Llama-3-8B's ({q} query, {kv} KV, head_dim {d}) are left out of this "
                     "table, which is the paper's; sections 3 and 4 plot them.")
    if head.empty:
        notes.append(
            f"No records at batch {HEADLINE_BATCH}, KV {HEADLINE_KV // 1024}K in the selected runs: "
            "only the paper's and reference values are shown (run the `paper` preset)."
        )
    return Table("bandwidth", "Fraction of peak HBM bandwidth at batch 128, KV 32K", frame,
                 _bandwidth_display(frame, where), notes=notes)


def _bandwidth_row(backend: str, r, paper_kernel: str = "") -> dict:
    h100 = paper.lookup("paper", "bandwidth", "frac_peak_hbm", backend, "H100") if backend else (None, "")
    b200 = paper.lookup("paper", "bandwidth", "frac_peak_hbm", backend, "B200") if backend else (None, "")
    if paper_kernel:
        hit = paper.load().query("table == 'bandwidth' and kernel == @paper_kernel")
        for gpu in ("H100", "B200"):
            g = hit[hit["gpu"] == gpu]
            pair = (None if g.empty or pd.isna(g["value"].iloc[0]) else float(g["value"].iloc[0]),
                    "" if g.empty else g["qualifier"].iloc[0])
            h100, b200 = (pair, b200) if gpu == "H100" else (h100, pair)
    ref, _ = paper.lookup("h200-ref", "bandwidth", "frac_peak_bus", backend) if backend else (None, "")
    target, tq = (paper.lookup("targets", "bandwidth", "frac_peak_bus", backend, batch=HEADLINE_BATCH,
                               kv_len=HEADLINE_KV) if backend else (None, ""))
    get = (lambda c: r[c]) if r is not None else (lambda c: None)
    return {
        "measured": r is not None,
        "order": catalog.sort_key(backend)[0] if backend else 99,
        "gpu_name": get("gpu_name") if r is not None else "",
        "backend": backend,
        "kernel": catalog.label(backend) if backend else f"{paper_kernel} (no backend of ours runs it)",
        "bits": get("bits"),
        "format": fmt_label(r) if r is not None else "",
        "status": get("status") if r is not None else "not in the selected runs",
        "run_id": get("run_id") if r is not None else "",
        "commit": commit(get("git_sha"), r.get("git_dirty")) if r is not None else "",
        "median_us": get("median_us"),
        "eff_bandwidth_tbps": get("eff_bandwidth_tbps"),
        "frac_peak_bus": get("frac_peak_bus"),
        "frac_peak_datasheet": get("frac_peak_datasheet"),
        "frac_read_ceiling": get("frac_read_ceiling"),
        "paper_h100": h100[0], "paper_h100_qualifier": h100[1],
        "paper_b200": b200[0], "paper_b200_qualifier": b200[1],
        "h200_reference_frac_bus": ref,
        "target_frac_bus": target, "target_qualifier": tq,
    }


def _bandwidth_display(frame: pd.DataFrame, where: str | None = None) -> pd.DataFrame:
    """The page's table; `where` ('commit' or 'run'): a column saying where each measured row
    comes from, when they come from more than one."""
    if frame.empty:
        return frame
    out = pd.DataFrame({
        "GPU": frame["gpu_name"],
        "kernel": frame["kernel"],
        "bits": [num(b, "{:.0f}") for b in frame["bits"]],
        "format": frame["format"],
        **({where: frame["commit" if where == "commit" else "run_id"]} if where else {}),
        "status": frame["status"],
        "time (ms)": [num(v / 1000 if v == v and v is not None else None, "{:.3f}") for v in frame["median_us"]],
        "eff. bandwidth (TB/s)": [num(v, "{:.2f}") for v in frame["eff_bandwidth_tbps"]],
        "of bus peak": [pct(v) for v in frame["frac_peak_bus"]],
        "of datasheet peak": [pct(v) for v in frame["frac_peak_datasheet"]],
        "of read ceiling": [pct(v) for v in frame["frac_read_ceiling"]],
        "paper H100": [pct(v, q) for v, q in zip(frame["paper_h100"], frame["paper_h100_qualifier"])],
        "paper B200": [pct(v, q) for v, q in zip(frame["paper_b200"], frame["paper_b200_qualifier"])],
        "our H200 ref. (h200-ref)": [pct(v) for v in frame["h200_reference_frac_bus"]],
        "target (targets)": [pct(v, q) for v, q in zip(frame["target_frac_bus"], frame["target_qualifier"])],
    })
    return out


OURS_FORMAT = ["k_mode", "v_mode", "group_size"]
RECORD_OF = ["run_id", "git_sha", "git_dirty"]  # where a record of ours was measured


def case_speedups(records: pd.DataFrame) -> pd.DataFrame:
    """Per case: our kernel's time, in one K/V format, against each baseline's on the same
    shape and GPU.

    Our records count when they passed; a baseline's when it carries a time, `inaccurate`
    ones too (a third party timed although its check failed), flagged in `over_inaccurate`.
    A baseline that ran one shape in several formats (e.g. two K/V modes) contributes the
    median of its times for that shape; each format of ours is a case of its own, and records of
    ours that differ only in page size or seed count once, with their median.
    """
    ok = catalog.timed(records)
    ours = ok[[catalog.is_ours(b, f) and st == "passed" for b, f, st in zip(ok["backend"], ok["family"], ok["status"])]]
    base = ok[[catalog.is_baseline(b, f) for b, f in zip(ok["backend"], ok["family"])]]
    if ours.empty or base.empty:
        return pd.DataFrame(columns=[*SHAPE, "backend", *OURS_FORMAT, *RECORD_OF, "over", "ours_us", "over_us",
                                     "speedup", "over_inaccurate"])
    base = base.assign(over_inaccurate=base["status"] == "inaccurate")
    base_t = base.groupby([*SHAPE, "backend"], as_index=False).agg(
        median_us=("median_us", "median"), over_inaccurate=("over_inaccurate", "any"))
    base_t = base_t.rename(columns={"backend": "over", "median_us": "over_us"})
    # One case per shape and format of ours, as for the baselines: records of one shape that
    # differ only in what the shape leaves out (page size, seed) count once, with their median
    # time and the last record's run and commit.
    ours = ours.groupby([*SHAPE, "backend", *OURS_FORMAT], as_index=False, dropna=False).agg(
        median_us=("median_us", "median"), **{c: (c, "last") for c in RECORD_OF})
    pairs = ours[[*SHAPE, "backend", *OURS_FORMAT, *RECORD_OF, "median_us"]].merge(base_t, on=SHAPE)
    pairs = pairs.rename(columns={"median_us": "ours_us"})
    pairs["speedup"] = pairs["over_us"] / pairs["ours_us"]
    return pairs


def speedup_table(records: pd.DataFrame) -> Table:
    """Table 2: geometric-mean speedup of each of our kernels, per K/V format, over each
    baseline: one row per (GPU, kernel, format, baseline), each over that format's own cases
    (as suite.readfloor.speedup_bounds groups them), naming the commits ours ran at."""
    pairs = case_speedups(records)
    rows = []
    keys = ["gpu_name", "backend", *OURS_FORMAT, "over"]
    for (gpu, ours, k_mode, v_mode, group, over), g in pairs.groupby(keys, dropna=False):
        h100 = paper.lookup("paper", "speedup", "speedup_geomean", ours, "H100", over)
        b200 = paper.lookup("paper", "speedup", "speedup_geomean", ours, "B200", over)
        target = paper.lookup("targets", "speedup", "speedup_geomean", ours, None, over)
        rows.append({
            "gpu_name": gpu, "kernel": ours,
            "format": fmt_label({"k_mode": k_mode, "v_mode": v_mode, "group_size": group}),
            "over": over, "n_cases": len(g),
            "n_over_inaccurate": int(g["over_inaccurate"].sum()),
            "geomean_speedup": float(np.exp(np.log(g["speedup"]).mean())),
            "min_speedup": g["speedup"].min(), "max_speedup": g["speedup"].max(),
            "batches": ",".join(str(int(b)) for b in sorted(g["batch"].unique())),
            "kv_lens": ",".join(str(int(k)) for k in sorted(g["kv_len"].unique())),
            "ours_commits": ",".join(sorted({commit(s, d) for s, d in zip(g["git_sha"], g["git_dirty"])})),
            "ours_runs": ",".join(sorted({str(r) for r in g["run_id"]})),
            "paper_h100": h100[0], "paper_h100_qualifier": h100[1],
            "paper_b200": b200[0], "paper_b200_qualifier": b200[1],
            "target": target[0], "target_qualifier": target[1],
        })
    frame = pd.DataFrame(rows)
    notes = []
    if frame.empty:
        notes.append("No case where one of our kernels and a baseline both passed on the same "
                     "shape and GPU: no speedups to show.")
        return Table("speedups", "Geometric-mean speedups", frame, frame, notes=notes)
    frame = frame.sort_values(["gpu_name", "kernel", "format", "over"],
                              key=lambda s: s.map(lambda v: catalog.sort_key(v)) if s.name in ("kernel", "over") else s)
    display = pd.DataFrame({
        "GPU": frame["gpu_name"],
        "ours": frame["kernel"].map(catalog.label),
        "format": frame["format"],
        "ours at commit": frame["ours_commits"].str.replace(",", ", "),
        "over": frame["over"].map(catalog.label),
        "cases": frame["n_cases"],
        "of which over an inaccurate baseline": frame["n_over_inaccurate"],
        "geomean speedup": [f"{v:.2f}x" for v in frame["geomean_speedup"]],
        "range": [f"{a:.2f}x to {b:.2f}x" for a, b in zip(frame["min_speedup"], frame["max_speedup"])],
        "paper H100": [num(v, "{:.2f}x", q) for v, q in zip(frame["paper_h100"], frame["paper_h100_qualifier"])],
        "paper B200": [num(v, "{:.2f}x", q) for v, q in zip(frame["paper_b200"], frame["paper_b200_qualifier"])],
        "target (targets, H200 grid)": [num(v, "{:.1f}x", q) for v, q in zip(frame["target"], frame["target_qualifier"])],
    })
    return Table("speedups", "Geometric-mean speedups of our kernels, per K/V format", frame, display, notes=notes)


def accuracy_table(records: pd.DataFrame) -> Table:
    """Table 5: each backend's error against float64 beside its quantization's own error."""
    have = records[records["rel_error"].notna() | records["quant_rel_error"].notna()]
    if have.empty:
        empty = pd.DataFrame()
        return Table("accuracy", "Accuracy", empty, empty,
                     notes=["No record carries a relative error: nothing to show."])
    rows = []
    for (gpu, backend, bits), g in have.groupby(["gpu_name", "backend", "bits"], dropna=False):
        rows.append({
            "gpu_name": gpu, "backend": backend, "bits": bits, "n_records": len(g),
            "n_incorrect": int((g["status"] == "incorrect").sum()),
            "n_inaccurate": int((g["status"] == "inaccurate").sum()),
            "rel_error_median": g["rel_error"].median(), "rel_error_max": g["rel_error"].max(),
            "quant_rel_error_median": g["quant_rel_error"].median(),
            "quant_rel_error_max": g["quant_rel_error"].max(),
        })
    frame = pd.DataFrame(rows).sort_values(["gpu_name", "backend"], key=_order_key)
    display = pd.DataFrame({
        "GPU": frame["gpu_name"], "backend": frame["backend"].map(catalog.label),
        "bits": [num(b, "{:.0f}") for b in frame["bits"]], "records": frame["n_records"],
        "incorrect": frame["n_incorrect"], "inaccurate (timed)": frame["n_inaccurate"],
        "rel. error vs float64, median": [num(v, "{:.2e}") for v in frame["rel_error_median"]],
        "max": [num(v, "{:.2e}") for v in frame["rel_error_max"]],
        "quantization alone, median": [num(v, "{:.2e}") for v in frame["quant_rel_error_median"]],
        "max ": [num(v, "{:.2e}") for v in frame["quant_rel_error_max"]],
    })
    return Table("accuracy", "Relative L2 error", frame, display)


def failed_gate_table(records: pd.DataFrame) -> Table:
    """Every record that failed the accuracy gate: the figures draw them (a red X on the
    axis when untimed, hollow when timed); this lists them."""
    bad = records[records["status"].isin(catalog.GATE_FAILED)]
    if bad.empty:
        empty = pd.DataFrame()
        return Table("failed_gate", "Failed the accuracy gate", empty, empty,
                     notes=["No record failed the accuracy gate."])
    bad = bad.sort_values(["gpu_name", "backend", "batch", "kv_len"], key=_order_key)
    frame = bad[["gpu_name", "backend", "git_sha", "batch", "kv_len", "bits", "k_mode", "v_mode", "group_size",
                 "status", "rel_error", "median_us", "reason"]].reset_index(drop=True)
    display = pd.DataFrame({
        "GPU": frame["gpu_name"], "backend": frame["backend"].map(catalog.label),
        "commit": frame["git_sha"].fillna("").map(lambda t: str(t)[:7]),
        "batch": [num(v, "{:.0f}") for v in frame["batch"]], "KV": [num(v, "{:.0f}") for v in frame["kv_len"]],
        "format": [fmt_label(r) or f"{r['bits']:.0f}-bit" for _, r in frame.iterrows()],
        "status": frame["status"], "rel. error": [num(v, "{:.2e}") for v in frame["rel_error"]],
        "time (µs)": [num(v, "{:.1f}") for v in frame["median_us"]],
        "reason": frame["reason"].fillna("").map(lambda t: str(t)[:160]),
    })
    return Table("failed_gate", "Records that failed the accuracy gate", frame, display)


def status_table(records: pd.DataFrame) -> Table:
    """How many records of each backend passed, failed or were skipped, with a reason."""
    if records.empty:
        empty = pd.DataFrame()
        return Table("status", "Record status", empty, empty, notes=["The selected runs hold no records."])
    rows = []
    for (gpu, backend, status), g in records.groupby(["gpu_name", "backend", "status"], dropna=False):
        reasons = g["reason"].dropna()
        rows.append({"gpu_name": gpu, "backend": backend, "status": status, "records": len(g),
                     "example_reason": str(reasons.iloc[0])[:200] if len(reasons) else ""})
    frame = pd.DataFrame(rows).sort_values(["gpu_name", "backend"], key=_order_key)
    display = frame.rename(columns={"gpu_name": "GPU", "example_reason": "reason (first)"})
    display["backend"] = display["backend"].map(catalog.label)
    return Table("status", "Record status per backend", frame, display)


def _order_key(col: pd.Series) -> pd.Series:
    return col.map(lambda v: catalog.sort_key(v)) if col.name == "backend" else col
