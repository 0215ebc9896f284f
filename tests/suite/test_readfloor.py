"""The read floor and the speedup bound: the search with a fake timer, the curve and its
interpolation, the bound over fake records, and the command on a small store; one GPU
test measures a floor at two sizes."""
from __future__ import annotations

import json
import math
import random

import pytest
from typer.testing import CliRunner

from suite import readfloor as rf
from suite.cli import app
from suite.readceiling import Candidate
from suite.runner import MAX_ROTATE_COPIES_SHAPE
from suite.timing import l2_plan

L2 = 60 << 20  # an H200's, as torch reports it
MB = 10**6


# --- sizes ----------------------------------------------------------------------------------
def test_sizes_parse_and_ladder():
    assert rf.parse_sizes("4MB, 2375812,4MiB,4MB") == [2375812, 4 * MB, 4 << 20]
    assert rf.parse_size("1.5GB") == 1_500_000_000 and rf.parse_size("256KiB") == 256 << 10
    for bad in ("4 parsecs", "x", "12b12", "100"):
        with pytest.raises(ValueError, match=repr(bad)[1:-1]):
            rf.parse_size(bad)
    with pytest.raises(ValueError, match="no size"):
        rf.parse_sizes(" , ")
    sizes = rf.ladder()
    assert sizes[0] == 256 << 10 and sizes[-1] == 8 << 30 and 25 <= len(sizes) <= 35
    assert all(b / a == pytest.approx(2**0.5, rel=0.02) for a, b in zip(sizes, sizes[1:]))


def test_sizes_from_records_are_our_passed_byte_counts():
    recs = [
        {"backend": "foscar-int4", "status": "passed", "bytes": 4472964},
        {"backend": "foscar-int4", "status": "passed", "bytes": 4472964.0},  # the same size once
        {"backend": "foscar-int2", "status": "passed", "bytes": 2375812},
        {"backend": "foscar-int2", "status": "incorrect", "bytes": 9454084},
        {"backend": "flashinfer-bf16-tc", "status": "passed", "bytes": 16793860},
        {"backend": "foscar-int4", "status": "passed", "bytes": float("nan")},
    ]
    assert rf.sizes_from_records(recs) == [2375812, 4472964]
    assert rf.sizes_from_records(recs, backends=("flashinfer-bf16-tc",)) == [16793860]



def test_floor_policies_are_how_our_passed_records_of_each_size_were_timed():
    recs = [
        {"backend": "foscar-int4", "status": "passed", "bytes": 4472964, "l2_policy": "flush"},  # before: per backend
        {"backend": "foscar-int2", "status": "passed", "bytes": 2375812, "l2_policy": "rotate:106"},
        {"backend": "foscar-int2", "status": "passed", "bytes": 9454084, "l2_policy": "flush"},
        {"backend": "foscar-int2", "status": "passed", "bytes": 9454084.0, "l2_policy": "rotate:27"},  # disagree: rotate
        {"backend": "foscar-int4", "status": "passed", "bytes": 1141014560, "l2_policy": "size"},
        {"backend": "foscar-int4", "status": "passed", "bytes": 65536, "l2_policy": "n/a (cpu)"},
        {"backend": "foscar-int4", "status": "passed", "bytes": 131072, "l2_policy": float("nan")},
        {"backend": "foscar-int4", "status": "incorrect", "bytes": 35668996, "l2_policy": "rotate:8"},
        {"backend": "flashinfer-bf16-tc", "status": "passed", "bytes": 16793860, "l2_policy": "rotate:15"},
    ]
    assert rf.floor_policies(recs) == {2375812: "rotate", 4472964: "flush", 9454084: "rotate", 1141014560: "rotate"}
    assert rf.floor_policies(recs, backends=("flashinfer-bf16-tc",)) == {16793860: "rotate"}


