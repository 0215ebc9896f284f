"""Caption text: what was measured, on which GPU, from which runs and commits, and when."""
from __future__ import annotations

import pandas as pd


def _commit(sha, dirty) -> str:
    if not isinstance(sha, str) or not sha:
        return "unknown commit"
    return f"git {sha[:8]}" + (" with uncommitted changes" if dirty in (1, True, "1") else "")


def provenance(records: pd.DataFrame, runs: pd.DataFrame) -> str:
    """'NVIDIA H200; run R (git abc12345), 2025-01-01 10:00 UTC' for the runs in `records`."""
    gpus = sorted(set(records["gpu_name"].dropna())) or ["unknown GPU"]
    used = runs[runs["run_id"].isin(set(records["run_id"]))].sort_values("started_at")
    parts = []
    for _, run in used.iterrows():
        when = str(run["started_at"] or "unknown time").replace("T", " ").replace("+00:00", " UTC")
        parts.append(f"run {run['run_id']} ({_commit(run['git_sha'], run['git_dirty'])}), {when}")
    runs_text = "; ".join(parts) if parts else "no run information"
    policies = sorted(set(records["l2_policy"].dropna()))
    l2 = f" L2: {', '.join(policies)}." if policies else ""
    throttled = pd.to_numeric(records["throttled"], errors="coerce").fillna(0).astype(bool).sum()
    clocks = f" {throttled} of {len(records)} records ran with clocks throttled." if throttled else ""
    return f"GPU: {', '.join(gpus)}. {runs_text}.{l2}{clocks}"


def caption(what: str, records: pd.DataFrame, runs: pd.DataFrame) -> str:
    return f"{what} {provenance(records, runs)}"
