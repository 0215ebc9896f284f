"""The measured read floor, and the speedup bound that follows from it.

The read ceiling (suite.readceiling) is a bandwidth: what a streaming read reaches once
launch and tail have faded, over gigabytes. Small decode steps never get there: at batch 1
and 4K tokens every kernel, ours and the baselines, sits on a floor of launch and cold-DRAM
latency. The read floor is that floor measured: for each byte count N, the shortest time
in which any of several read kernels reads N bytes, timed as the sweep times a decode step
of N bytes (suite.timing.time_gpu with CUDA graphs; L2 kept cold by rotated copies or a
flush). The sweep picks rotation or a flush by a case's shape (suite.runner.plan_l2), which
N alone does not name: the floor times N as the run's records of N bytes were timed when
it has them (floor_policies), and otherwise rotates up to the sweep's per-backend cap of
copies, as the sweep does for N bytes whenever the shape rotates (floor_plan).

No kernel moves N bytes from cold DRAM faster than the best read of N bytes does, so on a
case where our kernel moves N bytes (the byte model's `bytes`), baseline_us / floor_us(N)
is the most any kernel of ours could gain over that baseline on this GPU, and the
geometric mean of those bounds over a grid is the most its geometric-mean speedup could
be. A target above that mean is out of reach, measured.

Everything but `measure_read_floor` is pure logic, tested on the CPU with a fake timer and
fake records: the sizes to measure, the candidates per size, the search, the curve and
its interpolation, the bound table.
"""
from __future__ import annotations

import math
import re
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from core.record import TIMED_STATUSES
from suite.readceiling import Candidate, Result, by_time, search
from suite.runner import MAX_ROTATE_COPIES_SHAPE  # the sweep's cap on one backend's rotated copies
from suite.summary import kv_text
from suite.timing import L2_ASSUMED_BYTES, L2Plan, StopRule, flush_plan, l2_plan

OURS = ("foscar-int4", "foscar-int2")
BASELINES = ("flashinfer-bf16-tc", "trtllm-xqa-fp8")
SHAPE = ("batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim")
FORMAT = ("k_mode", "v_mode", "group_size")

# The default ladder when no records name the sizes: 256 KiB to 8 GiB, two points per octave.
LADDER_MIN_BYTES = 256 << 10
LADDER_MAX_BYTES = 8 << 30
LADDER_PER_OCTAVE = 2
MIN_BYTES = 4 << 10  # below this no candidate reads a whole tile

# Each candidate reads whole tiles of its own size, so it reads N rounded down: a floor
# that errs low, the safe side for a bound. A candidate whose tiles would leave more than
# this fraction of N unread is not tried at that size (the smallest tile, 2 KiB, always is).
MAX_SHORTFALL = 1 / 64
MAX_INT32_PER_LANE = 64  # as the ceiling's search: more spills registers