def test_floor_plan_follows_the_records_else_rotates_up_to_the_cap():
    flushed = rf.floor_plan(4472964, L2, "flush")  # a record of the per-backend rule: flushed
    assert (flushed.policy, flushed.rule) == ("flush", rf.FLOOR_RULE_RECORDS)
    assert "as the records of this size were timed" in flushed.detail
    rotated = rf.floor_plan(4472964, L2, "rotate")  # the same bytes under the shape rule
    assert (rotated.policy, rotated.rule, rotated.verdict) == ("rotate:57", rf.FLOOR_RULE_RECORDS, "cold")
    by_size = rf.floor_plan(4472964, L2)
    assert by_size.policy == "rotate:57" and by_size.rule == rf.FLOOR_RULE_SIZE and "by size" in by_size.detail
    tiny = rf.floor_plan(256 << 10, L2)  # 960 copies: over the cap
    assert tiny.policy == "flush" and "by size" in tiny.detail
    over = rf.floor_plan(256 << 10, L2, "rotate")
    assert over.policy == "flush" and "would need more than 256 copies" in over.detail
    assert rf.l2_facts(64 << 20, L2)["l2_policy"] == "rotate:4" and rf.l2_facts(64 << 20, L2, "flush")["copies"] == 1
    with pytest.raises(ValueError, match="'rotate:4'"):
        rf.floor_plan(1 << 20, L2, "rotate:4")

# --- candidates and the search --------------------------------------------------------------
def test_candidates_are_sized_to_the_bytes():
    small = rf.floor_candidates(256 << 10, 132)
    assert small and all(c.kind == "tiled" for c in small)  # too few tiles for a persistent grid
    for n in (256 << 10, 2375812, 4472964, 8 << 30):
        for c in rf.floor_candidates(n, 132):
            got = rf.read_bytes(c, n)
            assert got % (4 * c.get("tile")) == 0 and (1 - rf.MAX_SHORTFALL) * n <= got <= n
            assert 4 <= c.get("tile") // (32 * c.get("warps")) <= rf.MAX_INT32_PER_LANE
    for n in (5000, 100_000):  # where no tile fits within MAX_SHORTFALL, the smallest (2 KiB) still runs
        assert {c.get("tile") for c in rf.floor_candidates(n, 132)} == {512} and n - rf.read_bytes(
            rf.floor_candidates(n, 132)[0], n) < 2048
    big = rf.floor_candidates(8 << 30, 132)
    assert {c.kind for c in big} == {"tiled", "persistent"} and len(big) == len(set(big))
    assert 2 <= len(rf.floor_candidates(8 << 30, 132, quick=True)) <= 5


def _fake_timer(latency_us: dict, tbps: dict, noise: float = 0.002, seed: int = 1, fail=frozenset()):
    """time = the candidate's latency + its bytes over its bandwidth, with a little noise."""
    rng = random.Random(seed)
    calls = []

    def time_one(n, c, final):
        calls.append((n, c, final))
        if c in fail:
            raise RuntimeError("out of resources")
        us = latency_us[c] + rf.read_bytes(c, n) / (tbps[c] * 1e6)
        return us * (1 + rng.uniform(-noise, noise)), 0.003

    return time_one, calls


