"""Where a launch's last microseconds go, from a kernel_lab timeline (`--timeline`, the JSON it
writes, gzipped or not): the CTAs' ends by their rank, CTA // SMs (a launch that fits the GPU
puts CTA c on an SM as its (c // SMs)-th: on the H200 at batch 128 the ranks end in that order,
docs/PERFORMANCE.md, seventeenth session), each CTA's rate per quarter of its item where the
build stamped the quarters (main 310882f on), and the GPU's aggregate rate over time, rebuilt
from each CTA's progress, linear between its stamps. The tail's cost is the launch's last trip
against the time its chunks would take at the rate the GPU held while every CTA ran. Without
the quarters a CTA's progress is linear from its first S to its last trip, which moves the late
work of the CTAs that speed up at the end into the main phase: the rate while all run is then an
upper bound, and so is the tail's cost.

    python3 scripts/timeline_tail.py docs/data/timeline_v31_b128.json.gz [--sms 132]

Counts what a CTA's first item ran (its chunks from the plan: chunks_per_split).
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

QUARTERS = ("first_s", "quarter1", "half", "quarter3", "last_trip")


def load(path: str) -> dict:
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def percentiles(values: list[float], qs=(10, 50, 90, 100)) -> list[float]:
    s = sorted(values)
    return [round(s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))], 1) for q in qs]


def progress(row: dict, chunks: int) -> list[tuple[float, float]]:
    """(time us, chunks done) points of one CTA's first item, from the stamps it has."""
    marks = {"first_s": 0.0, "quarter1": chunks // 4, "half": chunks // 2, "quarter3": 3 * chunks // 4,
             "last_trip": chunks}
    return [(row[name], float(done)) for name, done in marks.items() if row.get(name)]


def aggregate(curves: list[list[tuple[float, float]]], step: float) -> list[tuple[float, float]]:
    """The GPU's rate (chunks a us) at each step, each CTA's progress linear between its points."""
    end = max(c[-1][0] for c in curves if c)
    out, t = [], 0.0
    while t <= end:
        rate = 0.0
        for c in curves:
            for (t0, d0), (t1, d1) in zip(c, c[1:]):
                if t0 <= t < t1:
                    rate += (d1 - d0) / (t1 - t0)
                    break
        out.append((round(t, 3), rate))
        t += step
    return out


def analyse(tl: dict, sms: int, step: float = 5.0) -> dict:
    """The tail of one timeline entry of kernel_lab's JSON."""
    cold = tl.get("cold", tl)
    cols = cold["columns"]
    rows = [dict(zip(cols, r)) for r in cold["ctas"]]
    rows = [{k.removesuffix("_us"): v for k, v in r.items()} for r in rows]
    first = [r for r in rows if r["k"] == 0 and r.get("last_trip")]
    # Each CTA's end: the last trip of its last item.
    ends_of: dict[int, float] = {}
    for r in rows:
        if r.get("last_trip"):
            ends_of[r["cta"]] = max(ends_of.get(r["cta"], 0.0), r["last_trip"])
    ranks: dict[int, list[float]] = {}
    for cta, end in ends_of.items():
        ranks.setdefault(cta // sms, []).append(end)
    out = {"config": tl.get("config"), "variant": tl.get("variant"), "ctas": len(ends_of),
           "end_by_rank": {rank: {"n": len(v), "p10_median_p90_max": percentiles(v)} for rank, v in sorted(ranks.items())},
           "quarters": None, "tail": None}
    chunks = tl.get("chunks_per_split")
    if not chunks:
        return out
    has_quarters = all(r.get("quarter1") for r in first)
    if has_quarters:  # us a trip in each quarter of the item, median over the CTAs of each rank
        out["quarters"] = {
            rank: [round(statistics.median((r[b] - r[a]) / (chunks / 4) for r in first if r["cta"] // sms == rank), 3)
                   for a, b in zip(QUARTERS, QUARTERS[1:])]
            for rank in sorted(ranks)}
    curves = [progress(r, chunks) for r in first]
    agg = aggregate(curves, step)
    ends = sorted(r["last_trip"] for r in first)
    all_run = [rate for t, rate in agg if max(r["first_s"] for r in first) <= t < ends[0]]
    main_rate = statistics.median(all_run) if all_run else max(rate for _, rate in agg)
    start = statistics.median(r["first_s"] for r in first)
    ideal = start + len(first) * chunks / main_rate
    out["tail"] = {"main_rate_chunks_per_us": round(main_rate, 1), "first_end_us": round(ends[0], 1),
                   "last_end_us": round(ends[-1], 1), "ideal_end_us": round(ideal, 1),
                   "tail_cost_pct": round(100 * (ends[-1] - ideal) / ends[-1], 1),
                   "rate_after_first_end": [(t, round(r, 1)) for t, r in agg if t >= ends[0] - step][:: max(1, int(20 / step))]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline", help="kernel_lab's timeline JSON (.json or .json.gz)")
    ap.add_argument("--sms", type=int, default=132, help="SMs of the GPU it ran on (132: H100 SXM / H200)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    data = load(args.timeline)
    results = [analyse(tl, args.sms) for tl in data.get("timelines", [])]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for r in results:
        print(f"{r['config']} ({r['variant']}): {r['ctas']} CTAs")
        for rank, e in r["end_by_rank"].items():
            print(f"  rank {rank} ({e['n']} CTAs): its last trip p10 / median / p90 / max {e['p10_median_p90_max']} us")
        for rank, q in (r["quarters"] or {}).items():
            print(f"  rank {rank}: us a trip in each quarter of its item (median) {q}")
        if r["tail"]:
            t = r["tail"]
            print(f"  while all run: {t['main_rate_chunks_per_us']} chunks a us; first end {t['first_end_us']} us, "
                  f"last {t['last_end_us']} us; at that rate throughout {t['ideal_end_us']} us: the tail costs "
                  f"{t['tail_cost_pct']} %")
            print("  rate after the first end (us, chunks a us): " +
                  ", ".join(f"{a:g}: {b:g}" for a, b in t["rate_after_first_end"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
