"""The report's end-to-end section: whole decode steps of a Llama-3-shaped model with each KV cache
format (`foscar-bench e2e`, tables e2e_runs/e2e_records of the store): tokens/s, capacity and
the step's split into attention and the rest, beside the paper's serving claim."""
from __future__ import annotations

import json

from pathlib import Path

import pandas as pd

from reports import catalog, html
from reports.plotting import kv_label, new_figure, plain_log_ticks, save

FORMATS = ("flashinfer-bf16-tc", "trtllm-xqa-fp8", "foscar-int4", "foscar-int2")
FORMAT_LABELS = {
    "flashinfer-bf16-tc": "BF16 (FlashInfer, tensor-core)",
    "trtllm-xqa-fp8": "FP8 (TensorRT-LLM XQA)",
    "foscar-int4": "INT4 (FOSCAR, ours)",
    "foscar-int2": "INT2 (FOSCAR, ours)",
}
BF16, FP8 = "flashinfer-bf16-tc", "trtllm-xqa-fp8"
KV_LENS = (4096, 32768, 131072)
BATCHES = (1, 8, 32, 128)
# FOSCAR.md section 6: peak aggregate throughput in SGLang at long context.
PAPER_SERVING = "up to +170% over a 2-bit baseline (2.70x) and +341% over a 16-bit one (4.41x)"
HONESTY = ("Ours is decode-only and synthetic: random weights and KV, every sequence at one context "
           "length, no prefill, no scheduler, no sampling beyond a greedy pick, one GPU. The paper's "
           "figures are a served workload (SGLang) and include all of that.")
EMPTY = "No e2e results in this store: run `foscar-bench e2e` on a GPU (the section then fills in)."


def label(backend: str) -> str:
    return FORMAT_LABELS.get(backend, catalog.label(backend))


def load(results) -> "pd.DataFrame":
    """The e2e records of the stores a report reads (several --db: each store's, together; the
    newest per point), or an empty frame."""
    from core.e2e_store import read_tables

    from reports.source import BUNDLED_DB

    dbs = [str(d) for d in getattr(results, "dbs", None) or [getattr(results, "db", "")] if d]
    parts = []
    for db in dbs:
        bundled = db.endswith("(bundled)")
        records = read_tables(BUNDLED_DB if bundled else Path(db), immutable=bundled).records
        if not records.empty:
            parts.append(records)
    # a run copied into two stores counts once: latest() keeps one record per point
    return latest(pd.concat(parts, ignore_index=True)) if parts else pd.DataFrame()


def e2e_only(db, names) -> "object | None":
    """A store file that holds `foscar-bench e2e` records and no sweep runs, as Results with no
    sweep records (None when it is not that, or when a run was named)."""
    from reports.source import from_frames

    if names:
        return None
    results = from_frames(pd.DataFrame(), pd.DataFrame(), db=str(db))
    try:
        return None if load(results).empty else results
    except Exception:  # noqa: BLE001 - not an e2e store either: the caller reports the first error
        return None