def test_search_picks_the_fastest_candidate_per_size():
    sms = 132
    sizes = [256 << 10, 2 << 20, 64 << 20, 1 << 30]
    cands = {c for n in sizes for c in rf.floor_candidates(n, sms)}
    quick_start = Candidate("tiled", (("tile", 1024), ("warps", 4)))  # low latency, low bandwidth
    streamer = Candidate("tiled", (("tile", 8192), ("warps", 8)))  # high bandwidth, slower to start
    latency = {c: 9.0 for c in cands} | {quick_start: 4.0, streamer: 6.0}
    bw = {c: 3.0 for c in cands} | {quick_start: 2.0, streamer: 4.6}
    broken = Candidate("tiled", (("tile", 2048), ("warps", 4)))
    time_one, calls = _fake_timer(latency, bw, fail={broken})
    points = rf.search_floor(sizes, lambda n: rf.floor_candidates(n, sms), time_one,
                             prepare=lambda n: rf.l2_facts(n, L2), finalists=3, rounds=2)
    assert [p["bytes"] for p in points] == sizes
    best = {p["bytes"]: p["candidate"] for p in points}
    # 4.0 + 0.26/2.0 < 6.0 + 0.26/4.6 at 256 KiB; at 1 GiB the streamer wins by far
    assert best[256 << 10] == quick_start.name and best[1 << 30] == streamer.name
    for p in points:
        assert p["rounds"] == 2 and p["median_us"] > 0 and p["tbps"] == pytest.approx(
            p["bytes_read"] / p["median_us"] / 1e6)
        assert broken.name not in {r["name"] for r in p["runners_up"]}
        assert p["median_us"] <= min(r["median_us"] for r in p["runners_up"])
    # with no records, by size: rotated up to the sweep's cap (a flush beyond: 960 copies), then size
    assert [p["l2_policy"] for p in points] == ["flush", "rotate:120", "rotate:4", "size"]
    assert points[2]["copies"] == 4 == l2_plan(64 << 20, L2, MAX_ROTATE_COPIES_SHAPE).copies
    assert {p["l2_rule"] for p in points} == {rf.FLOOR_RULE_SIZE}
    finals = [(n, c) for n, c, final in calls if final and n == 1 << 30]
    assert len(finals) == 6 and finals[:3] == finals[3:]  # the 3 finalists, in interleaved rounds


def test_a_size_that_cannot_be_prepared_is_a_note():
    def prepare(n):
        if n > 1 << 30:
            raise MemoryError("needs 40 GB, 20 GB free")
        return {"l2_policy": "size"}

    c = Candidate("tiled", (("tile", 1024), ("warps", 4)))
    time_one, _ = _fake_timer({c: 5.0}, {c: 3.0})
    pts = rf.search_floor([1 << 20, 40 << 30], lambda n: [c], time_one, prepare=prepare)
    assert pts[0]["median_us"] > 0 and pts[1]["median_us"] is None and "needs 40 GB" in pts[1]["note"]
    assert rf.points({"sizes": pts}) == [(1 << 20, pts[0]["median_us"])]


# --- the curve ------------------------------------------------------------------------------
CURVE = {"gpu_name": "NVIDIA H200", "sizes": [
    {"bytes": 1 * MB, "median_us": 5.0},
    {"bytes": 4 * MB, "median_us": 6.0},
    {"bytes": 16 * MB, "median_us": 9.0},
    {"bytes": 8 * MB, "median_us": 9.5},  # slower than the larger 16 MB: the envelope takes 9.0
    {"bytes": 1000 * MB, "median_us": 225.0},
    {"bytes": 2 * MB, "median_us": None, "note": "not measured"},
]}


def test_floor_interpolates_log_log_between_measured_sizes():
    assert rf.floor_us(CURVE, 1 * MB) == 5.0 and rf.floor_lookup(CURVE, 4 * MB) == (6.0, "measured")
    assert rf.floor_us(CURVE, 2 * MB) == pytest.approx(5.0 * (6.0 / 5.0) ** 0.5)  # halfway in log bytes
    assert rf.floor_lookup(CURVE, 3 * MB)[1] == "interpolated"
    assert rf.floor_us(CURVE, 8 * MB) == 9.0  # a larger size read faster
    t = [rf.floor_us(CURVE, n * MB) for n in (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 100, 1000)]
    assert t == sorted(t)  # never faster for more bytes
    x = 100 * MB
    w = math.log(x / (16 * MB)) / math.log(1000 / 16)
    assert rf.floor_us(CURVE, x) == pytest.approx(math.exp(math.log(9) + w * math.log(225 / 9)))


