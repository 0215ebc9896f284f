"""Series over commits: what one series is, commit order, and pairing two points of the store for comparison."""
from __future__ import annotations

import pandas as pd

from core.record import TIMED_STATUSES
from reports import noise
from reports.plotting import kv_label
from reports.source import oldest_first
from reports.tables import commit

SHAPE_KEYS = ["batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim"]
FORMAT_KEYS = ["bits", "k_mode", "v_mode", "group_size", "page_size"]
SERIES_KEYS = ["gpu_name", "backend", *SHAPE_KEYS, *FORMAT_KEYS]


def shape_label(row) -> str:
    return (f"batch {int(row['batch'])}, KV {kv_label(row['kv_len'])}, "
            f"{int(row['num_q_heads'])}q/{int(row['num_kv_heads'])}kv heads, d {int(row['head_dim'])}")


def format_label(row) -> str:
    if row.get("k_mode") in (None, "none") or pd.isna(row.get("k_mode")):
        return f"{int(row['bits'])}-bit" if pd.notna(row.get("bits")) else ""
    return f"int{int(row['bits'])} g{int(row['group_size'])} K:{row['k_mode']} V:{row['v_mode']}"


def format_short(row) -> str:
    """'int2 g128 Kc Vt' (K channel-wise, V token-wise), or '16-bit'."""
    if row.get("k_mode") in (None, "none") or pd.isna(row.get("k_mode")):
        return f"{int(row['bits'])}-bit" if pd.notna(row.get("bits")) else ""
    return f"int{int(row['bits'])} g{int(row['group_size'])} K{row['k_mode'][0]} V{row['v_mode'][0]}"


def series_name(row) -> str:
    """A unique, readable benchmark name for exports."""
    return (f"{row['gpu_name']} / {row['backend']} / b{int(row['batch'])} kv{int(row['kv_len'])} "
            f"h{int(row['num_q_heads'])}x{int(row['num_kv_heads'])} d{int(row['head_dim'])} "
            f"{format_label(row)} p{int(row['page_size']) if pd.notna(row['page_size']) else '?'}")


def points(runs: pd.DataFrame) -> pd.DataFrame:
    """One point per code state, oldest first: a commit (sha plus dirty flag), or a run
    without a sha. Columns: point, label, sha, run_ids, started_at."""
    rows = {}
    for _, run in runs.sort_values("started_at").iterrows():
        sha = run["git_sha"] if isinstance(run["git_sha"], str) and run["git_sha"] else None
        dirty = run["git_dirty"] in (1, True, "1")
        key = (sha, dirty) if sha else ("run", run["run_id"])
        label = commit(sha, dirty) if sha else f"run {run['run_id']}"
        entry = rows.setdefault(key, {"label": label, "sha": sha, "run_ids": [], "started_at": run["started_at"]})
        entry["run_ids"].append(run["run_id"])
    out = pd.DataFrame(list(rows.values()), columns=["label", "sha", "run_ids", "started_at"])
    out.insert(0, "point", range(len(out)))
    return out


def latest_records(records: pd.DataFrame) -> pd.DataFrame:
    """The newest record of each series among `records` (reruns at one commit count once)."""
    return oldest_first(records).drop_duplicates(SERIES_KEYS, keep="last")


def per_point(records: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Records tagged with their point (commit) and reduced to one per (point, series)."""
    pts = points(runs)
    run_point = {rid: (p, label) for p, label, ids in zip(pts["point"], pts["label"], pts["run_ids"]) for rid in ids}
    recs = records[records["run_id"].isin(run_point)].copy()
    recs["point"] = recs["run_id"].map(lambda r: run_point[r][0])
    recs["point_label"] = recs["run_id"].map(lambda r: run_point[r][1])
    parts = [latest_records(g) for _, g in recs.groupby("point")]
    return pd.concat(parts) if parts else recs


TIMING_COLS = ["status", "median_us", "p10_us", "p90_us", "n_samples", "spread",
               "sm_clock_mhz_before", "sm_clock_mhz_after", "sm_clock_mhz_median", "gpu_uuid"]


def sample(row, suffix: str = "") -> noise.Sample:
    """One side of a pair as a noise.Sample; the clock is the one read under load (the median
    over the timed batches, or the last reading for records made before those were kept), the
    GPU the record's physical one (noise.judge is stricter across two)."""
    clock = None
    for col in ("sm_clock_mhz_median", "sm_clock_mhz_after", "sm_clock_mhz_before"):
        clock = row.get(col + suffix)
        if clock is not None and not pd.isna(clock):
            break
    uuid = row.get("gpu_uuid" + suffix)
    return noise.Sample(row["median_us" + suffix], row.get("p10_us" + suffix), row.get("p90_us" + suffix),
                        row.get("n_samples" + suffix), row.get("spread" + suffix), clock,
                        None if uuid is None or pd.isna(uuid) else str(uuid))


def pair(base: pd.DataFrame, head: pd.DataFrame, min_change: float,
         gpu_threshold: float = noise.CROSS_GPU_THRESHOLD) -> pd.DataFrame:
    """Every series in BASE or HEAD, with both medians, bands, the relative change of the
    median time, the noise of that change and a verdict: slower / faster / same /
    ambiguous (reports.noise; across two physical GPUs a change is called only beyond
    gpu_threshold), or a status change ('now <status>' when HEAD stopped passing, 'fixed',
    'new', 'gone')."""
    cols = [*SERIES_KEYS, *TIMING_COLS]
    lb, lh = latest_records(base), latest_records(head)
    for frame in (lb, lh):
        for col in TIMING_COLS:
            if col not in frame:
                frame[col] = float("nan")
    merged = lb[cols].merge(lh[cols], on=SERIES_KEYS, how="outer", suffixes=("_base", "_head"))
    rows = [_verdict(row, min_change, gpu_threshold) for _, row in merged.iterrows()]
    merged["change"] = [r[1] for r in rows]
    merged["noise"] = [r[2] for r in rows]
    merged["verdict"] = [r[0] for r in rows]
    merged["why"] = [r[3] for r in rows]
    return merged


def _verdict(row, min_change: float, gpu_threshold: float) -> tuple[str, float | None, float | None, str]:
    """A status change, or the timing judgement when both sides carry a time (passed, or
    `inaccurate`: a third-party baseline timed although its check failed)."""
    sb, sh = row["status_base"], row["status_head"]
    if pd.isna(sb):
        return "new", None, None, ""
    if pd.isna(sh):
        return "gone", None, None, ""
    timed = sb in TIMED_STATUSES and sh in TIMED_STATUSES and row["median_us_base"] > 0 and row["median_us_head"] > 0
    j = noise.judge(sample(row, "_base"), sample(row, "_head"), min_change, gpu_threshold=gpu_threshold) if timed else None
    if sb == "passed" and sh != "passed":
        return (f"now {sh}", j.change, j.noise, f"timed: {j.verdict}") if j else (f"now {sh}", None, None, "")
    if sb != "passed" and sh == "passed":
        return "fixed", None, None, ""
    if j is None:
        return "not timed", None, None, ""
    return j.verdict, j.change, j.noise, j.reason