def latest(records: pd.DataFrame) -> pd.DataFrame:
    """One record per point (the newest): grid and check by batch, capacity by KV length."""
    if records.empty:
        return records
    df = records.copy()
    for col in ("batch", "kv_len", "tokens_per_s", "step_median_us", "step_mean_us", "attn_us", "rest_us",
                "attn_share", "capacity_batch", "logits_rel_error", "logits_tolerance", "top1_agreement",
                "step_p10_us", "step_p90_us", "flush_step_median_us", "num_layers", "model_layers"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
        else:
            df[col] = float("nan")
    df["point_batch"] = df["batch"].where(df["mode"] != "capacity", -1)
    df = df.sort_values(["started_at", "id"], kind="stable")
    keys = ["gpu_name", "model_label", "mode", "backend", "kv_len", "point_batch"]
    return df.drop_duplicates(keys, keep="last").drop(columns="point_batch")


def _order(backends) -> list[str]:
    known = [b for b in FORMATS if b in set(backends)]
    return known + sorted(set(backends) - set(known))


def _fmt_rate(row) -> str:
    if row["status"] == "passed":
        return f"{row['tokens_per_s']:.0f}"
    if row["status"] == "does_not_fit":
        return "does not fit"
    return row["status"].replace("_", " ")


def throughput_table(records: pd.DataFrame) -> pd.DataFrame:
    """Tokens/s (decode, every sequence at KV length L) per format, KV length and batch."""
    grid = records[records["mode"] == "grid"]
    rows = []
    for (gpu, model, kv), part in grid.groupby(["gpu_name", "model_label", "kv_len"], sort=True):
        for backend in _order(part["backend"].unique()):
            row = {"GPU": gpu, "model": model, "KV": kv_label(kv), "format": label(backend)}
            for _, r in part[part["backend"] == backend].sort_values("batch").iterrows():
                row[f"batch {int(r['batch'])}"] = _fmt_rate(r)
            rows.append(row)
    return pd.DataFrame(rows)


def capacity_table(records: pd.DataFrame) -> pd.DataFrame:
    """The largest batch the memory budget holds per format, its tokens/s and the ratios between formats."""
    cap = records[records["mode"] == "capacity"]
    rows = []
    for (gpu, model, kv), part in cap.groupby(["gpu_name", "model_label", "kv_len"], sort=True):
        ok = part[part["status"] == "passed"].set_index("backend")
        for backend in _order(part["backend"].unique()):
            r = part[part["backend"] == backend].iloc[0]
            row = {"GPU": gpu, "model": model, "KV": kv_label(kv), "format": label(backend),
                   "budget (GB)": _gb(r.get("budget_bytes")), "batch": _int(r["capacity_batch"])}
            if r["status"] != "passed":
                row.update({"tokens/s": r["status"].replace("_", " "), "step (ms)": "", "vs BF16": "", "vs FP8": ""})
            else:
                row["tokens/s"] = f"{r['tokens_per_s']:.0f}"
                row["step (ms)"] = f"{r['step_mean_us'] / 1e3:.2f}"
                for name, base in (("vs BF16", BF16), ("vs FP8", FP8)):
                    row[name] = _ratio(r["tokens_per_s"], ok["tokens_per_s"].get(base)) if backend != base else ""
            rows.append(row)
    return pd.DataFrame(rows)


def split_table(records: pd.DataFrame) -> pd.DataFrame:
    """The step's time in attention (full step - the same step with attention a no-op) and the rest."""
    ok = records[(records["mode"].isin(["grid", "capacity"])) & (records["status"] == "passed")]
    rows = []
    for _, r in ok.sort_values(["gpu_name", "model_label", "kv_len", "batch"]).iterrows():
        rows.append({
            "GPU": r["gpu_name"], "model": r["model_label"], "KV": kv_label(r["kv_len"]), "batch": int(r["batch"]),
            "point": r["mode"], "format": label(r["backend"]),
            "step median (ms)": f"{r['step_median_us'] / 1e3:.3f}",
            "p10-p90 (ms)": f"{r['step_p10_us'] / 1e3:.3f}-{r['step_p90_us'] / 1e3:.3f}",
            "attention (ms)": f"{r['attn_us'] / 1e3:.3f}", "rest (ms)": f"{r['rest_us'] / 1e3:.3f}",
            "attention share": f"{100 * r['attn_share']:.0f}%",
            "flush step (ms)": "" if pd.isna(r["flush_step_median_us"]) else f"{r['flush_step_median_us'] / 1e3:.3f}",
        })
    return pd.DataFrame(rows)


def check_table(records: pd.DataFrame) -> pd.DataFrame:
    chk = records[records["mode"] == "check"]
    rows = []
    for _, r in chk.iterrows():
        rows.append({
            "GPU": r["gpu_name"], "model": r["model_label"], "format": label(r["backend"]),
            "batch": _int(r["batch"]), "prefix": _int(r["kv_len"]),
            "logits rel. L2 vs float64 attention": "" if pd.isna(r["logits_rel_error"]) else f"{r['logits_rel_error']:.2e}",
            "attention a no-op: rel. L2": _sci(_extra(r, "noattn_logits_rel_error")),
            "bound": "" if pd.isna(r["logits_tolerance"]) else f"{r['logits_tolerance']:.3g}",
            "top-1 agreement": "" if pd.isna(r["top1_agreement"]) else f"{100 * r['top1_agreement']:.0f}%",
            "status": r["status"] + (f": {r['reason']}" if isinstance(r.get("reason"), str) and r["reason"] else ""),
        })
    return pd.DataFrame(rows)


def _extra(r, key: str):
    """A key of a record's extra_json (None where the record predates it)."""
    raw = r.get("extra_json")
    try:
        extra = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return None
    return extra.get(key) if isinstance(extra, dict) else None


def _sci(value) -> str:
    return "" if value is None or pd.isna(value) else f"{float(value):.2e}"


def _gb(value) -> str:
    return "" if value is None or pd.isna(value) else f"{float(value) / 1e9:.1f}"


def _int(value) -> str:
    return "" if value is None or pd.isna(value) else str(int(value))


def _ratio(mine, base) -> str:
    if base is None or pd.isna(base) or not base or pd.isna(mine):
        return ""
    r = float(mine) / float(base)
    return f"{r:.2f}x ({100 * (r - 1):+.0f}%)"


# --- figures -------------------------------------------------------------------------------------
def throughput_figure(records: pd.DataFrame):
    """Tokens/s against batch, a panel per KV length; capacity points as stars. None without data."""
    ok = records[(records["status"] == "passed") & (records["mode"].isin(["grid", "capacity"]))]
    if ok.empty:
        return None
    kvs = sorted(ok["kv_len"].unique())
    fig, axes = new_figure(ncols=len(kvs), width=3.3 * len(kvs) + 1.5, height=3.8)
    for ax, kv in zip(axes[0], kvs):
        part = ok[ok["kv_len"] == kv]
        for backend in _order(part["backend"].unique()):
            style = dict(color=catalog.color(backend), linestyle="-" if catalog.is_ours(backend) else "--")
            g = part[(part["backend"] == backend) & (part["mode"] == "grid")].sort_values("batch")
            if len(g):
                ax.plot(g["batch"], g["tokens_per_s"], marker="o", markersize=3, label=label(backend), **style)
            c = part[(part["backend"] == backend) & (part["mode"] == "capacity")]
            if len(c):
                ax.plot(c["batch"], c["tokens_per_s"], marker="*", markersize=10, linestyle="none",
                        color=style["color"], label=None if len(g) else label(backend))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain_log_ticks(ax)
        ax.set_title(f"KV {kv_label(kv)} tokens per sequence")
        ax.set_xlabel("batch (sequences); star: capacity batch")
    axes[0][0].set_ylabel("decode tokens/s")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4)
    return fig