# One launch per program (grid = N / tile) at tiles from 2 KiB to 64 KiB, so that small N
# still spreads over every SM; at least one 16-byte load per lane.
TILED_SHAPES = tuple((tile, warps) for tile in (512, 1024, 2048, 4096, 8192, 16384) for warps in (4, 8)
                     if 4 <= tile // (32 * warps) <= MAX_INT32_PER_LANE)
QUICK_TILED_SHAPES = ((1024, 4), (4096, 8), (8192, 8))
PERSISTENT_PER_SM = (1, 2, 4)
PERSISTENT_SHAPES = ((8192, 8), (16384, 8))

FINALISTS = 3
ROUNDS = 2
# Sampling: the sweep's StopRule asks for 50 ms of kernel time per case, which over some 30
# sizes and a dozen candidates each would take minutes. On an H200 the medians it gives for
# reads of 2.4 to 75 MB matched these shorter rules' within the call-to-call scatter (the
# events tick in 32 ns, 0.6 % of a 5 us read; at flush sizes the samples of one call fall
# in two modes some 4 % apart), so the floor asks for 1 % and caps each timing's length.
SCREEN_RULE = StopRule(target_spread=0.02, min_samples=10, min_time_s=0.0, max_time_s=0.1, max_samples=200)
FINAL_RULE = StopRule(target_spread=0.01, min_samples=25, min_time_s=0.002, max_time_s=0.25, max_samples=2000)


# --- sizes ----------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_size(text: str) -> int:
    """'4MB' -> 4_000_000, '4MiB' -> 4_194_304, '2375812' -> 2375812 (KB/MB/GB are powers of
    1000, KiB/MiB/GiB of 1024). ValueError, in one sentence naming the text, otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"size {text!r} is not a byte count; write e.g. 2375812, 256KiB, 4MB or 1.5GB.")
    nbytes = int(float(m.group(1)) * _UNITS[unit])
    if nbytes < MIN_BYTES:
        raise ValueError(f"size {text!r} is {nbytes} bytes, under the {MIN_BYTES} bytes the read kernels need.")
    return nbytes


def parse_sizes(text: str) -> list[int]:
    """A comma list of sizes (parse_size), sorted, each once."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"--sizes {text!r} names no size; write e.g. 1MB,4MB,64MB.")
    return sorted({parse_size(p) for p in parts})


def ladder(lo: int = LADDER_MIN_BYTES, hi: int = LADDER_MAX_BYTES, per_octave: int = LADDER_PER_OCTAVE) -> list[int]:
    """Geometric sizes from lo to hi, `per_octave` to each doubling, rounded to 4 KiB."""
    steps = round(math.log2(hi / lo) * per_octave)
    out = {int(round(lo * 2 ** (i / per_octave) / 4096)) * 4096 for i in range(steps + 1)}
    return sorted(out)


def _num(value: Any) -> float | None:
    """A float, or None for missing, NaN and non-numbers (records from pandas carry NaN)."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def sizes_from_records(records: Iterable[Mapping[str, Any]], backends: Sequence[str] = OURS) -> list[int]:
    """The distinct byte counts (the byte model's `bytes`) of the passed records of `backends`:
    the sizes the bound needs a floor at."""
    out = set()
    for r in records:
        nbytes = _num(r.get("bytes"))
        if r.get("backend") in backends and r.get("status") == "passed" and nbytes and nbytes >= MIN_BYTES:
            out.add(int(nbytes))
    return sorted(out)


def recorded_policy(policy: Any) -> str | None:
    """'rotate' for a record timed over rotated copies ('rotate:N', or 'size': one copy over
    4x L2), 'flush' for a flushed one, None for anything else (a CPU record, no policy)."""
    if not isinstance(policy, str):
        return None
    if policy == "size" or policy.startswith("rotate"):
        return "rotate"
    return "flush" if policy == "flush" else None


def floor_policies(records: Iterable[Mapping[str, Any]], backends: Sequence[str] = OURS) -> dict[int, str]:
    """{bytes: 'rotate' | 'flush'} for the sizes of sizes_from_records: how their records
    were timed (their l2_policy), for the floor to time those bytes alike. Where records of
    one size disagree, 'rotate': the faster floor, the safe side of a bound."""
    out: dict[int, str] = {}
    for r in records:
        nbytes, how = _num(r.get("bytes")), recorded_policy(r.get("l2_policy"))
        if r.get("backend") in backends and r.get("status") == "passed" and nbytes and nbytes >= MIN_BYTES and how:
            out[int(nbytes)] = "rotate" if "rotate" in (how, out.get(int(nbytes))) else how
    return dict(sorted(out.items()))


# --- candidates and the search --------------------------------------------------------------
def read_bytes(c: Candidate, nbytes: int) -> int:
    """The bytes candidate `c` reads for a request of `nbytes`: whole tiles only."""
    tile_bytes = 4 * c.get("tile")
    return nbytes // tile_bytes * tile_bytes


def floor_candidates(nbytes: int, sm_count: int, quick: bool = False) -> list[Candidate]:
    """The read kernels worth trying on `nbytes`: tiled launches with one program per tile
    (the grid sized to N), and, where N holds more tiles than a persistent grid has
    programs, persistent grids of k x SMs programs. Shapes whose whole tiles would leave
    more than MAX_SHORTFALL of N unread are left out, but for the smallest tile."""
    out: list[Candidate] = []
    tiled = QUICK_TILED_SHAPES if quick else TILED_SHAPES
    for tile, warps in tiled:
        out.append(Candidate("tiled", (("tile", tile), ("warps", warps))))
    for k in ((2,) if quick else PERSISTENT_PER_SM):
        for tile, warps in PERSISTENT_SHAPES[:1] if quick else PERSISTENT_SHAPES:
            if nbytes // (4 * tile) > k * sm_count:
                out.append(Candidate("persistent", (("programs", k * sm_count), ("tile", tile),
                                                    ("warps", warps), ("cache", ".cg"))))
    smallest = min(tile for tile, _ in tiled)
    return [c for c in out if read_bytes(c, nbytes) > 0
            and (read_bytes(c, nbytes) >= (1 - MAX_SHORTFALL) * nbytes or c.get("tile") == smallest)]


def point_of(nbytes: int, results: Sequence[Result], facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One size's record: the fastest finalist's median time (over rounds) as the floor,
    with its spread, the bandwidth it read at, and how L2 was kept cold (`facts`)."""
    point: dict[str, Any] = {"bytes": int(nbytes)}
    timed = [r for r in results if r.rounds and r.median_us == r.median_us]  # search's order: best first
    if not timed:
        point.update(median_us=None, note="no read kernel ran at this size")
    else:
        best = timed[0]
        point.update(
            median_us=best.median_us,
            spread=best.spread,
            tbps=best.bytes_read / (best.median_us * 1e-6) / 1e12,
            bytes_read=best.bytes_read,
            candidate=best.candidate.name,
            rounds=len(best.rounds),
            screened=len(results),
            runners_up=[{"name": r.candidate.name, "median_us": r.median_us, "rounds": len(r.rounds)}
                        for r in timed[1:4]],
        )
    point.update({k: v for k, v in (facts or {}).items() if k not in point})
    return point


def search_floor(sizes: Sequence[int], candidates_for: Callable[[int], Sequence[Candidate]],
                 time_one: Callable[[int, Candidate, bool], tuple[float, float]],
                 prepare: Callable[[int], Mapping[str, Any]] | None = None,
                 finalists: int = FINALISTS, rounds: int = ROUNDS,
                 on_point: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """For each size (ascending): prepare(n) (buffers; returns facts such as the L2 policy, or
    raises to skip the size), then readceiling.search over candidates_for(n), ranked by time,
    time_one(n, candidate, final) -> (median_us, spread). Returns one point per size
    (point_of), smallest first."""
    points = []
    for n in sorted(set(int(s) for s in sizes)):
        try:
            facts = dict(prepare(n)) if prepare else {}
        except Exception as exc:  # noqa: BLE001 - one size that cannot be set up is a note, not the end
            point = {"bytes": n, "median_us": None, "note": f"not measured: {type(exc).__name__}: {exc}"}
        else:
            cands = list(candidates_for(n))
            results = search(cands, lambda c, n=n: read_bytes(c, n), lambda c, final, n=n: time_one(n, c, final),
                             finalists=finalists, rounds=rounds, rank=by_time)
            point = point_of(n, results, facts)
        points.append(point)
        if on_point:
            on_point(point)
    return points


FLOOR_RULE_RECORDS = "as its records"  # L2Plan.rule of a size timed as the run's records of it were
FLOOR_RULE_SIZE = "by size"  # of a size without records: rotated up to the cap, flushed beyond


def floor_plan(nbytes: int, l2_bytes: int | None, recorded: str | None = None,
               max_copies: int = MAX_ROTATE_COPIES_SHAPE) -> L2Plan:
    """How the floor keeps L2 cold for a read of `nbytes`. The sweep decides by the shape
    (suite.runner.plan_l2), so the floor follows the records: `recorded` 'flush' flushes and
    'rotate' rotates copies of nbytes (this GPU's count, up to `max_copies`), as the run's
    records of nbytes were timed. With no record (None: --sizes, the ladder) it rotates up to
    `max_copies` and flushes beyond, as the sweep times nbytes whenever the shape rotates; a
    size whose shape would flush is then timed with its code warm, faster than its case:
    a bound from it is looser, still a bound."""
    if recorded not in (None, "rotate", "flush"):
        raise ValueError(f"recorded={recorded!r} is not 'rotate', 'flush' or None.")
    if recorded == "flush":
        return replace(flush_plan(l2_bytes, "as the records of this size were timed"), rule=FLOOR_RULE_RECORDS)
    plan = l2_plan(nbytes, l2_bytes, max_copies)
    if recorded is None:
        why = f"by size: rotated up to {max_copies} copies, flushed beyond"
    elif plan.policy == "flush":
        why = f"the records of this size rotated, but this GPU would need more than {max_copies} copies"
    else:
        why = "as the records of this size were timed"
    return replace(plan, detail=f"{plan.detail}; {why}", rule=FLOOR_RULE_RECORDS if recorded else FLOOR_RULE_SIZE)


def l2_facts(nbytes: int, l2_bytes: int | None, recorded: str | None = None) -> dict[str, Any]:
    """How the floor keeps L2 cold for `nbytes` (floor_plan), as a point's facts."""
    return plan_facts(floor_plan(nbytes, l2_bytes, recorded))


def plan_facts(plan: L2Plan) -> dict[str, Any]:
    return {"l2_policy": plan.policy, "l2_verdict": plan.verdict, "copies": plan.copies, "l2_detail": plan.detail,
            "l2_rule": plan.rule}


# --- the curve ------------------------------------------------------------------------------
def check_curve(curve: Any, source: str = "the floor") -> dict[str, Any]:
    """The curve itself when it holds at least one measured point; ValueError (one sentence
    naming `source`) otherwise."""
    if not isinstance(curve, Mapping) or not isinstance(curve.get("sizes"), list):
        raise ValueError(f"{source} has no 'sizes' list; write a floor with "
                         "`foscar-bench ceiling --floor --json-out F`.")
    if not points(curve):
        raise ValueError(f"{source} holds no measured size (every 'sizes' entry lacks a positive median_us); "
                         "measure again with `foscar-bench ceiling --floor --json-out F`.")
    return dict(curve)


def points(curve: Mapping[str, Any]) -> list[tuple[int, float]]:
    """(bytes, floor us) of every measured size, ascending, as a lower envelope: a size whose
    time exceeds that of a larger size takes the larger size's time (reading more bytes is
    never faster, so the faster larger read bounds the smaller one from above)."""
    raw: dict[int, float] = {}
    for p in curve.get("sizes") or []:
        b, us = _num(p.get("bytes")), _num(p.get("median_us"))
        if b and us and b > 0 and us > 0:
            raw[int(b)] = min(us, raw.get(int(b), math.inf))
    pts = sorted(raw.items())
    low = math.inf
    out = []
    for b, us in reversed(pts):
        low = min(low, us)
        out.append((b, low))
    return out[::-1]


def floor_lookup(curve: Mapping[str, Any], nbytes: float) -> tuple[float, str]:
    """(floor us, how) at `nbytes`: 'measured' at a measured size, 'interpolated' (log-log,
    between the two measured sizes around it), 'below' the smallest measured size (scaled
    down at that size's bandwidth: lower than any read of those bytes takes, so a bound on it
    stays a bound, only a looser one), or 'above' the largest (scaled at the best bandwidth
    of the curve)."""
    pts = points(curve)
    if not pts:
        raise ValueError("the floor holds no measured size.")
    n = float(nbytes)
    if n <= 0:
        raise ValueError(f"a floor is for a positive byte count, not {nbytes!r}.")
    for b, us in pts:
        if b == n:
            return us, "measured"
    if n < pts[0][0]:
        b0, t0 = pts[0]
        return t0 * n / b0, "below"
    if n > pts[-1][0]:
        best_bw = max(b / us for b, us in pts)
        return n / best_bw, "above"
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 < n < b1:
            w = math.log(n / b0) / math.log(b1 / b0)
            us = t0 if t0 == t1 else math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
            return min(max(us, t0), t1), "interpolated"  # rounding never leaves the pair's range
    raise AssertionError("unreachable")  # pragma: no cover


def floor_us(curve: Mapping[str, Any], nbytes: float, extrapolate: bool = False) -> float:
    """The read floor at `nbytes`, log-log between measured sizes. Outside the measured range
    it raises ValueError unless `extrapolate` (floor_lookup says how it extrapolates)."""
    us, how = floor_lookup(curve, nbytes)
    if how in ("below", "above") and not extrapolate:
        pts = points(curve)
        raise ValueError(f"{int(nbytes)} bytes lies {how} the measured sizes ({pts[0][0]} to {pts[-1][0]} bytes); "
                         "measure the floor there, or pass extrapolate=True.")
    return us


# --- the bound ------------------------------------------------------------------------------
def _shape(r: Mapping[str, Any]) -> tuple:
    return tuple(int(_num(r.get(k)) or 0) for k in SHAPE)


def _format(r: Mapping[str, Any]) -> str:
    k, v, g = (r.get(f) for f in FORMAT)
    if k in (None, "none") or (isinstance(k, float) and k != k):
        return ""
    return f"K {k}, V {v}, g{int(_num(g) or 0)}"


def _latest(records: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], tuple]) -> dict[tuple, Mapping]:
    """The last record per key, in store order (`id` where records carry it)."""
    rows = list(records)
    if all(_num(r.get("id")) is not None for r in rows):
        rows.sort(key=lambda r: _num(r.get("id")))
    out: dict[tuple, Mapping] = {}
    for r in rows:
        out[key(r)] = r
    return out


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def speedup_bounds(ours_records: Iterable[Mapping[str, Any]], baseline_records: Iterable[Mapping[str, Any]],
                   floor_curve: Mapping[str, Any], ours: Sequence[str] = OURS,
                   baselines: Sequence[str] = BASELINES) -> dict[str, Any]:
    """Per case (same batch, kv_len, heads and head_dim) where one of `ours` passed and a
    baseline carries a time: the measured speedup baseline_us / ours_us and the bound
    baseline_us / floor_us(our bytes); and per (our backend, format, baseline) the geometric
    means of both over those cases.

    Our records count when they passed. A baseline's count when they carry a time (passed,
    or `inaccurate`: a third-party kernel whose check failed, timed and flagged, as the
    sweep's summary marks it); a throttled one is flagged too. A baseline that ran one shape
    in several formats counts with the median of its times, as the report's speedups do.

    A case whose record rotated where the floor, measured at exactly its bytes, flushed is
    flagged `floor_colder`: that floor is slower than any read timed as the case was, so its
    bound is too low to be one (a floor of the old per-size L2 rule beside records of the
    shape rule; measure one for the run with --floor --db --run).
    """
    check_curve(floor_curve)
    floor_l2 = {int(b): recorded_policy(p.get("l2_policy")) for p in floor_curve.get("sizes") or []
                if (b := _num(p.get("bytes"))) and _num(p.get("median_us"))}
    mine = _latest(
        (r for r in ours_records if r.get("backend") in ours and r.get("status") == "passed"
         and (_num(r.get("median_us")) or 0) > 0 and (_num(r.get("bytes")) or 0) > 0),
        key=lambda r: (r.get("backend"), _format(r), _shape(r)))
    theirs = _latest(
        (r for r in baseline_records if r.get("backend") in baselines and r.get("status") in TIMED_STATUSES
         and (_num(r.get("median_us")) or 0) > 0),
        key=lambda r: (r.get("backend"), _format(r), _shape(r)))
    over: dict[tuple, list[Mapping]] = defaultdict(list)
    for (backend, _, shape), r in theirs.items():
        over[(backend, shape)].append(r)
    rows = []
    for (backend, fmt, shape), r in sorted(mine.items(), key=lambda kv: (ours.index(kv[0][0]), kv[0][1], kv[0][2])):
        for base in baselines:
            found = over.get((base, shape))
            if not found:
                continue
            base_us = statistics.median(_num(b.get("median_us")) for b in found)
            ours_us, nbytes = _num(r.get("median_us")), int(_num(r.get("bytes")))
            fl, how = floor_lookup(floor_curve, nbytes)
            rows.append({
                "ours": backend, "format": fmt, "over": base, **dict(zip(SHAPE, shape)),
                "ours_us": ours_us, "over_us": base_us, "bytes": nbytes, "floor_us": fl, "floor_how": how,
                "speedup": base_us / ours_us, "bound": base_us / fl, "ours_over_floor": ours_us / fl,
                "over_inaccurate": any(b.get("status") == "inaccurate" for b in found),
                "over_throttled": any(bool(_num(b.get("throttled"))) for b in found),
                "ours_throttled": bool(_num(r.get("throttled"))),
                "floor_colder": recorded_policy(r.get("l2_policy")) == "rotate" and floor_l2.get(nbytes) == "flush",
            })
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["ours"], row["format"], row["over"])].append(row)
    means = []
    for (backend, fmt, base), g in groups.items():
        means.append({
            "ours": backend, "format": fmt, "over": base, "n_cases": len(g),
            "geomean_speedup": geomean([x["speedup"] for x in g]),
            "geomean_bound": geomean([x["bound"] for x in g]),
            "geomean_ours_over_floor": geomean([x["ours_over_floor"] for x in g]),
            "min_bound": min(x["bound"] for x in g), "max_bound": max(x["bound"] for x in g),
            "n_extrapolated": sum(x["floor_how"] in ("below", "above") for x in g),
            "n_over_inaccurate": sum(x["over_inaccurate"] for x in g),
            "n_floor_colder": sum(x["floor_colder"] for x in g),
        })
    matched = {(r["ours"], r["format"], (r["batch"], r["kv_len"], r["num_q_heads"], r["num_kv_heads"], r["head_dim"]))
               for r in rows}
    gpu_names = {
        "ours": sorted({str(r.get("gpu_name")) for r in mine.values() if r.get("gpu_name")}),
        "baselines": sorted({str(r.get("gpu_name")) for r in theirs.values() if r.get("gpu_name")}),
        "floor": floor_curve.get("gpu_name"),
    }
    return {
        "cases": rows,
        "geomeans": means,
        "unmatched_ours": sorted(f"{b}{' (' + fmt + ')' if fmt else ''} batch {shape[0]} kv {shape[1]}"
                                 for (b, fmt, shape) in mine if (b, fmt, shape) not in matched),
        "gpu_names": gpu_names,
        # every GPU the records and the floor name: more than one, and the bound mixes machines
        "gpus_seen": sorted(set(gpu_names["ours"]) | set(gpu_names["baselines"])
                            | ({gpu_names["floor"]} if gpu_names["floor"] else set())),
    }