def test_floor_says_when_it_extrapolates():
    with pytest.raises(ValueError, match="below the measured sizes"):
        rf.floor_us(CURVE, 0.5 * MB)
    with pytest.raises(ValueError, match="above the measured sizes"):
        rf.floor_us(CURVE, 2000 * MB)
    us, how = rf.floor_lookup(CURVE, 0.5 * MB)
    assert how == "below" and us == pytest.approx(2.5)  # scaled at the smallest size's bandwidth: lower
    assert rf.floor_us(CURVE, 0.5 * MB, extrapolate=True) == us
    us, how = rf.floor_lookup(CURVE, 2000 * MB)
    assert how == "above" and us == pytest.approx(2000 * MB / max(b / t for b, t in rf.points(CURVE)))


def test_a_curve_without_sizes_is_refused_in_one_sentence():
    for bad in ({}, {"sizes": "x"}, [], {"sizes": [{"bytes": 10, "median_us": None}]}):
        with pytest.raises(ValueError, match="floor.json") as err:
            rf.check_curve(bad, "floor.json")
        assert "\n" not in str(err.value)


# --- the bound ------------------------------------------------------------------------------
SHAPE = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
FLOOR = {"gpu_name": "NVIDIA H200", "sizes": [
    {"bytes": n, "median_us": 5.5 + n / 4.6e6} for n in rf.ladder(256 << 10, 32 << 30)]}


def _rec(backend, batch, kv, us, nbytes, status="passed", rid=None, **kw):
    quant = {"bits": 16, "k_mode": "none", "v_mode": "none", "group_size": 0}
    if backend.startswith("foscar"):
        quant = {"bits": int(backend[-1]), "k_mode": "channel", "v_mode": "token", "group_size": 128}
    rec = {"backend": backend, "batch": batch, "kv_len": kv, **SHAPE, **quant, "status": status,
           "median_us": us, "bytes": nbytes, "gpu_name": "NVIDIA H200", **kw}
    if rid is not None:
        rec["id"] = rid
    return rec


def _kv_bytes(batch, kv, bits):
    return int(batch * kv * 8 * 128 * 2 * bits / 8 * 1.03) + 100_000


GRID = [(b, kv) for b in (1, 8, 32, 128) for kv in (4096, 16384, 32768, 131072)]


def _grid(factor_ours=1.6, factor_base=1.05):
    ours, base = [], []
    for b, kv in GRID:
        for backend, bits in (("foscar-int4", 4), ("foscar-int2", 2)):
            n = _kv_bytes(b, kv, bits)
            ours.append(_rec(backend, b, kv, factor_ours * rf.floor_us(FLOOR, n, extrapolate=True), n))
        for backend, bits in (("flashinfer-bf16-tc", 16), ("trtllm-xqa-fp8", 8)):
            n = _kv_bytes(b, kv, bits)
            base.append(_rec(backend, b, kv, factor_base * rf.floor_us(FLOOR, n, extrapolate=True), n))
    return ours, base


def test_bound_is_at_least_the_speedup_when_ours_is_slower_than_the_floor():
    ours, base = _grid()
    res = rf.speedup_bounds(ours, base, FLOOR)
    assert len(res["cases"]) == 16 * 4 and not res["unmatched_ours"]
    for row in res["cases"]:
        assert row["ours_us"] >= row["floor_us"] and row["bound"] >= row["speedup"]
        assert row["speedup"] == pytest.approx(row["over_us"] / row["ours_us"])
        assert row["bound"] == pytest.approx(row["over_us"] / rf.floor_us(FLOOR, row["bytes"]))
        assert row["ours_over_floor"] == pytest.approx(1.6)
    means = {(g["ours"], g["over"]): g for g in res["geomeans"]}
    assert set(means) == {(o, b) for o in rf.OURS for b in rf.BASELINES}
    for (o, b), g in means.items():
        rows = [r for r in res["cases"] if r["ours"] == o and r["over"] == b]
        assert g["n_cases"] == 16
        assert g["geomean_speedup"] == pytest.approx(math.prod(r["speedup"] for r in rows) ** (1 / 16))
        assert g["geomean_bound"] == pytest.approx(math.prod(r["bound"] for r in rows) ** (1 / 16))
        assert g["geomean_bound"] == pytest.approx(1.6 * g["geomean_speedup"])
        assert g["n_extrapolated"] == 0 and g["format"] == "K channel, V token, g128"