def split_figure(records: pd.DataFrame):
    """Stacked bars per point: the rest of the step (grey) and attention (colour) in ms, on a linear
    scale so the two parts compare by height; the attention share above each bar."""
    ok = records[(records["status"] == "passed") & (records["mode"] == "grid")]
    if ok.empty:
        return None
    kvs = sorted(ok["kv_len"].unique())
    fig, axes = new_figure(ncols=len(kvs), width=3.6 * len(kvs) + 1.0, height=4.4)
    for ax, kv in zip(axes[0], kvs):
        part = ok[ok["kv_len"] == kv].copy()
        part["order"] = [FORMATS.index(b) if b in FORMATS else 99 for b in part["backend"]]
        part = part.sort_values(["batch", "order"])
        x = list(range(len(part)))
        rest, attn = part["rest_us"] / 1e3, part["attn_us"].clip(lower=0) / 1e3
        ax.bar(x, rest, color="#d9d9d9", edgecolor="white")
        ax.bar(x, attn, bottom=rest, color=[catalog.color(b) for b in part["backend"]], edgecolor="white")
        for xi, top, share in zip(x, rest + attn, part["attn_share"]):
            ax.annotate(f"{100 * share:.0f}%", (xi, top), ha="center", va="bottom", fontsize=6,
                        xytext=(0, 1), textcoords="offset points")
        ax.set_xticks(x)
        ax.set_xticklabels([f"b{int(b)} {_short(n)}" for b, n in zip(part["batch"], part["backend"])],
                           rotation=90, fontsize=7)
        ax.set_ylim(0, float((rest + attn).max()) * 1.12)
        ax.set_title(f"KV {kv_label(kv)}")
    axes[0][0].set_ylabel("median step time (ms): grey the rest, colour attention")
    fig.tight_layout()
    return fig


def _short(backend: str) -> str:
    return {"flashinfer-bf16-tc": "BF16", "trtllm-xqa-fp8": "FP8", "foscar-int4": "INT4",
            "foscar-int2": "INT2"}.get(backend, backend)


# --- the section ---------------------------------------------------------------------------------
def provenance(records: pd.DataFrame) -> str:
    runs = records.drop_duplicates("run_id").sort_values("started_at")
    parts = [f"run {r['run_id']} (git {str(r['git_sha'])[:8] if isinstance(r['git_sha'], str) else 'unknown'})"
             for _, r in runs.iterrows()]
    gpus = ", ".join(sorted(set(records["gpu_name"].dropna()))) or "unknown GPU"
    return f"GPU: {gpus}. {'; '.join(parts)}."