# --- terminal lines -------------------------------------------------------------------------
def _bytes_text(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def floor_lines(curve: Mapping[str, Any]) -> list[str]:
    """The measured floor, one line per size."""
    lines = [f"read floor on {curve.get('gpu_name') or 'an unnamed GPU'}: best of the read kernels per size, "
             f"CUDA graphs, L2 kept cold as the sweep keeps it"
             + (f" ({curve['elapsed_s']:.0f} s)" if _num(curve.get("elapsed_s")) else "")]
    lines.append(f"  {'bytes':>10} {'floor us':>9} {'TB/s':>6} {'spread':>7}  {'L2':<10} kernel")
    envelope = dict(points(curve)) if points(curve) else {}
    for p in curve.get("sizes") or []:
        us = _num(p.get("median_us"))
        if not us:
            lines.append(f"  {_bytes_text(p['bytes']):>10} {'-':>9}  {p.get('note', 'not measured')}")
            continue
        low = envelope.get(int(p["bytes"]), us)
        mark = f"  (a larger size read faster: floor {low:.2f} us)" if low < us else ""
        lines.append(f"  {_bytes_text(p['bytes']):>10} {us:>9.2f} {p.get('tbps', 0):>6.2f} "
                     f"{100 * (_num(p.get('spread')) or 0):>6.2f}%  {str(p.get('l2_policy', '')):<10} "
                     f"{p.get('candidate', '')}{mark}")
    return lines


def bound_lines(bounds: Mapping[str, Any], targets: Mapping[tuple, float] | None = None) -> list[str]:
    """The bound table: per (our backend, format, baseline) its cases, then the geo-means
    and, where `targets` names one for (ours, over), whether the bound leaves it in reach."""
    targets = targets or {}
    lines: list[str] = []
    seen = bounds.get("gpus_seen", [])
    if len(seen) > 1:
        lines.append(f"note: the records and the floor come from different GPUs ({', '.join(seen)}); "
                     "a bound holds on the GPU its floor was measured on.")
    colder = sorted({(r["ours"], r["batch"], r["kv_len"]) for r in bounds.get("cases", []) if r.get("floor_colder")})
    if colder:
        where = ", ".join(f"{o} b{b} / {kv_text(kv)}" for o, b, kv in colder)
        lines.append(f"note: at {len(colder)} of our cases ({where}) "
                     "the record rotated L2 but the floor at its bytes flushed (a floor of the old per-size rule?): "
                     "the bound there is too low; measure a floor for this run with `ceiling --floor --db F --run ID`.")
    by_group: dict[tuple, list[dict]] = defaultdict(list)
    for row in bounds.get("cases", []):
        by_group[(row["ours"], row["format"], row["over"])].append(row)
    marks_used = set()
    for g in bounds.get("geomeans", []):
        key = (g["ours"], g["format"], g["over"])
        lines.append("")
        lines.append(f"{g['ours']}{' (' + g['format'] + ')' if g['format'] else ''} over {g['over']}")
        lines.append(f"  {'batch':>5} {'KV':>5} {'ours us':>9} {'base us':>9} {'floor us':>9} "
                     f"{'speedup':>8} {'bound':>8} {'ours/floor':>10}")
        for r in sorted(by_group[key], key=lambda r: (r["batch"], r["kv_len"])):
            fmark = {"below": "<", "above": ">"}.get(r["floor_how"], " ")
            bmark = "!" if r["over_inaccurate"] else ("*" if r["over_throttled"] else " ")
            marks_used |= {fmark, bmark} - {" "}
            lines.append(f"  {r['batch']:>5} {kv_text(r['kv_len']):>5} {r['ours_us']:>9.1f} {r['over_us']:>8.1f}{bmark}"
                         f" {r['floor_us']:>8.2f}{fmark} {r['speedup']:>7.2f}x {r['bound']:>7.2f}x "
                         f"{r['ours_over_floor']:>9.2f}x")
        text = (f"  geo-mean over {g['n_cases']} cases: speedup {g['geomean_speedup']:.2f}x, "
                f"bound {g['geomean_bound']:.2f}x (ours at {g['geomean_ours_over_floor']:.2f}x the floor)")
        target = targets.get((g["ours"], g["over"]))
        if target:
            verdict = ("within the bound" if g["geomean_bound"] >= target
                       else "out of reach on this GPU: no kernel moving our bytes gets there")
            text += f"; target {target:g}x: {verdict}"
        lines.append(text)
    if not bounds.get("geomeans"):
        lines.append("no case where one of our kernels passed and a baseline carries a time on the same shape.")
    notes = {"<": "< the floor is scaled down from the smallest measured size (a looser bound)",
             ">": "> the floor is scaled up from the largest measured size at the curve's best bandwidth",
             "!": "! the baseline's check failed (inaccurate): timed and flagged",
             "*": "* the baseline ran throttled"}
    if marks_used:
        lines.append("")
        lines.extend(notes[m] for m in ("<", ">", "!", "*") if m in marks_used)
    return lines


# --- GPU ------------------------------------------------------------------------------------
def measure_read_floor(device: Any, sizes: Sequence[int] | None = None, quick: bool = False, *,
                       policies: Mapping[int, str] | None = None,
                       finalists: int | None = None, rounds: int | None = None,
                       screen: StopRule = SCREEN_RULE, final: StopRule = FINAL_RULE,
                       on_point: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Measure the read floor on `device` at each byte count of `sizes` (default: ladder()),
    L2 kept cold per size as `policies` (floor_policies of a run's records) says those bytes
    were timed, else by size (floor_plan). Returns {'gpu_name', 'sizes': [point per size:
    bytes, median_us, spread, tbps, candidate, l2_policy, l2_verdict, l2_rule, ...], ...},
    ready for floor_us and speedup_bounds."""
    import torch

    from suite.readceiling import triton_kernels
    from suite.timing import l2_flush, time_gpu, verify_rotation

    props = torch.cuda.get_device_properties(device)
    l2_bytes = getattr(props, "L2_cache_size", None) or None
    sm_count = props.multi_processor_count
    finalists = finalists or (2 if quick else FINALISTS)
    rounds = rounds or (1 if quick else ROUNDS)
    kernels: list = []
    state: dict[str, Any] = {"copies": [], "thunks": {}, "flush": None, "policy": None}
    methods: set[str] = set()

    def prepare(n: int) -> dict[str, Any]:
        state["copies"], state["thunks"] = [], {}
        torch.cuda.empty_cache()
        plan = floor_plan(n, l2_bytes, (policies or {}).get(n))
        state["policy"] = plan.policy
        free, _ = torch.cuda.mem_get_info(device)
        flush_bytes = 2 * (l2_bytes or L2_ASSUMED_BYTES)
        need = plan.copies * n + (flush_bytes if plan.policy == "flush" else 0)
        if need + (1 << 30) > free:
            raise MemoryError(f"needs {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
        state["copies"] = [torch.empty(n // 4, dtype=torch.int32, device=device).random_()
                           for _ in range(plan.copies)]
        plan = verify_rotation(plan, state["copies"], n)
        if plan.policy == "flush" and state["flush"] is None:
            state["flush"] = l2_flush(flush_bytes, device)
        return plan_facts(plan)

    def thunks_for(n: int, c: Candidate) -> list[Callable[[], Any]]:
        if not kernels:
            kernels.extend(triton_kernels())
        persistent, tiled = kernels
        tile, warps = c.get("tile"), c.get("warps")
        n_tiles = read_bytes(c, n) // (4 * tile)
        if c.kind == "persistent":
            grid = min(c.get("programs"), n_tiles)
            out = torch.empty(grid, dtype=torch.int32, device=device)
            return [lambda x=x: persistent[(grid,)](x, out, n_tiles, TILE=tile, CACHE=c.get("cache"), num_warps=warps)
                    for x in state["copies"]]
        out = torch.empty(n_tiles, dtype=torch.int32, device=device)
        return [lambda x=x: tiled[(n_tiles,)](x, out, TILE=tile, num_warps=warps) for x in state["copies"]]

    def time_one(n: int, c: Candidate, is_final: bool) -> tuple[float, float]:
        if c not in state["thunks"]:
            runs = thunks_for(n, c)
            runs[0]()  # compile (Triton) outside the timing; a failure drops the candidate
            torch.cuda.synchronize(device)
            state["thunks"][c] = runs
        policy = state["policy"]
        t, _ = time_gpu(state["thunks"][c], l2_policy=policy, flush=state["flush"] if policy == "flush" else None,
                        use_graphs=True, rule=final if is_final else screen)
        methods.add(t.method)
        return t.median_us, t.spread

    t0 = time.monotonic()
    with torch.cuda.device(device):
        pts = search_floor(sizes or ladder(), lambda n: floor_candidates(n, sm_count, quick), time_one,
                           prepare=prepare, finalists=finalists, rounds=rounds, on_point=on_point)
    state.clear()
    torch.cuda.empty_cache()
    return {
        "kind": "read-floor",
        "gpu_name": torch.cuda.get_device_name(device),
        "l2_bytes": l2_bytes,
        "sm_count": sm_count,
        "method": ("per size, the fastest of tiled and persistent Triton read kernels (whole tiles of at most "
                   f"{4 * max(t for t, _ in TILED_SHAPES) // 1024} KiB, so at most {100 * MAX_SHORTFALL:.1f}% of the "
                   f"bytes left unread), timed by suite.timing.time_gpu with CUDA graphs and L2 kept cold by "
                   f"floor_plan (as the run's records of the size were timed, rotated or flushed; without records "
                   f"up to {MAX_ROTATE_COPIES_SHAPE} rotated copies, else a flush); the best {finalists} re-timed "
                   f"in {rounds} interleaved round(s)"),
        "timing_methods": sorted(methods),
        "quick": quick,
        "l2_from_records": bool(policies),
        "rules": {"screen": asdict(screen), "final": asdict(final)},
        "elapsed_s": round(time.monotonic() - t0, 1),
        "sizes": pts,
    }