def test_bound_takes_passed_ours_and_timed_baselines_only():
    n = _kv_bytes(1, 4096, 4)
    ours = [
        _rec("foscar-int4", 1, 4096, 30.0, n, rid=1),
        _rec("foscar-int4", 1, 4096, 15.0, n, rid=2),  # a retry: the latest record counts
        _rec("foscar-int4", 8, 4096, None, n, status="incorrect", rid=3),  # ours fails the gate: untimed
        _rec("foscar-int4", 32, 4096, 50.0, _kv_bytes(32, 4096, 4), rid=4),  # no baseline there
        _rec("foscar-dequant-int4", 1, 4096, 40.0, n, rid=5),  # not one of ours here
    ]
    base = [
        _rec("flashinfer-bf16-tc", 1, 4096, 18.0, 1, status="inaccurate", reason="rel err", rid=10),
        _rec("trtllm-xqa-fp8", 1, 4096, 12.0, 1, rid=11, k_mode="channel"),
        _rec("trtllm-xqa-fp8", 1, 4096, 14.0, 1, rid=12, k_mode="token"),  # two formats: the median
        _rec("trtllm-xqa-fp8", 8, 4096, 20.0, 1, status="crashed", rid=13),
        _rec("flashinfer-bf16-tc", 8, 4096, float("nan"), 1, status="crashed", rid=14),
    ]
    res = rf.speedup_bounds(ours, base, FLOOR)
    rows = {(r["over"], r["batch"]): r for r in res["cases"]}
    assert set(rows) == {("flashinfer-bf16-tc", 1), ("trtllm-xqa-fp8", 1)}
    fi, xqa = rows[("flashinfer-bf16-tc", 1)], rows[("trtllm-xqa-fp8", 1)]
    assert fi["ours_us"] == 15.0 and fi["over_inaccurate"] and fi["speedup"] == pytest.approx(18 / 15)
    assert xqa["over_us"] == 13.0 and not xqa["over_inaccurate"]
    assert res["unmatched_ours"] == ["foscar-int4 (K channel, V token, g128) batch 32 kv 4096"]
    lines = rf.bound_lines(res, {("foscar-int4", "flashinfer-bf16-tc"): 99.0})
    text = "\n".join(lines)
    assert "18.0!" in text and "inaccurate" in text and "out of reach" in text


def test_bound_flags_a_floor_flushed_where_our_record_rotated():
    """A floor of the old per-size rule (4.5 MB flushed) beside a record of the shape rule (rotated):
    the floor is slower than the case's own conditions allow, so the bound there is no bound."""
    n = 4472964
    floor = {"gpu_name": "NVIDIA H200", "sizes": [
        {"bytes": n, "median_us": 5.97, "l2_policy": "flush"},
        {"bytes": 2 * n, "median_us": 6.4, "l2_policy": "rotate:28"}]}
    base = [_rec("flashinfer-bf16-tc", 1, 4096, 17.6, 1), _rec("flashinfer-bf16-tc", 1, 8192, 20.0, 1)]
    ours = [_rec("foscar-int4", 1, 4096, 13.5, n, l2_policy="rotate:57"),
            _rec("foscar-int4", 1, 8192, 14.0, 2 * n, l2_policy="rotate:28")]
    res = rf.speedup_bounds(ours, base, floor)
    assert [r["floor_colder"] for r in res["cases"]] == [True, False]
    assert res["geomeans"][0]["n_floor_colder"] == 1
    text = "\n".join(rf.bound_lines(res))
    assert "at 1 of our cases (foscar-int4 b1 / 4K) the record rotated L2 but the floor at its bytes flushed" in text
    # records of the old rule (flushed) against the same floor: consistent, no flag
    old = [_rec("foscar-int4", 1, 4096, 15.6, n, l2_policy="flush")]
    assert not rf.speedup_bounds(old, base, floor)["cases"][0]["floor_colder"]
    assert "rotated L2" not in "\n".join(rf.bound_lines(rf.speedup_bounds(old, base, floor)))