def section(page, results) -> None:
    """Append the e2e section to a report page (reports.report._Page: .body, .out)."""
    page.body.append(html.heading("6. End to end: whole decode steps of a Llama-3-shaped model", "e2e"))
    try:
        records = load(results)
    except Exception as exc:  # noqa: BLE001 - a broken e2e table must not take the report down
        page.body.append(html.note(f"The e2e tables of this store could not be read ({type(exc).__name__}: {exc})."))
        return
    if records.empty:
        page.body.append(html.note(EMPTY))
        return
    where = provenance(records)
    page.body.append(html.para(
        "Each step embeds the last token of every sequence, runs every layer (RMSNorm, QKV projection, RoPE, "
        "the new token's K and V appended to the cache in the format's own layout, attention over the whole "
        "cache, output projection, gated MLP), the LM head and a greedy pick, as one CUDA graph, with seeded "
        "random BF16 weights. Tokens/s = batch / mean step time (FOSCAR's mean includes the step that "
        "quantizes a completed group of 128 tokens, once every 128 steps). " + where, "meta"))
    _table(page, throughput_table(records), "e2e_throughput",
           "(6a) Measured: decode tokens/s at each batch and KV length (all sequences at that length); "
           "'does not fit': the KV cache and activations exceed the memory budget. " + where)
    page.body.append(html.note(f"The paper's serving claim: {PAPER_SERVING}. {HONESTY}"))
    _table(page, capacity_table(records), "e2e_capacity",
           "(6b) Measured, capacity mode: the largest batch of KV-length sequences each format holds within "
           "the memory budget (the GPU's free memory after the weights, less a reserve for workspaces and "
           "graphs), the tokens/s at that batch, and its ratio to BF16 and FP8 at the same KV length. The "
           "counterpart of the paper's +341% over 16-bit is the INT2 and INT4 'vs BF16' ratio; no 2-bit "
           "baseline runs here, so +170% has none. " + where)
    fig = throughput_figure(records)
    _figure(page, fig, "e2e_throughput", "(6c) Measured: decode tokens/s against batch, a panel per KV "
            "length; stars are the capacity points. " + where, "(6c) No passed e2e point: no plot.")
    _table(page, split_table(records), "e2e_split",
           "(6d) Measured: the step's time split. Attention = median full step - median of the same step with "
           "attention replaced by a no-op of the same shapes (the append stays in); rest = that step. Where "
           "the rest dominates, a faster attention kernel no longer moves tokens/s. " + where)
    _figure(page, split_figure(records), "e2e_split", "(6e) Measured: median step time split into attention "
            "(colour) and the rest (grey), per batch and format; the label is attention's share of the step. " + where, "(6e) No passed grid point: no plot.")
    _table(page, check_table(records), "e2e_check",
           "(6f) Checked: one full step's logits with the format's attention kernel against the same step "
           "with float64 attention over the format's own (dequantized) cache; relative L2 over all logits. "
           "Bound: the smaller of max(the backend's attention tolerance, the floor: 1e-2 up to 4 layers, 2e-2 "
           "deeper) and a quarter of the same step's error with attention a no-op, so that no tolerance "
           "passes a kernel that writes nothing (docs/E2E.md, \"Check\"; records before this rule show "
           "max(tolerance, floor) and no no-op column). " + where)


def _table(page, frame: pd.DataFrame, name: str, caption: str) -> None:
    if frame.empty:
        return
    csv = f"{name}.csv"
    frame.to_csv(Path(page.out) / csv, index=False)
    page.body.append(html.table(frame, caption, csv))


def _figure(page, fig, stem: str, caption: str, missing: str) -> None:
    if fig is None:
        page.body.append(html.note(missing))
        return
    files = save(fig, Path(page.out), stem)
    page.body.append(html.figure(files, caption, alt=stem))


def ratios(records: pd.DataFrame) -> list[str]:
    """One line per (GPU, model, KV) of capacity throughput ratios, for the command's summary."""
    lines = []
    if records.empty or "mode" not in records:
        return lines
    cap = records[(records["mode"] == "capacity") & (records["status"] == "passed")]
    for (gpu, model, kv), part in cap.groupby(["gpu_name", "model_label", "kv_len"]):
        rate = part.set_index("backend")["tokens_per_s"]
        batch = part.set_index("backend")["capacity_batch"]
        items = [f"{_short(b)} b{int(batch[b])} {rate[b]:,.0f} tok/s" for b in _order(rate.index)]
        rel = [f"{_short(b)}/{_short(base)} {rate[b] / rate[base]:.2f}x" for b in ("foscar-int4", "foscar-int2")
               for base in (BF16, FP8) if b in rate and base in rate and rate[base] > 0]
        lines.append(f"{model}, KV {kv_label(kv)}: " + ", ".join(items) + (" | " + ", ".join(rel) if rel else ""))
    return lines
