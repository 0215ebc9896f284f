"""Exports for other dashboards: github-action-benchmark custom*IsBetter JSON and Bencher's BMF."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from reports.series import series_name


def _timed(records: pd.DataFrame) -> pd.DataFrame:
    return records[(records["status"] == "passed") & (records["median_us"] > 0)]


def github_action_benchmark(records: pd.DataFrame, bigger: bool = False) -> list[dict]:
    """Entries {name, unit, value, range, extra}; smaller: median time in us, bigger: TB/s."""
    out = []
    for _, r in _timed(records).iterrows():
        extra = f"p10..p90 {r['p10_us']:.2f}..{r['p90_us']:.2f} us; run {r['run_id']}; status {r['status']}"
        if bigger:
            if not r["eff_bandwidth_tbps"] > 0:
                continue
            value, unit = float(r["eff_bandwidth_tbps"]), "TB/s"
            band = [r["bytes"] / (t * 1e-6) / 1e12 for t in (r["p90_us"], r["p10_us"])] if r["bytes"] > 0 else []
        else:
            value, unit = float(r["median_us"]), "us"
            band = [r["p10_us"], r["p90_us"]]
        half = (band[1] - band[0]) / 2 if len(band) == 2 and pd.notna(band[0]) and pd.notna(band[1]) else None
        entry = {"name": series_name(r), "unit": unit, "value": round(value, 4), "extra": extra}
        if half is not None:
            entry["range"] = f"± {half:.3g}"
        out.append(entry)
    return out


def bencher_metric_format(records: pd.DataFrame) -> dict:
    """{benchmark: {"latency": {value, lower_value, upper_value} in ns, "throughput": TB/s}}."""
    out = {}
    for _, r in _timed(records).iterrows():
        lat = {"value": float(r["median_us"]) * 1e3}
        if pd.notna(r["p10_us"]) and pd.notna(r["p90_us"]):
            lat.update(lower_value=float(r["p10_us"]) * 1e3, upper_value=float(r["p90_us"]) * 1e3)
        measures = {"latency": lat}
        if r["eff_bandwidth_tbps"] > 0:
            measures["throughput"] = {"value": float(r["eff_bandwidth_tbps"])}
        out[series_name(r)] = measures
    return out


def write_exports(per_point: pd.DataFrame, out_dir: Path) -> list[str]:
    """Write every commit's files under out_dir/exports; returns their relative paths
    (the newest commit's also as latest-*.json)."""
    root = out_dir / "exports"
    root.mkdir(parents=True, exist_ok=True)
    written = []
    last = per_point["point"].max() if len(per_point) else None
    for point, recs in per_point.groupby("point"):
        label = str(recs["point_label"].iloc[0]).replace(" ", "-").replace("+", "-")
        files = {
            f"{label}-customSmallerIsBetter.json": github_action_benchmark(recs),
            f"{label}-customBiggerIsBetter.json": github_action_benchmark(recs, bigger=True),
            f"{label}-bencher-bmf.json": bencher_metric_format(recs),
        }
        if point == last:
            files.update({
                "latest-customSmallerIsBetter.json": files[f"{label}-customSmallerIsBetter.json"],
                "latest-customBiggerIsBetter.json": files[f"{label}-customBiggerIsBetter.json"],
                "latest-bencher-bmf.json": files[f"{label}-bencher-bmf.json"],
            })
        for name, data in files.items():
            (root / name).write_text(json.dumps(data, indent=1), encoding="utf-8")
            written.append(f"exports/{name}")
    return written