def test_bound_lines_mark_an_extrapolated_floor_and_other_gpus():
    floor = {"gpu_name": "NVIDIA H100", "sizes": [{"bytes": 64 * MB, "median_us": 20.0},
                                                   {"bytes": 256 * MB, "median_us": 60.0}]}
    ours = [_rec("foscar-int2", 1, 4096, 14.0, 2 * MB)]
    base = [_rec("flashinfer-bf16-tc", 1, 4096, 17.6, 16 * MB)]
    res = rf.speedup_bounds(ours, base, floor)
    (row,) = res["cases"]
    assert row["floor_how"] == "below" and row["floor_us"] == pytest.approx(20.0 / 32)
    assert res["geomeans"][0]["n_extrapolated"] == 1
    text = "\n".join(rf.bound_lines(res))
    assert "< the floor is scaled down" in text and "different GPUs" in text
    assert rf.bound_lines(rf.speedup_bounds([], base, floor))[-1].startswith("no case")


# --- the command ----------------------------------------------------------------------------
@pytest.fixture
def bound_store(tmp_path):
    """A store with our run and a baseline run, written through the store's own API, and a floor."""
    from core.case import Case
    from core.store import ResultStore

    ours, base = _grid()
    db = tmp_path / "results.sqlite"
    with ResultStore(db) as store:
        for run_id, recs in (("ours-run", ours), ("base-run", base)):
            store.start_run(argv=["test"], config={}, env={}, run_id=run_id)
            for r in recs:
                case = Case(batch=r["batch"], kv_len=r["kv_len"], bits=r["bits"], k_mode=r["k_mode"],
                            v_mode=r["v_mode"], group_size=r["group_size"])
                store.add_record(run_id, {**r, "case_key": case.key, "family": r["backend"].split("-")[0]})
    floor = tmp_path / "floor.json"
    floor.write_text(json.dumps(FLOOR))
    return db, floor, tmp_path


runner = CliRunner()


def test_bound_command_prints_cases_and_geomeans(bound_store):
    db, floor, tmp = bound_store
    out = tmp / "bound.json"
    res = runner.invoke(app, [
        "ceiling", "--bound", "--db", str(db), "--run", "ours-run", "--baseline-run", "base-run",
        "--floor-from", str(floor), "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    assert "foscar-int4 (K channel, V token, g128) over flashinfer-bf16-tc" in res.output
    geo = [line for line in res.output.splitlines() if "geo-mean over 16 cases" in line]
    assert len(geo) == 4 and all("target" in line for line in geo)  # reports/data/paper.csv's targets
    saved = json.loads(out.read_text())
    assert saved["ours_run"] == "ours-run" and saved["baseline_run"] == "base-run" and len(saved["cases"]) == 64
    assert saved["floor"]["sizes"] == FLOOR["sizes"]
    g = next(g for g in saved["geomeans"] if g["ours"] == "foscar-int2" and g["over"] == "trtllm-xqa-fp8")
    assert f"bound {g['geomean_bound']:.2f}x" in geo[3]
    # the JSON a bound wrote is also a floor for the next bound
    res = runner.invoke(app, [
        "ceiling", "--bound", "--db", str(db), "--run", "ours-run", "--baseline-run", "base-run",
        "--floor-from", str(out), "--over", "trtllm-xqa-fp8"])
    assert res.exit_code == 0 and "flashinfer-bf16-tc" not in res.output.split("\n", 1)[1]


def test_floor_command_times_each_size_as_the_runs_records_were(tmp_path, monkeypatch):
    """--floor --db --run: the sizes and, per size, the L2 policy of the run's records (no GPU:
    the measurement is replaced by one that says what it was asked)."""
    from core.case import Case
    from core.store import ResultStore
    from suite.commands import ceiling

    db = tmp_path / "results.sqlite"
    with ResultStore(db) as store:
        store.start_run(argv=["test"], config={}, env={}, run_id="r")
        for bits, kv, nbytes, policy in ((4, 4096, 4472964, "flush"), (2, 16384, 9454084, "rotate:27"),
                                         (2, 4096, 2375812, None)):
            rec = _rec(f"foscar-int{bits}", 1, kv, 15.0, nbytes, l2_policy=policy)
            case = Case(batch=1, kv_len=kv, bits=bits)
            store.add_record("r", {**rec, "case_key": case.key, "family": "foscar"})
    asked = {}

    def fake_measure(gpu, sizes, quick, rounds, policies=None):
        asked.update(sizes=sizes, policies=policies)
        return {"gpu_name": "fake", "sizes": [{"bytes": n, "median_us": 5.0} for n in sizes]}

    monkeypatch.setattr(ceiling, "_measure_floor", fake_measure)
    res = runner.invoke(app, ["ceiling", "--floor", "--db", str(db), "--run", "r"])
    assert res.exit_code == 0, res.output
    assert asked == {"sizes": [2375812, 4472964, 9454084], "policies": {4472964: "flush", 9454084: "rotate"}}
    asked.clear()
    res = runner.invoke(app, ["ceiling", "--floor", "--sizes", "4MB"])  # no run: by size
    assert res.exit_code == 0 and asked == {"sizes": [4 * MB], "policies": None}, res.output


def _one_line(args, code=2):
    res = runner.invoke(app, args)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == code and len(lines) == 1, res.output
    return lines[0]


def test_bound_command_errors_are_one_sentence(bound_store, monkeypatch):
    db, floor, tmp = bound_store
    base = ["ceiling", "--bound", "--db", str(db), "--run", "ours-run"]
    assert "'nope'" in _one_line([*base, "--baseline-run", "nope", "--floor-from", str(floor)])
    assert "--run 'gone'" in _one_line(["ceiling", "--bound", "--db", str(db), "--run", "gone", "--floor-from", str(floor)])
    empty = tmp / "empty.json"
    empty.write_text(json.dumps({"gpu_name": "x"}))
    line = _one_line([*base, "--floor-from", str(empty)])
    assert str(empty) in line and "'sizes'" in line
    assert "not JSON" in _one_line([*base, "--floor-from", str(db)])
    assert "cannot be read" in _one_line([*base, "--floor-from", str(tmp / "missing.json")])
    assert "--bound needs a floor" in _one_line(base)
    assert "--floor-from" in _one_line(["ceiling", "--floor-from", str(floor)])
    assert "--sizes" in _one_line(["ceiling", "--sizes", "1MB"])
    assert "'4 parsecs'" in _one_line(["ceiling", "--floor", "--sizes", "4 parsecs"])
    assert "not a results store" in _one_line(["ceiling", "--bound", "--db", str(floor), "--floor-from", str(floor)])
    import suite.envinfo

    monkeypatch.setattr(suite.envinfo, "visible_gpu_count", lambda: 0)
    assert "No CUDA GPU" in _one_line(["ceiling", "--floor", "--sizes", "1MB"], code=1)


# --- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_floor_on_the_gpu_is_positive_and_grows_with_bytes():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    curve = rf.measure_read_floor(torch.device("cuda", 0), [1 << 20, 64 << 20], quick=True)
    a, b = curve["sizes"]
    assert 0 < a["median_us"] < b["median_us"], curve
    # by size (no records): both rotate (on an H200, 240 copies of 1 MiB and 4 of 64 MiB)
    assert [a["l2_policy"], b["l2_policy"]] == [rf.floor_plan(n, curve["l2_bytes"]).policy for n in (1 << 20, 64 << 20)]
    assert a["l2_policy"].startswith("rotate:") and b["l2_verdict"] == "cold"
    assert curve["timing_methods"] == ["graph"] and 0 < b["tbps"] < 6
    assert a["median_us"] < rf.floor_us(curve, 8 << 20) < b["median_us"]
